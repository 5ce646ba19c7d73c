#!/usr/bin/env bash
# A bad-block range gives EIO to dd on the loop device, and the rest of the
# device keeps working.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib_fuse.sh"
require_host losetup
start_daemon

# Sectors 8192..8199 (4 MiB, one 4 KiB block) are bad.
loop=$(sb_add d0 size=64 memory_backed=1 blocksize=4096 badblocks=+8192-8199)
if dd if="$loop" of=/dev/null bs=4k skip=1024 count=1 iflag=direct status=none 2>"$RUN_DIR/dd.err"; then
    fail "reading the bad block succeeded"
fi
grep -q "Input/output error" "$RUN_DIR/dd.err" || fail "expected EIO, got: $(cat "$RUN_DIR/dd.err")"
if head -c 4096 /dev/urandom | dd of="$loop" bs=4k seek=1024 oflag=direct status=none 2>"$RUN_DIR/dd.err"; then
    fail "writing the bad block succeeded"
fi
grep -q "Input/output error" "$RUN_DIR/dd.err" || fail "expected EIO on write, got: $(cat "$RUN_DIR/dd.err")"

note "the rest of the device"
head -c $((4 << 20)) /dev/urandom >"$RUN_DIR/a"
head -c $((4 << 20)) /dev/urandom >"$RUN_DIR/b"
dd if="$RUN_DIR/a" of="$loop" bs=1M oflag=direct status=none
dd if="$RUN_DIR/b" of="$loop" bs=1M seek=5 oflag=direct status=none
cmp -n $((4 << 20)) "$RUN_DIR/a" "$loop" || fail "data before the bad block"
cmp -n $((4 << 20)) "$RUN_DIR/b" <(dd if="$loop" bs=1M skip=5 count=4 iflag=direct status=none) ||
    fail "data after the bad block"
dd if="$loop" of=/dev/null bs=4k skip=1025 count=10 iflag=direct status=none || fail "block after the bad one"

sb del d0
[ -z "$(leftovers)" ] || fail "left behind: $(leftovers)"
echo PASS
