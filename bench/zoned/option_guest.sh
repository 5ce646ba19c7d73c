#!/bin/bash
# Guest half of `bench/zoned/vm.sh --guest affinity|one|auto|spin`: does a ublk
# export option pay on softblk's zloop? OPT is the option measured
# (queue_affinity=1, idle_spin=auto), BASE the same option as it is
# without it (queue_affinity=0, idle_spin=0); either may list several,
# separated by spaces ("batch_io=1 zero_copy_min=0"). TOPT and TBASE
# (optional) are zloop target options for each side ("prealloc=1"). Three
# zoned devices of 512 MiB in 16 MiB zones, NR_QUEUES queues each (default
# 2), zone files on FS (ext4, the default, or xfs; mounted with MOUNT_OPTS
# if set) on a brd RAM disk written full first:
#   kzloop  the kernel's zloop (run-vm --module zloop, backports kernel)
#   opt     softblk's zloop over ublk with OPT
#   base    the same with BASE
# The zoned benchmark's four fio jobs run on each device in turn, ROUNDS
# rounds, each round starting with the next device (JOBS: a subset of the
# jobs, as rw,bs,iodepth,numjobs); per job the IOPS of every round and the
# median of the per-round ratios opt / base and opt / kzloop, base /
# kzloop; then the ublk queues' idle-spin and zero-copy counters.
set -euo pipefail
. /softblk-vm/lib.sh
fs=${FS:-ext4}
vm_require_tool softblk fio blkzone
modprobe ublk_drv || vm_skip "no ublk_drv in this kernel"
vm_wait_for /dev/ublk-control
modprobe zloop 2>/dev/null || vm_skip "no zloop module (bench/zoned/vm.sh --kernel backports)"
vm_wait_for /dev/zloop-control
runtime=${RUNTIME:-4}
rounds=${ROUNDS:-3}
q=${NR_QUEUES:-2}
opt=${OPT:?OPT=option=value}
base=${BASE:?BASE=option=value}
topt=${TOPT:-}
tbase=${TBASE:-}

export SOFTBLK_RUN_DIR=/tmp/softblk-run
cleanup() {
  softblk shutdown >/dev/null 2>&1 || true
  [ -b /dev/zloop11 ] && echo "remove id=11" >/dev/zloop-control
  umount /mnt/zl 2>/dev/null || true
}
trap cleanup EXIT
vm_bench_zone_fs "$fs" "${MOUNT_OPTS:-}"
mkdir -p /mnt/zl/1 /mnt/zl/2 /mnt/zl/11
zl="capacity_mb=512 zone_size_mb=16 conv_zones=0 nr_queues=$q queue_depth=128"
# OPT and BASE may each hold several options, separated by spaces.
opt_args=() base_args=()
for o in $opt; do opt_args+=(--export-opt "$o"); done
for o in $base; do base_args+=(--export-opt "$o"); done
softblk add zloop --name opt base_dir=/mnt/zl id=1 $zl $topt "${opt_args[@]}" >/tmp/a1.txt
softblk add zloop --name base base_dir=/mnt/zl id=2 $zl $tbase "${base_args[@]}" >/tmp/a2.txt
echo "add id=11,${zl// /,},base_dir=/mnt/zl" >/dev/zloop-control
vm_wait_for /dev/zloop11
declare -A dev=([kzloop]=/dev/zloop11 [opt]=$(grep -o '/dev/ublkb[0-9]*' /tmp/a1.txt | head -n1)
  [base]=$(grep -o '/dev/ublkb[0-9]*' /tmp/a2.txt | head -n1))
echo "opt: $opt $topt, base: $base $tbase, on $fs ($(findmnt -n -o OPTIONS /mnt/zl))"
echo "queue CPUs (opt, base): $(softblk list --json | tr -d ' \n' | grep -o '"queue_cpus":\[[][0-9,]*\]' | tr '\n' ' ')"
systems=(kzloop opt base)
echo "| job ($q queues) | kzloop IOPS | opt IOPS | base IOPS | opt / base | opt / kzloop | base / kzloop |"
echo "|---|---|---|---|---:|---:|---:|"
# JOBS (optional): a subset, e.g. "write,128k,32,1".
pins=""
for j in ${JOBS:-randwrite,4k,1,1 randwrite,4k,32,8 randwrite,128k,32,1 write,128k,32,1}; do
  IFS=, read -r rw bs qd nj <<<"$j"
  declare -A iops=() last=()
  ob="" ok="" bk=""  # per-round ratios opt / base, opt / kzloop, base / kzloop
  for round in $(seq "$rounds"); do
    for ((k = 0; k < 3; ++k)); do
      sys=${systems[(k + round - 1) % 3]}
      blkzone reset "${dev[$sys]}"
      out=$(fio --name=z --filename="${dev[$sys]}" --ioengine=io_uring --direct=1 --zonemode=zbd \
        --rw="$rw" --bs="$bs" --iodepth="$qd" --numjobs="$nj" --group_reporting \
        --time_based --runtime="$runtime" --output-format=terse --terse-version=3)
      blkzone reset "${dev[$sys]}"
      v=$(awk -F';' '{print $49}' <<<"$out")  # terse v3: write IOPS
      iops[$sys]+="$v "
      last[$sys]=$v
    done
    ob+="$(vm_ratio "${last[opt]}" "${last[base]}") "
    ok+="$(vm_ratio "${last[opt]}" "${last[kzloop]}") "
    bk+="$(vm_ratio "${last[base]}" "${last[kzloop]}") "
  done
  echo "| $rw $bs QD$qd x$nj | ${iops[kzloop]% } | ${iops[opt]% } | ${iops[base]% } |" \
    "$(vm_median "$ob") | $(vm_median "$ok") | $(vm_median "$bk") |"
  # queue_affinity=auto: where each queue's thread went, and what it measured.
  pins+="$rw $bs QD$qd x$nj: $(softblk list --json | tr -d ' \n' |
    grep -o '"\(queue_cpus\|pin_switches\|pin_ns_per_4k\)":\[[][0-9,]*\]' | tr '\n' ' ')
"
done
printf 'after each job (opt, base):\n%s' "$pins"
echo "idle spins of waits (opt, base): $(softblk list --json | tr -d ' \n' | grep -o '"idle_\(spins\|waits\)":\[[0-9,]*\]' | tr '\n' ' ')"
echo "zero copy from (opt, base): $(softblk list --json | tr -d ' \n' | grep -o '"zero_copy_from":\[[0-9,]*\]' | tr '\n' ' ')"
echo "preallocated (opt, base): $(softblk list --json | tr -d ' \n' | grep -o '"prealloc":[a-z]*' | tr '\n' ' ')"
echo PASS
