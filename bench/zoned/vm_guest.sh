#!/bin/bash
# Guest half of bench/zoned/vm.sh (runs inside tests/vm/run-vm). Devices of
# SIZE_MIB (default 512) MiB in 16 MiB zones, 4 KiB blocks, no conventional zones, no limits:
#   nullb   the kernel's null_blk, zoned, memory_backed=1
#   sbnull  softblk's null target with zoned=1 memory_backed=1, over ublk
#   sbzloop softblk's zloop target over ublk, zone files on FS (ext4, the
#           default, or xfs) on a brd RAM disk (O_DIRECT)
#   sbzlcopy softblk's zloop with zero_copy=0, where sbzloop has ublk zero
#           copy (Linux 6.15+): its writes copied in with pread, as before
#   kzloop  the kernel's zloop (where the kernel has it: run-vm --module
#           zloop on the backports kernel), the same options, its zone
#           files on the same file system (direct I/O, its default)
# with 1 and 2 queues (submit_queues / nr_queues; QUEUE_COUNTS="1 4" says
# which). Jobs (fio, io_uring,
# direct, --zonemode=zbd, time based): 4 KiB random write QD 1 x 1 job,
# 4 KiB random write QD 32 x 8 jobs, 128 KiB random write QD 32 x 1 job,
# 128 KiB sequential write QD 32 x 1 job. Each job runs on each device in
# turn for ROUNDS rounds, each round starting with the next device; the median IOPS and MiB/s are printed with the
# ratios softblk null / null_blk and softblk zloop / kernel zloop of the
# medians and the medians of the per-round ratios. Every device's zones
# are reset before and after each run (the zone files of the zloop devices
# share the RAM disk, written full once before the runs). A failed fio run
# prints what the device and the daemon say about it and is left out of
# the medians; the program then goes on and fails at the end.
set -euo pipefail
. /softblk-vm/lib.sh
fs=${FS:-ext4}
vm_require_tool softblk fio blkzone
modprobe ublk_drv || vm_skip "no ublk_drv in this kernel"
vm_wait_for /dev/ublk-control
runtime=${RUNTIME:-5}
# Smaller devices and RAM disk (ZONE_FS_MIB, vm_bench_zone_fs) for softblk
# bench smoke, where the RAM disk's filling dominated the boot.
size_mib=${SIZE_MIB:-512}
rounds=${ROUNDS:-3}
# The queue counts to measure (softblk bench zloop: 1 and the guest's CPUs).
queue_counts=${QUEUE_COUNTS:-1 2}
systems="nullb sbnull sbzloop"
if modprobe zloop 2>/dev/null; then
  vm_wait_for /dev/zloop-control
  systems="$systems kzloop"
else
  echo "no zloop module in $(uname -r): the kernel's zloop is left out (bench/zoned/vm.sh --kernel backports)"
fi

export SOFTBLK_RUN_DIR=/tmp/softblk-run
cleanup() {
  softblk del --all >/dev/null 2>&1 || true
  softblk shutdown >/dev/null 2>&1 || true
  for q in $queue_counts; do
    [ -d /sys/kernel/config/nullb/nullbz$q ] && vm_null_blk_remove nullbz$q
    [ -b /dev/zloop$((10 + q)) ] && echo "remove id=$((10 + q))" >/dev/zloop-control
  done
  umount /mnt/zl 2>/dev/null || true
}
trap cleanup EXIT

vm_bench_zone_fs "$fs"
echo "zone files on $fs"

jobs=("randwrite 4k 1 1" "randwrite 4k 32 8" "randwrite 128k 32 1" "write 128k 32 1")
# JOBS="RW BS QD NJ,...": other jobs (softblk bench zloop's smoke run takes one).
[ -z "${JOBS:-}" ] || IFS=, read -r -a jobs <<<"$JOBS"
# The median (of an even count: the mean of the middle two).
median() {
  tr ' ' '\n' <<<"$1" | grep . | sort -g |
    awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

# cells JOB PEER SYS RATIOS: the start of a table row comparing SYS with
# PEER (no newline): the job, the medians of both (IOPS and MiB/s), the
# ratio of the medians and the median of the per-round RATIOS (each round).
cells() {
  local rw bs qd nj
  read -r rw bs qd nj <<<"$1"
  awk -v n="$rw $bs QD$qd x$nj" -v a="$(median "${iops[$2 $1]}")" -v ab="$(median "${bw[$2 $1]}")" \
    -v s="$(median "${iops[$3 $1]}")" -v sb="$(median "${bw[$3 $1]}")" -v r="$(median "$4")" \
    -v all="${4% }" \
    'BEGIN {printf "| %s | %d (%s) | %d (%s) | %.2f | %.2f (%s) |", n, a, ab, s, sb, (a > 0) ? s / a : 0, r, all}'
}

# round_ratio S N: "S/N " to two places, or nothing when either run failed.
round_ratio() {
  [ -n "$1" ] && [ -n "$2" ] && awk -v s="$1" -v n="$2" 'BEGIN {if (n > 0) printf "%.2f ", s / n}'
  return 0
}

# A failed fio run is reported and left out; the program goes on so that
# the other runs' figures are not lost, and fails at the end.
failed=()
for q in $queue_counts; do
  vm_step "queues $q"
  # max_sectors=1024 on both null devices: with null_blk's default (255,
  # i.e. 124 KiB with 4 KiB blocks) every 128 KiB write needs a split,
  # which io_uring's non-blocking submission refuses (EAGAIN); the writes
  # are then issued again by io-wq workers, which keep no order between
  # them, so a zone's writes can reach the zone write plug out of order
  # and fail with EIO before any driver sees them (seen three times here,
  # on softblk's device; blktests' zbd/012 uses libaio at QD > 1 for
  # this reason).
  vm_null_blk_create nullbz$q zoned=1 size=$size_mib zone_size=16 zone_nr_conv=0 blocksize=4096 \
    memory_backed=1 submit_queues=$q hw_queue_depth=128 irqmode=0 max_sectors=1024
  softblk add null --name sbnull$q zoned=1 size=$size_mib zone_size=16 zone_nr_conv=0 bs=4096 \
    memory_backed=1 --queues $q --depth 128 irqmode=0 max_sectors=1024 >/tmp/add1.txt
  sbnull=$(grep -o '/dev/ublkb[0-9]*' /tmp/add1.txt | head -n1)
  rm -rf /mnt/zl/$q && mkdir -p /mnt/zl/$q
  softblk add zloop --name sbzl$q base_dir=/mnt/zl id=$q capacity_mb=$size_mib zone_size_mb=16 \
    conv_zones=0 nr_queues=$q queue_depth=128 >/tmp/add2.txt
  sbzl=$(grep -o '/dev/ublkb[0-9]*' /tmp/add2.txt | head -n1)
  [ -b "$sbnull" ] && [ -b "$sbzl" ] || vm_fail "no ublk devices: $(cat /tmp/add1.txt /tmp/add2.txt)"
  sbzlc=
  systems=${systems/ sbzlcopy/}  # again only if this queue count's device has zero copy
  # Not `softblk list | grep -q`: grep leaving early fails the pipe
  # (pipefail) when the list is longer than one write.
  if grep -q '"zero_copy": true' <<<"$(softblk list --json)"; then
    rm -rf /mnt/zl/$((20 + q)) && mkdir -p /mnt/zl/$((20 + q))
    softblk add zloop --name sbzlc$q base_dir=/mnt/zl id=$((20 + q)) capacity_mb=$size_mib zone_size_mb=16 \
      conv_zones=0 nr_queues=$q queue_depth=128 --export-opt zero_copy=0 >/tmp/add3.txt
    sbzlc=$(grep -o '/dev/ublkb[0-9]*' /tmp/add3.txt | head -n1)
    [ -b "$sbzlc" ] || vm_fail "no ublk device: $(cat /tmp/add3.txt)"
    systems="$systems sbzlcopy"
  fi
  kzl=/dev/zloop$((10 + q))
  if [[ $systems == *kzloop* ]]; then
    rm -rf /mnt/zl/$((10 + q)) && mkdir -p /mnt/zl/$((10 + q))
    echo "add id=$((10 + q)),capacity_mb=$size_mib,zone_size_mb=16,conv_zones=0,base_dir=/mnt/zl,nr_queues=$q,queue_depth=128" \
      >/dev/zloop-control
    vm_wait_for $kzl
  fi
  for d in /dev/nullbz$q $sbnull $sbzl $kzl $sbzlc; do
    if [ -b "$d" ]; then echo "$d: max_sectors_kb $(cat "/sys/block/${d#/dev/}/queue/max_sectors_kb")"; fi
  done
  echo "devices: null_blk /dev/nullbz$q, softblk null $sbnull, softblk zloop $sbzl, kernel zloop $kzl${sbzlc:+, softblk zloop copied (zero_copy=0) $sbzlc}"
  declare -A iops=() bw=() ratio=() zratio=() cratio=()
  for round in $(seq "$rounds"); do
    for j in "${jobs[@]}"; do
      read -r rw bs qd nj <<<"$j"
      # Each round starts with another device, so none always runs first.
      read -r -a order <<<"$systems"
      for ((k = 0; k < ${#order[@]}; ++k)); do
        sys=${order[(k + round - 1) % ${#order[@]}]}
        case $sys in
          nullb) dev=/dev/nullbz$q ;;
          sbnull) dev=$sbnull ;;
          sbzloop) dev=$sbzl ;;
          kzloop) dev=$kzl ;;
          sbzlcopy) dev=$sbzlc ;;
        esac
        blkzone reset "$dev"
        # terse v3: field 49 write IOPS, 48 write KiB/s.
        if ! out=$(fio --name=z --filename="$dev" --ioengine=io_uring --direct=1 --zonemode=zbd \
          --rw="$rw" --bs="$bs" --iodepth="$qd" --numjobs="$nj" --group_reporting \
          --time_based --runtime="$runtime" --output-format=terse --terse-version=3 2>/tmp/fio.err); then
          cat /tmp/fio.err
          # Evidence for what refused the write: its zone as the device
          # reports it now (a write pointer at the failed offset: the data
          # did not arrive; elsewhere: the write was off the pointer), the
          # daemon's counters and the guest's free memory.
          off=$(grep -o -m1 'offset=[0-9]*' /tmp/fio.err | cut -d= -f2)
          [ -n "$off" ] && blkzone report -o $((off / 512)) -c 1 "$dev"
          softblk list --json | tr -d ' \n' | grep -o '"\(errors\|requests\|queue_requests\)":\[*[0-9,]*\]*' | tr '\n' ' ' || true
          echo
          grep -E 'MemFree|MemAvailable' /proc/meminfo
          # The kernel's last messages: zone write plugging logs the
          # writes it aborts ("Aborting plugged BIOs"), though not one it
          # refuses for being off the write pointer.
          dmesg | tail -n 8
          failed+=("$sys ($dev): $rw $bs QD $qd x $nj, $q queues, round $round")
          echo "FAILED: round $round q$q $sys $rw $bs qd$qd x$nj (left out of the medians)"
          eval "last_$sys="
          blkzone reset "$dev"
          continue
        fi
        blkzone reset "$dev"
        v=$(awk -F';' '{print $49}' <<<"$out")
        b=$(awk -F';' '{printf "%.1f", $48 / 1024}' <<<"$out")
        iops["$sys $j"]+="$v "
        bw["$sys $j"]+="$b "
        eval "last_$sys=$v"
        echo "round $round q$q $sys $rw $bs qd$qd x$nj: $v IOPS $b MiB/s"
      done
      # The devices ran one after the other: their ratio in one round is
      # less exposed to the host's load drifting than either figure.
      # A round where either device failed has no ratio.
      ratio["$j"]+="$(round_ratio "$last_sbnull" "$last_nullb")"
      if [[ $systems == *kzloop* ]]; then
        zratio["$j"]+="$(round_ratio "$last_sbzloop" "$last_kzloop")"
      fi
      if [[ $systems == *sbzlcopy* ]]; then
        cratio["$j"]+="$(round_ratio "$last_sbzloop" "$last_sbzlcopy")"
      fi
    done
  done
  echo
  echo "queues $q: | job | null_blk IOPS (MiB/s) | softblk null/ublk IOPS (MiB/s) | ratio of medians | median of per-round ratios (each round) | softblk zloop/ublk IOPS (MiB/s) |"
  echo "|---|---:|---:|---:|---:|---:|"
  for j in "${jobs[@]}"; do
    cells "$j" nullb sbnull "${ratio[$j]}"
    awk -v z="$(median "${iops[sbzloop $j]}")" -v zb="$(median "${bw[sbzloop $j]}")" \
      'BEGIN {printf " %d (%s) |\n", z, zb}'
  done
  if [[ $systems == *kzloop* ]]; then
    echo
    echo "queues $q: | job | kernel zloop IOPS (MiB/s) | softblk zloop/ublk IOPS (MiB/s) | ratio of medians | median of per-round ratios (each round) |"
    echo "|---|---:|---:|---:|---:|"
    for j in "${jobs[@]}"; do
      cells "$j" kzloop sbzloop "${zratio[$j]}"
      echo
    done
    echo "remove id=$((10 + q))" >/dev/zloop-control
  fi
  if [[ $systems == *sbzlcopy* ]]; then
    echo
    echo "queues $q: | job | softblk zloop copied (zero_copy=0) IOPS (MiB/s) | softblk zloop zero copy IOPS (MiB/s) | ratio of medians | median of per-round ratios (each round) |"
    echo "|---|---:|---:|---:|---:|"
    for j in "${jobs[@]}"; do
      cells "$j" sbzlcopy sbzloop "${cratio[$j]}"
      echo
    done
    softblk list --json | grep -E '"(kernel_buffer_writes|kernel_buffer_errors|kernel_buffer_rings|held_appends)"' | tr -s ' ' | tr '\n' ' '
    echo
    softblk del sbzlc$q
  fi
  softblk del sbnull$q sbzl$q
  vm_null_blk_remove nullbz$q
done
if ((${#failed[@]})); then
  printf 'failed run: %s\n' "${failed[@]}"
  vm_fail "${#failed[@]} fio run(s) failed (above)"
fi
echo "PASS"
