#!/bin/bash
# softblk's zloop target over ublk against the kernel's zloop driver
# (zloop.ko built out of tree by run-vm --module zloop, on the backports
# kernel), both with their zone files on the guest's tmpfs, the same
# geometry (64 MiB in 16 zones of 4 MiB, 3 MiB zone capacity, two
# conventional zones):
#  - differential: the queue limits and `blkzone report` of both are the
#    same; softblk-zone-steps plays one random sequence of writes, reads,
#    open, close, finish, reset and reset all on each device, printing the
#    errno and every zone's condition and write pointer after each step;
#    the transcripts must be identical, for several seeds, with
#    max_open_zones off and on (3);
#  - interchange: the kernel's directory, after its device is removed, is
#    opened by softblk's zloop target, and softblk's directory by the
#    kernel's zloop: the same report (open zones come back closed in both)
#    and the same data (a checksum of the whole device) as before.
# ZONE_FS=xfs (or ext4) puts both directories on that file system on a RAM
# disk instead (vm_zone_fs_root): on XFS softblk preallocates its zone
# files (prealloc=auto), which the kernel's zloop must read as it reads
# its own. Skips (77) where zloop.ko could not be built, with the reason.
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool softblk softblk-zone-steps blkzone md5sum
modprobe ublk_drv || vm_skip "no ublk_drv in this kernel"
vm_require_module zloop
vm_wait_for /dev/ublk-control
vm_wait_for /dev/zloop-control

export SOFTBLK_RUN_DIR=/tmp/softblk-run
kids=""
cleanup() {
  softblk del --all >/dev/null 2>&1 || true
  softblk shutdown >/dev/null 2>&1 || true
  for id in $kids; do echo "remove id=$id" >/dev/zloop-control 2>/dev/null || true; done
  vm_zone_fs_cleanup
  return 0
}
trap cleanup EXIT

steps=${ZLOOP_STEPS:-2000}
seeds=${ZLOOP_SEEDS:-"1 2 3"}
geometry="capacity_mb=64,zone_size_mb=4,zone_capacity_mb=3,conv_zones=2"
vm_zone_fs_root "${ZONE_FS:-tmpfs}"
root=$zone_root

# kernel_add ID BASE [OPTION,...]: a kernel zloop device; prints /dev/zloopID.
kernel_add() {
  local id=$1 base=$2 extra=${3:+,$3}
  mkdir -p "$base/$id"
  echo "add id=$id,$geometry,base_dir=$base$extra" >/dev/zloop-control ||
    vm_fail "zloop-control refused: add id=$id,$geometry,base_dir=$base$extra"
  kids="$kids $id"
  vm_wait_for /dev/zloop$id
  echo /dev/zloop$id
}
kernel_remove() {
  echo "remove id=$1" >/dev/zloop-control || vm_fail "zloop-control refused: remove id=$1"
  kids=$(echo "$kids" | sed "s/ $1\b//")
}

# softblk_add NAME ID BASE [OPTION...]: softblk's zloop over ublk; prints
# its /dev/ublkbN.
softblk_add() {
  local name=$1 id=$2 base=$3; shift 3
  mkdir -p "$base/$id"
  # shellcheck disable=SC2046
  softblk add zloop --name "$name" "base_dir=$base" "id=$id" $(echo "$geometry" | tr ',' ' ') "$@" \
    >/tmp/add-$name.txt 2>&1 || { cat /tmp/add-$name.txt; vm_fail "softblk add zloop $name"; }
  grep -o '/dev/ublkb[0-9]*' /tmp/add-$name.txt | head -n1
}

report() { blkzone report "$1" | sed 's/^ *//'; }
# A report as it reads after the device is made again from its files: the
# open state is not stored, so an open zone comes back empty (nothing
# written) or closed.
reopened() {
  sed -e 's/\(wptr 0x0*0 .*zcond:\) *[23]([a-z]*)/\1 1(em)/' -e 's/zcond: *[23]([a-z]*)/zcond: 4(cl)/'
}
compare_reports() {  # WHAT KERNEL_DEV SOFTBLK_DEV
  report "$2" >/tmp/k.txt
  report "$3" >/tmp/s.txt
  if ! cmp -s /tmp/k.txt /tmp/s.txt; then
    diff /tmp/k.txt /tmp/s.txt | head -20
    vm_fail "$1: blkzone report differs (kernel zloop < > softblk)"
  fi
}

for limits in off on; do
  kopt="" sopt=""
  if [ $limits = on ]; then kopt="max_open_zones=3"; sopt="max_open_zones=3"; fi
  id=$([ $limits = on ] && echo 1 || echo 0)
  vm_step "max_open_zones $limits: kernel zloop and softblk zloop"
  kdev=$(kernel_add $id $root/kz "$kopt")
  # shellcheck disable=SC2086
  sdev=$(softblk_add sz$id $id $root/sz $sopt)
  [ -b "$sdev" ] || vm_fail "softblk add zloop printed no ublk device"
  if [ "${ZONE_FS:-tmpfs}" = xfs ]; then
    vm_expect_eq "prealloc on XFS" "$(vm_json_field prealloc)" true
  fi
  for attr in zoned chunk_sectors nr_zones max_open_zones max_active_zones zone_append_max_bytes \
      logical_block_size physical_block_size max_sectors_kb write_cache fua; do
    a=$(cat /sys/block/${kdev#/dev/}/queue/$attr)
    b=$(cat /sys/block/${sdev#/dev/}/queue/$attr)
    echo "$attr: kernel $a softblk $b"
    [ "$a" = "$b" ] || echo "DIFF queue/$attr: kernel '$a' softblk '$b'" >>/tmp/attr-diffs.txt
  done
  compare_reports "fresh" "$kdev" "$sdev"

  vm_step "max_open_zones $limits: differential random sequences ($steps steps per seed)"
  for seed in $seeds; do
    blkzone reset "$kdev"
    blkzone reset "$sdev"
    softblk-zone-steps "$kdev" $seed $steps >/tmp/k-$limits-$seed.txt
    softblk-zone-steps "$sdev" $seed $steps >/tmp/s-$limits-$seed.txt
    if ! cmp -s /tmp/k-$limits-$seed.txt /tmp/s-$limits-$seed.txt; then
      diff /tmp/k-$limits-$seed.txt /tmp/s-$limits-$seed.txt | head -20
      vm_fail "max_open_zones $limits seed $seed: softblk differs from the kernel's zloop (first lines above)"
    fi
    echo "seed $seed: $(wc -l </tmp/s-$limits-$seed.txt) identical lines;" \
      "errors: $(grep -o -- '-> E[A-Z]*' /tmp/s-$limits-$seed.txt | sort | uniq -c | tr '\n' ' ')"
  done
  [ ! -s /tmp/attr-diffs.txt ] || { cat /tmp/attr-diffs.txt; vm_fail "queue limits differ"; }

  vm_step "max_open_zones $limits: each one's directory opened by the other"
  # The last sequence left zones open, closed, full and partly written.
  report "$kdev" | reopened >/tmp/k-before.txt
  report "$sdev" | reopened >/tmp/s-before.txt
  # md5sum: the same data, not an adversary; 0.9 s for the 64 MiB under
  # TCG where sha256sum takes 2.2 s, four times per limit.
  ksum=$(md5sum <"$kdev" | cut -d' ' -f1)
  ssum=$(md5sum <"$sdev" | cut -d' ' -f1)
  kernel_remove $id
  softblk del sz$id
  # softblk on the kernel's files, the kernel on softblk's.
  # shellcheck disable=SC2086
  sdev2=$(softblk_add kz$id $id $root/kz $sopt)
  kdev2=$(kernel_add $id $root/sz "$kopt")
  report "$sdev2" >/tmp/s-after.txt
  report "$kdev2" >/tmp/k-after.txt
  if ! cmp -s /tmp/k-before.txt /tmp/s-after.txt; then
    diff /tmp/k-before.txt /tmp/s-after.txt | head; vm_fail "softblk on the kernel's files: zones differ"
  fi
  if ! cmp -s /tmp/s-before.txt /tmp/k-after.txt; then
    diff /tmp/s-before.txt /tmp/k-after.txt | head; vm_fail "the kernel on softblk's files: zones differ"
  fi
  vm_expect_eq "data of the kernel's directory read by softblk" "$(md5sum <"$sdev2" | cut -d' ' -f1)" "$ksum"
  vm_expect_eq "data of softblk's directory read by the kernel" "$(md5sum <"$kdev2" | cut -d' ' -f1)" "$ssum"
  grep 'zcond: *4' /tmp/s-after.txt >/dev/null && echo "closed zones after the reopen: $(grep -c 'zcond: *4' /tmp/s-after.txt)"
  kernel_remove $id
  softblk del kz$id
done
echo "PASS"
