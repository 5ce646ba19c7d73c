#!/bin/bash
# Guest half of bench/ublk/kublk-compare (runs inside tests/vm/run-vm
# --peer kublk): softblk over ublk against kublk, the ublk server the
# kernel ships with its selftests, each mode against kublk's same mode,
# with the kernel's own driver beside them. Four groups of three devices,
# NR_QUEUES queues (default 1) and depth 128 each:
#   null:      null_blk, kublk null, softblk null (no memory backing,
#              irqmode=0, 4 KiB blocks, 1 MiB requests on all three);
#   copy:      kublk loop, softblk file, the kernel's loop device
#              (direct I/O): the kernel copies the data to the server's
#              buffers;
#   user copy: kublk loop -u, softblk file user_copy=1 zero_copy=0, loop:
#              the server reads the data from /dev/ublkcN;
#   zero copy: kublk loop --auto_zc, softblk file zero_copy=1
#              zero_copy_min=0 (every write), loop: the file is written
#              from the request's own pages.
# Each device has its own image (128 MiB of random data) on ext4 on a brd
# RAM disk written full first. fio (io_uring, direct) runs JOBS (rw,bs,
# iodepth,numjobs; default the zoned benchmark's four write jobs) on the
# three devices of a group in turn, ROUNDS rounds of RUNTIME s, each round
# starting with the next device; per job the IOPS of every round and the
# medians of the per-round ratios.
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool softblk kublk fio losetup mkfs.ext4
modprobe ublk_drv || vm_skip "no ublk_drv in this kernel"
vm_wait_for /dev/ublk-control
vm_require_module brd rd_nr=1 rd_size=$((1024 * 1024))
modprobe loop 2>/dev/null || true
q=${NR_QUEUES:-1}
rounds=${ROUNDS:-3}
runtime=${RUNTIME:-4}
jobs=(${JOBS:-randwrite,4k,1,1 randwrite,4k,32,8 randwrite,128k,32,1 write,128k,32,1})
kublk_ids=(40 41 42 43)

export SOFTBLK_RUN_DIR=/tmp/softblk-run
loop=
cleanup() {
  [ -n "$loop" ] && losetup -d "$loop" 2>/dev/null
  # One at a time, bounded: kublk's `del -a` has been seen to hang here.
  local id
  for id in "${kublk_ids[@]}"; do
    [ -e /dev/ublkc$id ] && { timeout 30 kublk del -n $id >/dev/null 2>&1 || echo "kublk del -n $id: $?"; }
  done
  softblk shutdown >/dev/null 2>&1 || true
  [ -d /sys/kernel/config/nullb/nb ] && vm_null_blk_remove nb
  umount /mnt/d 2>/dev/null || true
}
trap cleanup EXIT

dd if=/dev/zero of=/dev/ram0 bs=1M count=1024 oflag=direct status=none
mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 /dev/ram0
mkdir -p /mnt/d && mount /dev/ram0 /mnt/d
for f in kublk file user zero loop; do
  dd if=/dev/urandom of=/mnt/d/$f.img bs=1M count=128 status=none
done
sync

vm_null_blk_create nb size=128 blocksize=4096 memory_backed=0 submit_queues=$q hw_queue_depth=128 \
  irqmode=0 max_sectors=2048
kublk add -t null -q $q -d 128 -n 40 >/tmp/kublk40.txt 2>&1
kublk add -t loop -q $q -d 128 -n 41 /mnt/d/kublk.img >/tmp/kublk41.txt 2>&1
kublk add -t loop -q $q -d 128 -n 42 -u /mnt/d/kublk.img >/tmp/kublk42.txt 2>&1
kublk add -t loop -q $q -d 128 -n 43 --auto_zc /mnt/d/kublk.img >/tmp/kublk43.txt 2>&1
loop=$(losetup --direct-io=on --show -f /mnt/d/loop.img)
declare -A node=([null_blk]=/dev/nb [kublk_null]=/dev/ublkb40 [loop]=$loop [kublk_loop]=/dev/ublkb41
  [kublk_loop_u]=/dev/ublkb42 [kublk_loop_zc]=/dev/ublkb43)
ublk=(--queues "$q" --depth 128)
vm_add_ublk sbnull null size=128 bs=4096 irqmode=0 max_sectors=2048 "${ublk[@]}"
node[softblk_null]=$dev
vm_add_ublk sbfile file path=/mnt/d/file.img "${ublk[@]}"
node[softblk_file]=$dev
vm_add_ublk sbfileu file path=/mnt/d/user.img --export-opt user_copy=1 --export-opt zero_copy=0 "${ublk[@]}"
node[softblk_file_u]=$dev
vm_add_ublk sbfilez file path=/mnt/d/zero.img --export-opt zero_copy=1 --export-opt zero_copy_min=0 "${ublk[@]}"
node[softblk_file_zc]=$dev
for id in "${kublk_ids[@]}"; do vm_wait_for /dev/ublkb$id; done
echo "kublk: $(kublk features 2>/dev/null | tr -s ' \n' ' ' | cut -c1-200)"
for s in null_blk kublk_null softblk_null loop kublk_loop softblk_file kublk_loop_u softblk_file_u kublk_loop_zc softblk_file_zc; do
  d=${node[$s]#/dev/}
  [ -b "${node[$s]}" ] || vm_fail "$s: no device (${node[$s]})"
  echo "$s: ${node[$s]}, block $(cat /sys/block/$d/queue/logical_block_size), max_sectors_kb $(cat /sys/block/$d/queue/max_sectors_kb), scheduler $(cat /sys/block/$d/queue/scheduler)"
done

group() {  # TITLE KUBLK SOFTBLK KERNEL
  local title=$1 k=$2 s=$3 r=$4
  local systems=("$k" "$s" "$r")
  echo
  echo "$title ($q queues):"
  echo "| job | $k IOPS | $s IOPS | $r IOPS | softblk / kublk | kublk / kernel | softblk / kernel |"
  echo "|---|---|---|---|---:|---:|---:|"
  local j rw bs qd nj round i sys v sk kr sr
  for j in "${jobs[@]}"; do
    IFS=, read -r rw bs qd nj <<<"$j"
    declare -A iops=() last=()
    sk="" kr="" sr=""
    for round in $(seq "$rounds"); do
      for ((i = 0; i < 3; ++i)); do
        sys=${systems[(i + round - 1) % 3]}
        v=$(fio --name=b --filename="${node[$sys]}" --ioengine=io_uring --direct=1 --size=128M \
          --rw="$rw" --bs="$bs" --iodepth="$qd" --numjobs="$nj" --group_reporting \
          --time_based --runtime="$runtime" --output-format=terse --terse-version=3 |
          awk -F';' '{print $8 + $49}')
        iops[$sys]+="$v "
        last[$sys]=$v
      done
      sk+="$(vm_ratio "${last[$s]}" "${last[$k]}") "
      kr+="$(vm_ratio "${last[$k]}" "${last[$r]}") "
      sr+="$(vm_ratio "${last[$s]}" "${last[$r]}") "
    done
    echo "| $rw $bs QD$qd x$nj | ${iops[$k]% } | ${iops[$s]% } | ${iops[$r]% } | $(vm_median "$sk") | $(vm_median "$kr") | $(vm_median "$sr") |"
  done
}
group "null target" kublk_null softblk_null null_blk
group "file, copy mode" kublk_loop softblk_file loop
group "file, USER_COPY" kublk_loop_u softblk_file_u loop
group "file, zero copy" kublk_loop_zc softblk_file_zc loop
echo
echo "softblk's zero-copy writes: $(softblk list --json | tr -d ' \n' | grep -o '"kernel_buffer_writes":[0-9]*' | tr '\n' ' ')"
echo PASS
