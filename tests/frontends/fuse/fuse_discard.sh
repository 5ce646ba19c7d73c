#!/usr/bin/env bash
# blkdiscard on the loop device reaches the device as DISCARD (punch hole on
# the FUSE file) and the discarded range reads back as zeros
# (memory_backed=1 discard=1). (SEEK_DATA/SEEK_HOLE over the map: unit tests.)
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib_fuse.sh"
require_host blkdiscard losetup
start_daemon

loop=$(sb_add d0 size=64 memory_backed=1 blocksize=4096 discard=1)
head -c $((64 << 20)) /dev/urandom >"$RUN_DIR/data"
dd if="$RUN_DIR/data" of="$loop" bs=1M oflag=direct status=none
cmp "$RUN_DIR/data" "$loop" || fail "data did not read back"

note "discard 16 MiB at 8 MiB"
blkdiscard -o $((8 << 20)) -l $((16 << 20)) "$loop"
cmp -n $((8 << 20)) "$RUN_DIR/data" "$loop" || fail "data before the discarded range changed"
[ "$(dd if="$loop" bs=1M skip=8 count=16 iflag=direct status=none | tr -d '\0' | wc -c)" = 0 ] ||
    fail "discarded range does not read as zeros"
cmp -i $((24 << 20)) "$RUN_DIR/data" "$loop" || fail "data after the discarded range changed"

note "discard of the whole device"
blkdiscard "$loop"
[ "$(dd if="$loop" bs=1M iflag=direct status=none | tr -d '\0' | wc -c)" = 0 ] || fail "device not zero"

sb del d0
[ -z "$(leftovers)" ] || fail "left behind: $(leftovers)"
echo PASS
