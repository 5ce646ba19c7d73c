#!/bin/bash
# The rnull authors' comparison (Rust null_blk against C null_blk, fio psync,
# memory-backed, 4 KiB blocks, irqmode 0, queue depth 256, scheduler none),
# made between the kernel's null_blk (the reference) and softblk's null
# target served over ublk with matching settings, in one boot. Prints one
# line per fio run:
#   CELL ENGINE WORKLOAD BS JOBS DEVICE READ_IOPS WRITE_IOPS ERRORS
# bench/ublk/rnull-compare runs this and prints the table.
#
# Arguments (all optional): --workloads "read write ..." --bs "4k 64k ..."
# --jobs "1 2" --engines "psync io_uring" --runtime SECONDS --size MiB
# --region MiB (the part of the device fio touches; written once first).
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool softblk-driver fio
modprobe ublk_drv || vm_skip "no ublk_drv in this kernel"
vm_wait_for /dev/ublk-control

workloads="read write randread randwrite readwrite randrw"
bss="4k 128k 1m"
jobs="1 2"
engines="psync io_uring"
runtime=2
size=1024
region=256
while [ $# -gt 0 ]; do
  case $1 in
    --workloads) workloads=$2; shift 2 ;;
    --bs) bss=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --engines) engines=$2; shift 2 ;;
    --runtime) runtime=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --region) region=$2; shift 2 ;;
    *) vm_fail "unknown argument $1" ;;
  esac
done

pid=
trap '[ -n "$pid" ] && kill -TERM $pid 2>/dev/null; wait 2>/dev/null; vm_null_blk_remove nullb0 2>/dev/null' EXIT

vm_step "null_blk: memory_backed=1 blocksize=4096 irqmode=0 completion_nsec=0 hw_queue_depth=256 queue_mode=2"
vm_null_blk_create nullb0 size=$size blocksize=4096 memory_backed=1 irqmode=0 completion_nsec=0 \
  hw_queue_depth=256 queue_mode=2 submit_queues=1
echo none >/sys/block/nullb0/queue/scheduler

vm_step "softblk null over ublk with the same settings"
softblk-driver --export ublk --run-dir /tmp/run --ready-file /tmp/bench.ready bench null \
  size=$size blocksize=4096 memory_backed=1 irqmode=0 completion_nsec=0 hw_queue_depth=256 \
  submit_queues=1 >/tmp/bench.out 2>/tmp/bench.err &
pid=$!
for _ in $(seq 300); do [ -s /tmp/bench.ready ] && break; sleep 0.1; done
[ -s /tmp/bench.ready ] || vm_fail "softblk-driver not ready: $(cat /tmp/bench.err)"
cat /tmp/bench.ready
ublk=$(sed -n 's/.*"block":"\([^"]*\)".*/\1/p' /tmp/bench.ready)
vm_wait_for "$ublk"
b=$(basename "$ublk")
echo none >/sys/block/$b/queue/scheduler
for d in nullb0 $b; do
  q=/sys/block/$d/queue
  echo "$d: lbs $(cat $q/logical_block_size) max_sectors_kb $(cat $q/max_sectors_kb)" \
    "nr_requests $(cat $q/nr_requests) scheduler $(cat $q/scheduler) hw queues $(ls /sys/block/$d/mq | wc -l)"
done

vm_step "precondition: write the ${region} MiB region once on both"
for dev in /dev/nullb0 "$ublk"; do
  dd if=/dev/zero of=$dev bs=1M count=$region oflag=direct status=none
done

ncpu=$(nproc)
vm_step "fio: engines [$engines] workloads [$workloads] bs [$bss] jobs [$jobs], ${runtime} s each"
n=0
for engine in $engines; do
  if [ "$engine" = io_uring ]; then depth=32; else depth=1; fi
  for wl in $workloads; do
    for bs in $bss; do
      for j in $jobs; do
        # Alternate which device goes first, so that drift in the host's
        # load does not favour one of them.
        if [ $((n % 2)) = 0 ]; then order="/dev/nullb0 $ublk"; else order="$ublk /dev/nullb0"; fi
        n=$((n + 1))
        for dev in $order; do
          if [ "$dev" = /dev/nullb0 ]; then name=null_blk; else name=ublk; fi
          pin=
          if [ "$j" -le "$ncpu" ]; then pin="--cpus_allowed=0-$((ncpu - 1)) --cpus_allowed_policy=split"; fi
          out=$(fio --name=cell --filename=$dev --direct=1 --ioengine=$engine --iodepth=$depth \
            --rw=$wl --bs=$bs --numjobs=$j --size=${region}M --runtime=$runtime --time_based \
            --group_reporting $pin --output-format=terse --terse-version=3 2>/dev/null | tail -n1) ||
            vm_fail "fio $engine $wl $bs $j on $dev failed"
          # terse v3: 5 error, 8 read IOPS, 49 write IOPS
          echo "CELL $engine $wl $bs $j $name $(echo "$out" | cut -d';' -f8) $(echo "$out" | cut -d';' -f49)" \
            "$(echo "$out" | cut -d';' -f5)"
        done
      done
    done
  done
done
kill -TERM $pid; wait $pid; pid=
echo "DONE $n cells"
