#!/usr/bin/env bash
# fio random writes with crc32c verification through the loop device over
# the FUSE file, then a separate verify-only pass over what was written.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib_fuse.sh"
require_host fio losetup
start_daemon

loop=$(sb_add d0 size=256 memory_backed=1 blocksize=4096 submit_queues=2)
[ -b "$loop" ] || fail "no loop device in the add answer: $REPLY_LINE"
[ "$(cat /sys/block/${loop#/dev/}/loop/dio)" = 1 ] || fail "$loop does not use direct I/O"
[ "$(blockdev --getss "$loop")" = 4096 ] || fail "$loop: logical block size is not 4096"
[ "$(blockdev --getsize64 "$loop")" = $((256 << 20)) ] || fail "$loop: wrong size"

note "random writes with verify"
fio --name=write --filename="$loop" --ioengine=libaio --iodepth=16 --direct=1 --rw=randwrite \
    --bs=4k --bsrange=4k-256k --size=256M --io_size=128M --numjobs=1 --verify=crc32c \
    --verify_backlog=4096 --do_verify=1 --randseed=1234 --output="$RUN_DIR/fio-write.log" ||
    { cat "$RUN_DIR/fio-write.log"; fail "fio write+verify failed"; }
note "verify pass"
fio --name=write --filename="$loop" --ioengine=libaio --iodepth=16 --direct=1 --rw=randwrite \
    --bs=4k --bsrange=4k-256k --size=256M --io_size=128M --numjobs=1 --verify=crc32c \
    --verify_only=1 --randseed=1234 --output="$RUN_DIR/fio-verify.log" ||
    { cat "$RUN_DIR/fio-verify.log"; fail "fio verify pass failed"; }
grep -q "err= 0" "$RUN_DIR/fio-verify.log" || { cat "$RUN_DIR/fio-verify.log"; fail "fio reported errors"; }

sb del d0
[ -z "$(leftovers)" ] || fail "left behind: $(leftovers)"
echo PASS
