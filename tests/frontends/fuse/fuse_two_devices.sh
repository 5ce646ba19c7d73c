#!/usr/bin/env bash
# Two devices exported at once, written concurrently; each keeps its own
# data, and deleting one leaves the other working.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib_fuse.sh"
require_host losetup
start_daemon

l0=$(sb_add d0 size=32 memory_backed=1 blocksize=4096)
l1=$(sb_add d1 size=48 memory_backed=1 blocksize=512)
[ "$l0" != "$l1" ] || fail "both devices on $l0"
[ "$(blockdev --getsize64 "$l1")" = $((48 << 20)) ] || fail "$l1: wrong size"
[ "$(blockdev --getss "$l1")" = 512 ] || fail "$l1: logical block size is not 512"
head -c $((32 << 20)) /dev/urandom >"$RUN_DIR/a"
head -c $((48 << 20)) /dev/urandom >"$RUN_DIR/b"
dd if="$RUN_DIR/a" of="$l0" bs=64k oflag=direct status=none &
p0=$!
dd if="$RUN_DIR/b" of="$l1" bs=64k oflag=direct status=none &
p1=$!
wait $p0 $p1
cmp "$RUN_DIR/a" "$l0" || fail "d0 data"
cmp "$RUN_DIR/b" "$l1" || fail "d1 data"
sb list
[ "$(grep -o '"file":' <<<"$REPLY_LINE" | wc -l)" = 2 ] ||
    fail "list shows $REPLY_LINE"

sb del d0
cmp "$RUN_DIR/b" "$l1" || fail "d1 data after deleting d0"
sb del d1
[ -z "$(leftovers)" ] || fail "left behind: $(leftovers)"
echo PASS
