#!/usr/bin/env bash
# FUSE over io_uring (export option ring, docs/fuse.md "Ring mode"):
# - with /sys/module/fuse/parameters/enable_uring at N, ring=on fails and
#   says that an administrator may enable it; ring=auto exports through
#   /dev/fuse and says why;
# - the test switches enable_uring to Y for as long as it adds ring
#   exports (a connection keeps the ring once it has it) and restores the
#   value it found, even on failure;
# - a memory-backed null device exported with ring=on and attached to a
#   loop device passes fio crc32c verification of random writes and reads
#   at 4 KiB, 64 KiB and 1 MiB, and mkfs.ext4 / mount / fsck -fn; the
#   export's ring_requests counter shows that the requests came through
#   the ring; with poll_us=1000 the ring thread finds requests at queue
#   depth 1 by polling its ring, and uses no CPU once the I/O stops;
# - the file operations (attributes, unaligned writes, punch hole, zero
#   range, SEEK_DATA/SEEK_HOLE, fsync, the end of the device) pass through
#   the ring: fuse_export_tests runs with ring=on ($1, when given);
# - del with requests in flight returns and leaves nothing behind.
# Skips with the reason where the kernel has no FUSE over io_uring.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib_fuse.sh"
require_host losetup fio mkfs.ext4 fsck.ext4 python3
gtests=${1:-}

param=/sys/module/fuse/parameters/enable_uring
# The parameter appears with the fuse module, which the first open of
# /dev/fuse loads.
[ -e "$param" ] || exec 9<>/dev/fuse
exec 9>&- 2>/dev/null || true
[ -e "$param" ] || skip "this kernel ($(uname -r)) has no FUSE over io_uring ($param is missing)"
[ -w "$param" ] || skip "$param is not writable"
[ "$(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null || echo 0)" != 2 ] ||
    skip "io_uring is disabled (kernel.io_uring_disabled=2)"
original=$(cat "$param")
restore_uring() { echo "$original" >"$param"; }

start_daemon
# Whatever happens, the system setting goes back first, then cleanup_host
# (which takes the test's status from $?).
trap 'rc=$?; restore_uring; (exit $rc); cleanup_host' EXIT

# export_field NAME FIELD: from the last `sb list` (the CLI's list --json
# or the driver's {"exports": {...}}).
export_field() {
    python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
e = d["exports"][sys.argv[1]] if isinstance(d, dict) else \
    next(x["export"] for x in d if x["name"] == sys.argv[1])
print(e.get(sys.argv[2], ""))' "$1" "$2" <<<"$REPLY_LINE"
}

# ---- enable_uring=N: ring=on is an error that says what is missing.
echo N >"$param"
if sb_try add n null size=16 memory_backed=1 -- ring=on; then
    fail "ring=on succeeded with enable_uring=N"
fi
note "ring=on with enable_uring=N: $REPLY_LINE"
grep -q "enable_uring is N" <<<"$REPLY_LINE" || fail "the error does not name enable_uring: $REPLY_LINE"
grep -q "administrator may enable it" <<<"$REPLY_LINE" || fail "the error does not say who may: $REPLY_LINE"
[ -z "$(leftovers)" ] || fail "a refused ring=on left behind: $(leftovers)"
sb add a null size=16 memory_backed=1
sb list
grep -q "^off (the kernel offers FUSE over io_uring but $param is N" <<<"$(export_field a ring)" ||
    fail "ring=auto with enable_uring=N does not say why the ring is off: $REPLY_LINE"
sb del a

# ---- The ring exports (enable_uring=Y only while adding them).
echo Y >"$param"
loop=$(sb_add r size=256 memory_backed=1 blocksize=4096 -- ring=on poll_us=1000)
sb add l null size=64 memory_backed=1 blocksize=4096 irqmode=2 completion_nsec=5000000 -- ring=auto
slow_file=$(json_field file)
restore_uring
[ -b "$loop" ] || fail "no loop device: $REPLY_LINE"
sb list
[ "$(export_field r ring)" = on ] || fail "ring=on export is not on the ring: $REPLY_LINE"
[ "$(export_field l ring)" = on ] || fail "ring=auto with enable_uring=Y is not on the ring: $REPLY_LINE"
queues=$(export_field r ring_queues)
[ "$queues" = "$(($(sed 's/.*-//' /sys/devices/system/cpu/possible) + 1))" ] ||
    fail "ring_queues $queues is not one per possible CPU"

requests() { sb list; export_field r ring_requests; }
before=$(requests)
for bs in 4k 64k 1m; do
    fio --name="v$bs" --filename="$loop" --ioengine=libaio --iodepth=16 --direct=1 --bs="$bs" \
        --rw=randwrite --size=128m --verify=crc32c --verify_fatal=1 --do_verify=1 \
        --output=/dev/null || fail "fio crc32c verify at bs=$bs through the ring failed"
    note "bs=$bs: random writes and their crc32c verification passed"
done
fio --name=r --filename="$loop" --ioengine=psync --direct=1 --bs=4k --rw=randread --size=128m \
    --number_ios=2000 --output=/dev/null || fail "psync reads through the ring failed"
after=$(requests)
polled=$(export_field r requests_after_poll)
note "psync reads at queue depth 1: $polled waits ended by polling the ring"
[ "$polled" -gt 0 ] || fail "with poll_us=1000 no request was found by polling the ring"
# 4 KiB alone: 32768 writes and as many verifying reads (a few may merge
# in the loop device), then 2000 reads.
note "ring_requests: $before before fio, $after after"
[ $((after - before)) -ge 60000 ] || fail "only $((after - before)) requests came through the ring"

# Idle: the poll window has long run out, the ring thread sleeps in the
# ring. One that kept polling would use the whole 2 s.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$DAEMON_PID/stat"; }
sleep 0.5
idle_before=$(cpu_ticks)
sleep 2
used_ms=$((($(cpu_ticks) - idle_before) * 1000 / $(getconf CLK_TCK)))
note "daemon CPU over 2 s without I/O: $used_ms ms"
[ "$used_ms" -le 200 ] || fail "the daemon used $used_ms ms of CPU in 2 s without I/O: a ring thread keeps polling"

mkfs.ext4 -q -F "$loop" || fail "mkfs.ext4 on the ring export failed"
mnt="$RUN_DIR/mnt"
mkdir -p "$mnt"
mount "$loop" "$mnt" || fail "mount failed"
dd if=/dev/urandom of="$mnt/data" bs=1M count=32 status=none
sum=$(md5sum <"$mnt/data")
umount "$mnt"
fsck.ext4 -fn "$loop" >/dev/null || fail "fsck.ext4 -fn found errors"
mount "$loop" "$mnt"
[ "$(md5sum <"$mnt/data")" = "$sum" ] || fail "a file read back differs after remount"
umount "$mnt"
note "mkfs.ext4, files, fsck -fn clean"

# ---- The file operations through the ring.
if [ -n "$gtests" ] && [ ! -x "$gtests" ]; then
    note "not run: the file operations through the ring ($gtests is not built here)"
elif [ -n "$gtests" ]; then
    echo Y >"$param"
    SOFTBLK_FUSE_TEST_RING=on "$gtests" --gtest_filter='fuse_export_test.*' >"$RUN_DIR/gtests.log" 2>&1 ||
        { restore_uring; cat "$RUN_DIR/gtests.log"; fail "fuse_export_tests with ring=on failed"; }
    restore_uring
    note "fuse_export_tests with ring=on: $(grep -c '^\[       OK \]' "$RUN_DIR/gtests.log") passed"
fi

# ---- del with requests in flight (5 ms each, 16 at a time, on the file).
fio --name=k --filename="$slow_file" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
    --iodepth=16 --runtime=60 --time_based --output=/dev/null 2>/dev/null &
fio_pid=$!
sleep 1
kill -0 "$fio_pid" 2>/dev/null || fail "fio ended before del"
start=$(date +%s%N)
sb del l
note "del with requests in flight took $((($(date +%s%N) - start) / 1000000)) ms"
for _ in $(seq 100); do kill -0 "$fio_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$fio_pid" 2>/dev/null; then
    kill -9 "$fio_pid"
    fail "fio still running 10 s after del: requests hang in the ring"
fi
wait "$fio_pid" 2>/dev/null || true
sb del r
for _ in $(seq 50); do [ -z "$(leftovers)" ] && break; sleep 0.1; done
[ -z "$(leftovers)" ] || fail "left behind: $(leftovers)"
[ "$(cat "$param")" = "$original" ] || fail "enable_uring was not restored"
echo PASS
