#!/bin/bash
# Guest half of tests/virtio/vm_vhost_user_blk.sh: a Linux guest (virtio_blk)
# on softblk's vhost-user-blk back end, which runs on the host. The disk is
# found by the serial the back end answers to GET_ID (the device name).
#   basic NAME      geometry, 2 hardware queues, fio verify, ext4 mkfs + fsck,
#                   write zeroes reads back zeros, discard of the whole disk
#   restart NAME    fio keeps doing I/O while the host kills the back end and
#                   starts it again: no I/O error reaches the guest
#   resize NAME     the disk starts at 64 MiB; the guest writes a marker, the
#                   host grows the device to 128 MiB, the disk follows and
#                   I/O at its new end reads back
#   zoned NAME      the disk is seen as a zoned (host-managed) device and
#                   `blkzone report` lists its zones
set -euo pipefail
. /softblk-vm/lib.sh
scenario=${1:?scenario}
name=${2:?device name}
vm_require_module virtio_blk
vm_require_tool fio blockdev

dev=
for i in $(seq 1 50); do
  for s in /sys/block/vd*/serial; do
    [ -e "$s" ] || continue
    if [ "$(cat "$s")" = "$name" ]; then dev=/dev/$(basename "$(dirname "$s")"); fi
  done
  [ -n "$dev" ] && break
  sleep 0.2
done
[ -n "$dev" ] || vm_fail "no virtio disk with serial $name (vhost-user-blk-pci did not appear)"
b=$(basename "$dev")
q=/sys/block/$b/queue
echo "ok: $dev has serial $name"

case $scenario in
basic)
  vm_require_tool mkfs.ext4 e2fsck blkdiscard cmp
  vm_step "geometry from the back end's config space"
  vm_expect_eq "size (bytes)" "$(blockdev --getsize64 "$dev")" $((256 << 20))
  vm_expect_eq logical_block_size "$(cat $q/logical_block_size)" 4096
  vm_expect_eq "hardware queues (num-queues=2)" "$(ls /sys/block/$b/mq | wc -l)" 2
  [ "$(cat $q/discard_max_bytes)" -gt 0 ] || vm_fail "discard_max_bytes is 0"
  [ "$(cat $q/write_zeroes_max_bytes)" -gt 0 ] || vm_fail "write_zeroes_max_bytes is 0"
  echo "ok: discard_max_bytes $(cat $q/discard_max_bytes), write_zeroes_max_bytes $(cat $q/write_zeroes_max_bytes)"

  vm_step "fio random writes on both queues, then verify (crc32c)"
  fio --name=verify --filename="$dev" --ioengine=io_uring --direct=1 --rw=randwrite \
    --bsrange=4k-128k --iodepth=16 --numjobs=2 --offset_increment=64M --size=48M \
    --verify=crc32c --verify_fatal=1 --do_verify=1 --randrepeat=0 --group_reporting \
    --output-format=terse --terse-version=3 >/tmp/fio.out || { cat /tmp/fio.out; vm_fail "fio verify failed"; }
  echo "ok: fio wrote and verified 96 MiB"
  for mq in /sys/block/$b/mq/*; do
    echo "queue $(basename "$mq"): $(cat "$mq"/nr_tags) tags"
  done

  vm_step "write zeroes (blkdiscard -z) reads back as zeros"
  head -c $((4 << 20)) /dev/urandom >/tmp/rand
  dd if=/tmp/rand of="$dev" bs=1M seek=200 oflag=direct status=none
  blkdiscard -z -o $((200 << 20)) -l $((4 << 20)) "$dev"
  cmp -n $((4 << 20)) <(dd if="$dev" bs=1M skip=200 count=4 iflag=direct status=none) /dev/zero ||
    vm_fail "4 MiB zeroed by write zeroes do not read as zeros"
  echo "ok: write zeroes"

  vm_step "ext4: mkfs, files, fsck"
  mkfs.ext4 -q -F "$dev"
  mkdir -p /mnt/v
  mount "$dev" /mnt/v
  cp /tmp/rand /mnt/v/rand
  sync
  umount /mnt/v
  mount "$dev" /mnt/v
  cmp /tmp/rand /mnt/v/rand || vm_fail "file content changed across a remount"
  umount /mnt/v
  e2fsck -fn "$dev" >/tmp/fsck.out 2>&1 || { cat /tmp/fsck.out; vm_fail "e2fsck found errors"; }
  echo "ok: ext4 clean"

  vm_step "discard the whole disk"
  wipefs -qa "$dev"
  blkdiscard "$dev"
  echo "ok: discarded"
  ;;
restart)
  vm_require_tool dmesg
  vm_step "fio randrw of 6144 requests while the host restarts the back end"
  dmesg -c >/dev/null
  # The host watches the back end's request count and kills it after 2000
  # requests: fio's are counted, not timed, so some 3700 requests run on the
  # new back end however slow or fast the machine is (a fixed 60 s wasted
  # time on a fast host and would end too soon on a very slow one).
  echo "SOFTBLK-GUEST-IO-STARTING"
  fio --name=restart --filename="$dev" --ioengine=io_uring --direct=1 --rw=randrw \
    --bs=4k --iodepth=16 --size=64M --io_size=24M \
    --output-format=terse --terse-version=3 >/tmp/fio.out 2>&1 || { cat /tmp/fio.out; vm_fail "fio saw an I/O error"; }
  if dmesg | grep -Ei "I/O error|blk_update_request|critical (medium|target) error"; then
    vm_fail "the kernel logged an I/O error"
  fi
  echo "ok: no I/O error across the back-end restart"
  ;;
resize)
  vm_require_tool cmp dd
  vm_step "64 MiB at first, then the host grows the device"
  vm_expect_eq "size (bytes)" "$(blockdev --getsize64 "$dev")" $((64 << 20))
  { printf SOFTBLK-RESIZE; head -c 4082 /dev/zero; } >/tmp/marker
  dd if=/tmp/marker of="$dev" bs=4096 count=1 oflag=direct,sync status=none
  for i in $(seq 1 600); do
    [ "$(cat /sys/block/$b/size)" -eq $((128 << 11)) ] && break
    sleep 0.2
  done
  vm_expect_eq "size after the host's resize (bytes)" "$(blockdev --getsize64 "$dev")" $((128 << 20))
  head -c $((1 << 20)) /dev/urandom >/tmp/rand
  dd if=/tmp/rand of="$dev" bs=1M seek=127 oflag=direct status=none || vm_fail "write at the new end failed"
  cmp /tmp/rand <(dd if="$dev" bs=1M skip=127 count=1 iflag=direct status=none) ||
    vm_fail "the new end does not read back what was written"
  echo "ok: the disk grew to 128 MiB and its new end reads back"
  ;;
zoned)
  vm_require_tool blkzone
  vm_expect_eq zoned "$(cat $q/zoned)" host-managed
  blkzone report -c 5 "$dev"
  n=$(blkzone report "$dev" | wc -l)
  [ "$n" -gt 0 ] || vm_fail "blkzone report listed no zones"
  echo "ok: $n zones"
  ;;
*)
  vm_fail "unknown scenario $scenario"
  ;;
esac
