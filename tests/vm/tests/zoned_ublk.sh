#!/bin/bash
# softblk's zoned null device over ublk against the kernel's null_blk in
# zoned mode, same geometry (16 zones of 4 MiB with 3 MiB capacity, two
# conventional, 4 KiB blocks, memory-backed):
#  - `blkzone report` of both is the same (types, conditions, write
#    pointers, capacities), and stays the same after blkzone open, close,
#    finish and reset of the same zones, and after `softblk zone` open,
#    finish and reset on the exported device (the same as blkzone's on
#    null_blk; `softblk zone report` prints what blkzone prints);
#  - a differential run: softblk-zone-steps plays one random sequence of
#    writes (at, off and across the write pointer and capacity), reads,
#    open, close, finish, reset and reset all on each device, printing the
#    errno and every zone's condition and write pointer after each step;
#    the two transcripts must be identical, for several seeds, with the
#    open/active limits off and on (zone_max_open=3, zone_max_active=5:
#    the resource errors ETOOMANYREFS / EOVERFLOW come back through ublk);
#  - fio --zonemode=zbd with verify on the ublk device;
#  - a zloop target over ublk: blkzone report, fio --zonemode=zbd verify,
#    and its zone files after `softblk del` hold what the report said;
#  - a zloop-ram target over ublk (its data copied straight between the
#    request and its memory store): fio --zonemode=zbd verify, and zeros
#    read past a write pointer.
#  - btrfs in zoned mode (whose data writes are zone appends): mkfs, files
#    written, btrfs check, the files intact after a remount.
# Zone append has no user-space path on a block device: btrfs is its test.
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool softblk softblk-zone-steps blkzone fio
modprobe ublk_drv || vm_skip "no ublk_drv in this kernel"
vm_wait_for /dev/ublk-control

export SOFTBLK_RUN_DIR=/tmp/softblk-run
cleanup() {
  softblk shutdown >/dev/null 2>&1 || true
  for n in zref0 zref1; do
    [ -d /sys/kernel/config/nullb/$n ] && vm_null_blk_remove $n
  done
  return 0
}
trap cleanup EXIT

steps=${ZONED_STEPS:-1500}
geometry="size=64 zone_size=4 zone_capacity=3 zone_nr_conv=2 blocksize=4096 memory_backed=1"

# softblk's device: the same attributes, with the null target's names.
softblk_add() {  # NAME EXTRA...
  local name=$1; shift
  softblk add null --name "$name" zoned=1 size=64 zone_size=4 zone_capacity=3 zone_nr_conv=2 \
    bs=4096 memory_backed=1 "$@" | tee /tmp/add-$name.txt >&2
  grep -o '/dev/ublkb[0-9]*' /tmp/add-$name.txt | head -n1
}

# blkzone report without the device name.
report() { blkzone report "$1" | sed 's/^ *//'; }

compare_reports() {  # WHAT
  report /dev/$ref >/tmp/ref.txt
  report $dev >/tmp/sb.txt
  if ! cmp -s /tmp/ref.txt /tmp/sb.txt; then
    diff /tmp/ref.txt /tmp/sb.txt | head -20
    vm_fail "$1: blkzone report differs (null_blk < > softblk)"
  fi
}

for limits in off on; do
  if [ $limits = on ]; then
    lim_ref="zone_max_open=3 zone_max_active=5"
    lim_sb="zone_max_open=3 zone_max_active=5"
    ref=zref1
  else
    lim_ref=""
    lim_sb=""
    ref=zref0
  fi
  vm_step "limits $limits: null_blk $ref and softblk"
  # shellcheck disable=SC2086
  vm_null_blk_create $ref zoned=1 $geometry $lim_ref
  # shellcheck disable=SC2086
  dev=$(softblk_add z$limits $lim_sb)
  [ -b "$dev" ] || vm_fail "softblk add printed no ublk device"
  [ "$(cat /sys/block/${dev#/dev/}/queue/zoned)" = host-managed ] || vm_fail "$dev is not zoned"
  for attr in chunk_sectors nr_zones max_open_zones max_active_zones zone_append_max_bytes \
      logical_block_size max_sectors_kb; do
    a=$(cat /sys/block/$ref/queue/$attr)
    b=$(cat /sys/block/${dev#/dev/}/queue/$attr)
    echo "$attr: null_blk $a softblk $b"
    vm_expect_eq "queue/$attr" "$b" "$a"
  done
  compare_reports "fresh"

  vm_step "limits $limits: blkzone open/close/finish/reset"
  zs=8192  # zone size in sectors
  for d in /dev/$ref $dev; do
    blkzone open -o $((2 * zs)) -c 1 $d
    blkzone open -o $((3 * zs)) -c 2 $d
    blkzone close -o $((3 * zs)) -c 1 $d
    blkzone finish -o $((5 * zs)) -c 1 $d
    dd if=/dev/zero of=$d bs=4k count=5 seek=$((6 * zs / 8)) oflag=direct status=none
    blkzone reset -o $((2 * zs)) -c 1 $d
  done
  compare_reports "after blkzone open/close/finish/reset and a write"
  # softblk zone on the exported device (through its ublk queue thread)
  # and blkzone on null_blk: the kernel's reports of both agree.
  softblk zone open z$limits $((7 * zs))
  softblk zone finish z$limits $((3 * zs))
  softblk zone reset z$limits $((6 * zs))
  blkzone open -o $((7 * zs)) -c 1 /dev/$ref
  blkzone finish -o $((3 * zs)) -c 1 /dev/$ref
  blkzone reset -o $((6 * zs)) -c 1 /dev/$ref
  compare_reports "after softblk zone open/finish/reset on the exported device"
  softblk zone report z$limits | sed 's/^ *//' >/tmp/sb-zone.txt
  report $dev >/tmp/sb.txt
  cmp -s /tmp/sb-zone.txt /tmp/sb.txt || { diff /tmp/sb-zone.txt /tmp/sb.txt | head;
    vm_fail "softblk zone report differs from blkzone report of $dev"; }
  # Not at a zone start: both refuse.
  if blkzone reset -o $((2 * zs + 8)) -c 1 $dev 2>/dev/null; then
    vm_fail "a reset off a zone start succeeded on softblk"
  fi
  blkzone reset /dev/$ref
  blkzone reset $dev
  compare_reports "after reset all"

  vm_step "limits $limits: differential random sequences ($steps steps per seed)"
  for seed in 1 2 3; do
    blkzone reset /dev/$ref
    blkzone reset $dev
    softblk-zone-steps /dev/$ref $seed $steps >/tmp/ref-$seed.txt
    softblk-zone-steps $dev $seed $steps >/tmp/sb-$seed.txt
    if ! cmp -s /tmp/ref-$seed.txt /tmp/sb-$seed.txt; then
      diff /tmp/ref-$seed.txt /tmp/sb-$seed.txt | head -20
      vm_fail "limits $limits seed $seed: softblk differs from null_blk (first lines above)"
    fi
    echo "seed $seed: $(wc -l </tmp/sb-$seed.txt) identical lines;" \
      "errors: $(grep -o -- '-> E[A-Z]*' /tmp/sb-$seed.txt | sort | uniq -c | tr '\n' ' ')"
  done
  if [ $limits = on ]; then
    grep -q -- '-> ETOOMANYREFS' /tmp/sb-*.txt || vm_fail "no open resource error seen"
    grep -q -- '-> EOVERFLOW' /tmp/sb-*.txt || vm_fail "no active resource error seen"
  fi
  softblk del z$limits
done

vm_step "fio --zonemode=zbd with verify"
dev=$(softblk_add zfio)
fio --name=zbd --filename=$dev --direct=1 --zonemode=zbd --ioengine=io_uring --iodepth=8 \
  --rw=write --bs=16k --verify=crc32c --do_verify=1 --size=100% --max_open_zones=4 \
  --output-format=terse >/tmp/fio-zbd.txt 2>&1 || { cat /tmp/fio-zbd.txt; vm_fail "fio zbd verify failed"; }
softblk del zfio

vm_step "btrfs in zoned mode on a zoned ublk device (its data goes by zone append)"
modprobe btrfs || vm_skip "no btrfs module"
softblk add null --name zbtrfs zoned=1 size=512 zone_size=16 bs=4096 memory_backed=1 \
  | tee /tmp/add-zbtrfs.txt
dev=$(grep -o '/dev/ublkb[0-9]*' /tmp/add-zbtrfs.txt | head -n1)
mkfs.btrfs -f -q "$dev" || vm_fail "mkfs.btrfs on $dev"
mkdir -p /mnt/b
mount "$dev" /mnt/b
# 24 MiB in all: more than one 16 MiB zone of data; the 72 MiB this
# wrote only cost more urandom and sha256 under TCG.
for i in 1 2 3; do
  dd if=/dev/urandom of=/mnt/b/f$i bs=1M count=8 status=none
done
sha256sum /mnt/b/f* >/tmp/sums.txt
umount /mnt/b
btrfs check "$dev" >/tmp/btrfs-check.txt 2>&1 || { cat /tmp/btrfs-check.txt; vm_fail "btrfs check failed"; }
mount "$dev" /mnt/b
sha256sum -c /tmp/sums.txt || vm_fail "btrfs files changed after a remount"
umount /mnt/b
softblk del zbtrfs

vm_step "zloop target over ublk"
mkdir -p /tmp/zloop/0
softblk add zloop --name zl0 base_dir=/tmp/zloop id=0 capacity_mb=64 zone_size_mb=4 conv_zones=2 \
  | tee /tmp/add-zl0.txt
dev=$(grep -o '/dev/ublkb[0-9]*' /tmp/add-zl0.txt | head -n1)
[ -b "$dev" ] || vm_fail "softblk add zloop printed no ublk device"
blkzone report -c 4 $dev
fio --name=zl --filename=$dev --direct=1 --zonemode=zbd --ioengine=io_uring --iodepth=8 \
  --rw=randwrite --bs=16k --verify=crc32c --do_verify=1 --size=40M --max_open_zones=4 \
  --output-format=terse >/tmp/fio-zl.txt 2>&1 || { cat /tmp/fio-zl.txt; vm_fail "fio zbd verify on zloop failed"; }
blkzone report $dev >/tmp/zl-report.txt
softblk del zl0
# Every sequential zone file's size is the write pointer the report showed.
vm_zloop_check_files /tmp/zl-report.txt /tmp/zloop/0

vm_step "zloop-ram target over ublk"
softblk add zloop-ram --name zlr capacity_mb=64 zone_size_mb=4 conv_zones=2 | tee /tmp/add-zlr.txt
dev=$(grep -o '/dev/ublkb[0-9]*' /tmp/add-zlr.txt | head -n1)
[ -b "$dev" ] || vm_fail "softblk add zloop-ram printed no ublk device"
fio --name=zlr --filename=$dev --direct=1 --zonemode=zbd --ioengine=io_uring --iodepth=8 \
  --rw=randwrite --bs=16k --verify=crc32c --do_verify=1 --size=40M --max_open_zones=4 \
  --output-format=terse >/tmp/fio-zlr.txt 2>&1 || { cat /tmp/fio-zlr.txt; vm_fail "fio zbd verify on zloop-ram failed"; }
# The first sequential zone (8 MiB in) reset, 4 KiB written at its start:
# 8 KiB read there are those bytes, then zeros (past a zone file's end).
blkzone reset -o 16384 -c 1 $dev
head -c 4096 /dev/urandom >/tmp/zlr-block
dd if=/tmp/zlr-block of=$dev bs=4096 seek=2048 oflag=direct status=none
dd if=$dev of=/tmp/zlr-back bs=8192 skip=1024 count=1 iflag=direct status=none
cmp -n 4096 /tmp/zlr-block /tmp/zlr-back || vm_fail "zloop-ram: the block written did not read back"
cmp -n 4096 -i 4096:0 /tmp/zlr-back /dev/zero || vm_fail "zloop-ram: past the write pointer is not zeros"
softblk del zlr
echo "PASS"
