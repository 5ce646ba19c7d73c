#!/bin/bash
# A softblk null device (memory-backed, 4 queues of depth 128, 4 KiB blocks,
# discard, rotational, 64 MiB write-back cache with FUA) served over ublk
# behaves as a disk: the kernel's queue limits in sysfs match its options;
# fio with crc32c verification passes on the read, write, flush (fsync),
# FUA (O_DSYNC) and discard (trim, read back as zeros) paths across all
# queues; blkdiscard and write-zeroes read back as zeros; ext4 and xfs are
# made, mounted, written, unmounted and check clean; USER_COPY mode works
# where the kernel has it; and deleting the device leaves nothing behind.
# Needs softblk-driver (--bin) and a 4-CPU guest (ublk caps the
# hardware queues at the CPU count).
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool softblk-driver fio mkfs.ext4 e2fsck mkfs.xfs xfs_repair blkdiscard cmp
modprobe ublk_drv || vm_skip "no ublk_drv in this kernel"
vm_wait_for /dev/ublk-control

drv="softblk-driver --export ublk"
run=/tmp/run
mkdir -p $run
pid=
cleanup() {
  umount /mnt/ublk 2>/dev/null || true
  if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
}
trap cleanup EXIT

# start NAME [driver args...]: serves a device, sets $pid and $dev.
start() {
  local name=$1; shift
  rm -f /tmp/$name.ready
  $drv --run-dir $run --ready-file /tmp/$name.ready "$name" null "$@" \
    >/tmp/$name.out 2>/tmp/$name.err &
  pid=$!
  for _ in $(seq 300); do
    [ -s /tmp/$name.ready ] && break
    kill -0 $pid 2>/dev/null || { cat /tmp/$name.err; vm_fail "driver for $name exited"; }
    sleep 0.1
  done
  [ -s /tmp/$name.ready ] || vm_fail "driver for $name not ready after 30 s"
  dev=$(sed -n 's/.*"block":"\([^"]*\)".*/\1/p' /tmp/$name.ready)
  cat /tmp/$name.ready
  vm_wait_for "$dev"
}
stop() {
  kill -TERM "$pid"
  wait "$pid" || vm_fail "driver exited with $? on SIGTERM: $(cat /tmp/*.err)"
  pid=
}

vm_step "kernel features"
echo features | $drv --run-dir $run --commands | tee /tmp/features.json
mkdir -p /mnt/ublk

vm_step "add a null device over ublk"
start d0 submit_queues=4 hw_queue_depth=128 memory_backed=1 size=512 blocksize=4096 discard=1 \
  rotational=1 cache_size=64
b=$(basename "$dev")
q=/sys/block/$b/queue

vm_step "queue limits in sysfs"
vm_expect_eq size_bytes "$(blockdev --getsize64 "$dev")" $((512 << 20))
vm_expect_eq logical_block_size "$(cat $q/logical_block_size)" 4096
vm_expect_eq physical_block_size "$(cat $q/physical_block_size)" 4096
vm_expect_eq rotational "$(cat $q/rotational)" 1
vm_expect_eq write_cache "$(cat $q/write_cache)" "write back"
vm_expect_eq fua "$(cat $q/fua)" 1
# null_blk's discard limit, UINT_MAX >> 9 sectors, rounded down to 4 KiB.
vm_expect_eq discard_max_hw_bytes "$(cat $q/discard_max_hw_bytes)" 4294963200
vm_expect_eq discard_granularity "$(cat $q/discard_granularity)" 4096
vm_expect_eq write_zeroes_max_bytes "$(cat $q/write_zeroes_max_bytes)" 0
vm_expect_eq max_hw_sectors_kb "$(cat $q/max_hw_sectors_kb)" 124
vm_expect_eq "hardware queues" "$(ls -d /sys/block/$b/mq/* | wc -l)" 4
echo none >$q/scheduler
vm_expect_eq nr_requests "$(cat $q/nr_requests)" 128

vm_step "fio verify: random writes with flushes on 4 queues, trim+write, FUA"
# 16 MiB a job: some 250 writes and 30 fsyncs each, every queue busy
# (8 s under TCG; the 64 MiB a job this used to write took 30 s).
fio --name=verify --filename="$dev" --direct=1 --ioengine=io_uring --iodepth=16 \
  --rw=randwrite --bsrange=4k-128k --size=16M --numjobs=4 --offset_increment=64M \
  --fsync=8 --verify=crc32c --verify_fatal=1 --group_reporting --output-format=terse >/tmp/fio1.txt ||
  { cat /tmp/fio1.txt; vm_fail "fio verify failed"; }
echo "ok: fio random write + fsync + verify, 4 jobs"
fio --name=trimwrite --filename="$dev" --direct=1 --ioengine=libaio --iodepth=8 --rw=trimwrite \
  --bs=64k --size=32M --offset=256M --verify=crc32c --verify_fatal=1 --output-format=terse >/tmp/fio2.txt ||
  { cat /tmp/fio2.txt; vm_fail "fio trimwrite verify failed"; }
echo "ok: fio trim+write + verify"
fio --name=fua --filename="$dev" --direct=1 --sync=dsync --ioengine=psync --rw=write --bs=16k \
  --size=16M --offset=300M --verify=crc32c --verify_fatal=1 --output-format=terse >/dev/null ||
  vm_fail "fio O_DSYNC (FUA) verify failed"
echo "ok: fio O_DSYNC (FUA) write + verify"
fio --name=readback --filename="$dev" --direct=1 --ioengine=libaio --iodepth=32 --rw=read --bs=64k \
  --size=256M --numjobs=1 --output-format=terse >/dev/null || vm_fail "sequential read failed"
echo "ok: sequential read of 256 MiB"

vm_step "blkdiscard and write zeroes read back as zeros"
dd if=/dev/urandom of=$dev bs=1M count=8 seek=100 oflag=direct status=none
blkdiscard -o $((100 << 20)) -l $((4 << 20)) "$dev"
cmp -n $((4 << 20)) -i 0:$((100 << 20)) /dev/zero "$dev" || vm_fail "discarded range does not read as zeros"
echo "ok: discarded range reads as zeros"
blkdiscard -z -o $((104 << 20)) -l $((4 << 20)) "$dev"
cmp -n $((4 << 20)) -i 0:$((104 << 20)) /dev/zero "$dev" || vm_fail "zeroed range does not read as zeros"
echo "ok: write-zeroes range reads as zeros"
blkdiscard "$dev"
cmp -n $((512 << 20)) /dev/zero "$dev" || vm_fail "whole-device discard does not read as zeros"
echo "ok: whole device discarded, reads as zeros"

vm_step "ext4: mkfs, mount, write, unmount, fsck"
mkfs.ext4 -q -F "$dev"
mount "$dev" /mnt/ublk
dd if=/dev/urandom of=/mnt/ublk/data bs=1M count=32 status=none
sum=$(sha256sum </mnt/ublk/data)
sync
umount /mnt/ublk
e2fsck -fn "$dev" >/tmp/fsck.txt 2>&1 || { cat /tmp/fsck.txt; vm_fail "e2fsck found problems"; }
echo "ok: e2fsck clean"
mount "$dev" /mnt/ublk
vm_expect_eq "ext4 file checksum after remount" "$(sha256sum </mnt/ublk/data)" "$sum"
umount /mnt/ublk

vm_step "xfs: mkfs, mount, write, unmount, repair -n"
mkfs.xfs -q -f "$dev"
mount "$dev" /mnt/ublk
dd if=/dev/urandom of=/mnt/ublk/data bs=1M count=32 status=none
sum=$(sha256sum </mnt/ublk/data)
umount /mnt/ublk
xfs_repair -n "$dev" >/tmp/xfs.txt 2>&1 || { cat /tmp/xfs.txt; vm_fail "xfs_repair found problems"; }
echo "ok: xfs_repair -n clean"
mount "$dev" /mnt/ublk
vm_expect_eq "xfs file checksum after remount" "$(sha256sum </mnt/ublk/data)" "$sum"
umount /mnt/ublk

vm_step "delete: nothing left behind"
id=${b#ublkb}
stop
[ ! -e /dev/ublkb$id ] || vm_fail "/dev/ublkb$id still there"
[ ! -e /dev/ublkc$id ] || vm_fail "/dev/ublkc$id still there"
[ ! -e /sys/block/ublkb$id ] || vm_fail "/sys/block/ublkb$id still there"
[ ! -e $run/ublk/d0.json ] || vm_fail "state file left behind"
echo "ok: /dev/ublkb$id, /dev/ublkc$id and the state file are gone"

vm_step "USER_COPY"
if grep -q '"USER_COPY"' /tmp/features.json; then
  start d1 -o user_copy=1 submit_queues=2 hw_queue_depth=64 memory_backed=1 size=128 blocksize=512
  grep -q '"user_copy":true' /tmp/d1.ready || vm_fail "user_copy not granted"
  fio --name=uc --filename="$dev" --direct=1 --ioengine=io_uring --iodepth=16 --rw=randwrite \
    --bsrange=512-64k --size=64M --verify=crc32c --verify_fatal=1 --output-format=terse >/dev/null ||
    vm_fail "fio verify with USER_COPY failed"
  echo "ok: fio verify with USER_COPY"
  stop
else
  echo "SKIP (part): this kernel reports no USER_COPY"
fi

vm_step "irqmode=2: completion_nsec is honoured and the queue thread sleeps until then"
# 20 ms per request at queue depth 1: about 50 I/O per second, each taking
# at least 20 ms, while the queue thread sleeps in its ring until the
# completion timer is due: a few wake-ups per I/O, not a poll every few
# hundred microseconds (which would be thousands per second).
start d2 submit_queues=1 hw_queue_depth=4 irqmode=2 completion_nsec=20000000 size=64 blocksize=4096
switches() { cat /proc/$pid/task/*/status | awk '/^voluntary_ctxt_switches/ {n += $2} END {print n}'; }
sw_before=$(switches)
fio --name=timer --filename="$dev" --direct=1 --ioengine=psync --rw=randread --bs=4k --size=16M \
  --runtime=3 --time_based --output-format=terse >/tmp/timer.txt || vm_fail "fio on the timer device failed"
sw=$(( $(switches) - sw_before ))
ios=$(( $(cut -d';' -f6 /tmp/timer.txt) / 4 ))
lat_min_us=$(cut -d';' -f14 /tmp/timer.txt)
echo "ios $ios, min completion latency ${lat_min_us} us, daemon voluntary context switches $sw"
[ "${lat_min_us%.*}" -ge 20000 ] || vm_fail "an I/O completed in ${lat_min_us} us, before completion_nsec (20 ms)"
[ "$ios" -ge 60 ] && [ "$ios" -le 160 ] || vm_fail "$ios I/Os in 3 s at 20 ms each (expected about 140, at least 60)"
[ "$sw" -le $(( ios * 6 + 50 )) ] || vm_fail "$sw wake-ups of the daemon for $ios I/Os: it polls instead of sleeping until the timer"
echo "ok: timer completions at >= 20 ms, $sw wake-ups for $ios I/Os"
stop
echo "PASS"
