#!/bin/bash
# Guest half of a queue-count comparison (run with tests/vm/run-vm, as the
# command in docs/benchmarks.md at 46583e9 shows): the kernel's zloop and softblk's
# zloop over ublk, each with 1 queue and with 2 (k1 k2 s1 s2), 512 MiB in
# 16 MiB zones, zone files on ext4 on a brd RAM disk. Each job of JOBS
# (rw,bs,iodepth,numjobs; default: 128 KiB random writes QD 32 and 4 KiB
# random writes QD 32 x 8) runs on the four devices in turn for ROUNDS
# rounds (default 4), each round starting with the next device. Per run:
# write IOPS, and the guest's busy and idle CPU ticks (/proc/stat) over it,
# to tell a device that waits from one that is short of CPU.
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool softblk fio blkzone
modprobe ublk_drv; vm_wait_for /dev/ublk-control
modprobe zloop; vm_wait_for /dev/zloop-control
export SOFTBLK_RUN_DIR=/tmp/softblk-run
cleanup() {
  softblk shutdown >/dev/null 2>&1 || true
  for id in 11 12; do [ -b /dev/zloop$id ] && echo "remove id=$id" >/dev/zloop-control; done
  umount /mnt/zl 2>/dev/null || true
}
trap cleanup EXIT
vm_bench_zone_fs ext4
mkdir -p /mnt/zl/1 /mnt/zl/2 /mnt/zl/11 /mnt/zl/12
zl="capacity_mb=512 zone_size_mb=16 conv_zones=0 queue_depth=128"
softblk add zloop --name s1 base_dir=/mnt/zl id=1 $zl nr_queues=1 >/tmp/a1.txt
softblk add zloop --name s2 base_dir=/mnt/zl id=2 $zl nr_queues=2 >/tmp/a2.txt
echo "add id=11,${zl// /,},nr_queues=1,base_dir=/mnt/zl" >/dev/zloop-control
echo "add id=12,${zl// /,},nr_queues=2,base_dir=/mnt/zl" >/dev/zloop-control
vm_wait_for /dev/zloop11; vm_wait_for /dev/zloop12
declare -A dev=([k1]=/dev/zloop11 [k2]=/dev/zloop12 [s1]=$(grep -o '/dev/ublkb[0-9]*' /tmp/a1.txt | head -n1)
  [s2]=$(grep -o '/dev/ublkb[0-9]*' /tmp/a2.txt | head -n1))
systems=(k1 k2 s1 s2)
for j in ${JOBS:-randwrite,128k,32,1 randwrite,4k,32,8}; do
  IFS=, read -r rw bs qd nj <<<"$j"
  declare -A iops=()
  for round in $(seq "${ROUNDS:-4}"); do
    for ((k = 0; k < 4; ++k)); do
      sys=${systems[(k + round - 1) % 4]}
      blkzone reset "${dev[$sys]}"
      before=$(awk '/^cpu /{print $2+$3+$4+$6+$7+$8, $5}' /proc/stat)
      out=$(fio --name=z --filename="${dev[$sys]}" --ioengine=io_uring --direct=1 --zonemode=zbd \
        --rw="$rw" --bs="$bs" --iodepth="$qd" --numjobs="$nj" --group_reporting \
        --time_based --runtime=4 --output-format=terse --terse-version=3)
      after=$(awk '/^cpu /{print $2+$3+$4+$6+$7+$8, $5}' /proc/stat)
      blkzone reset "${dev[$sys]}"
      v=$(awk -F';' '{print $49}' <<<"$out")
      read -r b1 i1 <<<"$before"; read -r b2 i2 <<<"$after"
      iops[$sys]+="$v(busy $((b2 - b1)) idle $((i2 - i1))) "
    done
  done
  for s in "${systems[@]}"; do echo "$rw $bs QD$qd x$nj $s: ${iops[$s]}"; done
done
echo "queue requests: $(softblk list --json | tr -d ' \n' | grep -o '"queue_requests":\[[0-9,]*\]' | tr '\n' ' ')"
echo PASS
