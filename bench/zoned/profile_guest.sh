#!/bin/bash
# Guest half of a profile (run with tests/vm/run-vm ... --tool perf, as the
# command in docs/benchmarks.md at 46583e9 shows): the kernel's zloop and softblk's
# zloop over ublk, 2 queues each, 512 MiB in 16 MiB zones, zone files on
# ext4 on a brd RAM disk. JOB (rw,bs,iodepth,numjobs; default 128 KiB
# random writes at QD 32) runs 7 s on each device twice, in turn, with
# `perf record -a` (cpu-clock: TCG has no PMU) over 4 s in the middle of
# each run; the second run's profile of each device is reported, by thread
# name, by kind of thread, and the daemon's own threads by symbol. Divide a
# share by the run's IOPS to compare the devices per I/O.
set -euo pipefail
. /softblk-vm/lib.sh
modprobe ublk_drv; vm_wait_for /dev/ublk-control
modprobe zloop; vm_wait_for /dev/zloop-control
export SOFTBLK_RUN_DIR=/tmp/softblk-run
cleanup() {
  softblk shutdown >/dev/null 2>&1 || true
  [ -b /dev/zloop12 ] && echo "remove id=12" >/dev/zloop-control
  umount /mnt/zl 2>/dev/null || true
}
trap cleanup EXIT
vm_bench_zone_fs ext4
mkdir -p /mnt/zl/2 /mnt/zl/12
zl="capacity_mb=512 zone_size_mb=16 conv_zones=0 queue_depth=128 nr_queues=2"
softblk add zloop --name s2 base_dir=/mnt/zl id=2 $zl >/tmp/a2.txt
echo "add id=12,${zl// /,},base_dir=/mnt/zl" >/dev/zloop-control
vm_wait_for /dev/zloop12
declare -A dev=([k2]=/dev/zloop12 [s2]=$(grep -o '/dev/ublkb[0-9]*' /tmp/a2.txt | head -n1))
j=${JOB:-randwrite,128k,32,1}
IFS=, read -r rw bs qd nj <<<"$j"
for sys in k2 s2 k2 s2; do
  blkzone reset "${dev[$sys]}"
  fio --name=z --filename="${dev[$sys]}" --ioengine=io_uring --direct=1 --zonemode=zbd \
    --rw="$rw" --bs="$bs" --iodepth="$qd" --numjobs="$nj" --group_reporting \
    --time_based --runtime=7 --output-format=terse --terse-version=3 >/tmp/fio.txt &
  fpid=$!
  sleep 2
  perf record -q -e cpu-clock -a -g -o /tmp/p-$sys.data -- sleep 4 2>/dev/null
  wait $fpid
  echo "$sys $j IOPS $(awk -F';' '{print $49}' /tmp/fio.txt)"
  blkzone reset "${dev[$sys]}"
done
set +o pipefail
for sys in k2 s2; do
  echo "=== $sys by comm"
  perf report -q -i /tmp/p-$sys.data --no-children --sort comm -g none --stdio 2>/dev/null | grep -v '^$' | head -15
  echo "=== $sys by comm, summed by kind"
  perf report -q -i /tmp/p-$sys.data --no-children --sort comm -g none --stdio 2>/dev/null | grep -v '^$' |
    awk '{c=$2; sub(/[-\/:].*/,"",c); sub(/%/,"",$1); t[c]+=$1} END {for (c in t) printf "  %-12s %6.2f\n", c, t[c]}' | sort -k2 -nr
done
echo "=== s2 softblk thread symbols (top 50)"
perf report -q -i /tmp/p-s2.data --no-children --comms softblk --sort sym -g none --stdio 2>/dev/null | grep -v '^$' | head -50
echo "=== s2 kblockd symbols (top 15)"
perf report -q -i /tmp/p-s2.data --no-children --comms kworker/1:1H-ublk,kworker/0:1H-ublk,kworker/1:1H-ub,kworker/0:1H-ub --sort sym -g none --stdio 2>/dev/null | grep -v '^$' | head -15

echo PASS
