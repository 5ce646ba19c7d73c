#!/bin/bash
# Guest half of bench/file/vm.sh (runs inside tests/vm/run-vm): softblk's
# file target over ublk against the kernel's loop device with direct I/O,
# both on the same image file (ext4 on a brd RAM disk, so that the block
# layer below the file, not an emulated disk, is what both reach). Both
# devices stay attached; each job runs on one, then the other, for
# ROUNDS rounds, and the median is printed. fio: io_uring, direct.
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool softblk fio mkfs.ext4 losetup
modprobe ublk_drv || vm_skip "no ublk_drv in this kernel"
vm_wait_for /dev/ublk-control
size_mib=${SIZE_MIB:-512}
vm_require_module brd rd_nr=1 rd_size=$(((size_mib + 256) * 1024))
modprobe loop 2>/dev/null || true
runtime=${RUNTIME:-5}
rounds=${ROUNDS:-3}
queues=${QUEUES:-1}
depth=${DEPTH:-128}

export SOFTBLK_RUN_DIR=/tmp/softblk-run
loop=
cleanup() {
  [ -n "$loop" ] && losetup -d "$loop" 2>/dev/null
  softblk del --all >/dev/null 2>&1 || true
  softblk shutdown >/dev/null 2>&1 || true
  umount /mnt/data 2>/dev/null || true
}
trap cleanup EXIT

mkfs.ext4 -q -F /dev/ram0
mkdir -p /mnt/data
mount /dev/ram0 /mnt/data
img=/mnt/data/bench.img
# Every block written: both read allocated data.
dd if=/dev/urandom of=$img bs=1M count=$size_mib status=none
sync

softblk add file "path=$img" --name b0 --queues "$queues" --depth "$depth" >/tmp/add.txt
ublk=$(grep -o '/dev/ublkb[0-9]*' /tmp/add.txt | head -n1)
[ -b "$ublk" ] || vm_fail "no ublk device: $(cat /tmp/add.txt)"
loop=$(losetup --direct-io=on --show -f "$img")
[ "$(cat /sys/block/${loop#/dev/}/loop/dio)" = 1 ] || vm_fail "$loop has no direct I/O"
echo "devices: softblk $ublk (queues $queues, depth $depth, bs $(blockdev --getss $ublk)), loop $loop (dio, bs $(blockdev --getss $loop))"
softblk list

jobs=("randread 4k 1" "randread 4k 32" "randwrite 4k 1" "randwrite 4k 32" "read 128k 32" "write 128k 32")
declare -A samples ratios
for round in $(seq "$rounds"); do
  for j in "${jobs[@]}"; do
    read -r rw bs qd <<<"$j"
    for sys in softblk loop; do
      dev=$ublk
      [ $sys = loop ] && dev=$loop
      v=$(fio --name=b --filename="$dev" --ioengine=io_uring --direct=1 --rw="$rw" --bs="$bs" \
        --iodepth="$qd" --size="${size_mib}M" --time_based --runtime="$runtime" \
        --output-format=terse --terse-version=3 | awk -F';' '{print $8 + $49}')
      samples["$sys $j"]+="$v "
      [ $sys = softblk ] && softblk_v=$v
      echo "round $round $sys $rw $bs qd$qd: $v IOPS"
    done
    # The two ran one after the other: their ratio in this round is less
    # exposed to the host's load drifting than either figure.
    ratios["$j"]+="$(awk -v s="$softblk_v" -v l="$v" 'BEGIN {printf "%.2f", (l > 0) ? s / l : 0}') "
  done
done
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
echo
echo "| job | softblk file (ublk) IOPS | kernel loop (dio) IOPS | ratio of medians | median of per-round ratios (each round) |"
echo "|---|---:|---:|---:|---:|"
for j in "${jobs[@]}"; do
  read -r rw bs qd <<<"$j"
  s=$(median "${samples[softblk $j]}")
  l=$(median "${samples[loop $j]}")
  r=$(median "${ratios[$j]}")
  awk -v n="$rw $bs QD$qd" -v s="$s" -v l="$l" -v r="$r" -v all="${ratios[$j]% }" \
    'BEGIN {printf "| %s | %d | %d | %.2f | %.2f (%s) |\n", n, s, l, (l > 0) ? s / l : 0, r, all}'
done
echo "PASS"
