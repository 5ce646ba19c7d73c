#!/bin/bash
# The file target over ublk, as a user runs it, on an image file in an ext4
# file system (on a brd RAM disk, so that O_DIRECT reaches a real block
# device):
#  - `softblk add file path=IMAGE size=512M create=1` makes /dev/ublkbN;
#    `softblk list` shows it; direct I/O is used (no notice);
#  - fio write + verify (crc32c) through the device;
#  - blkdiscard frees space in the image (a hole) and reads back zeros;
#    blkdiscard -z (write zeroes) reads back zeros;
#  - mkfs.xfs on the device, files copied in, xfs_repair -n clean, and the
#    image file itself passes xfs_repair -n after the device is deleted;
#  - kill -9 of the daemon under fio with recovery=reissue: the next daemon
#    re-opens the image and re-attaches the device, fio finishes without an
#    error, and data written before the kill reads back;
#  - the device deleted and added again on the same image (no create, no
#    truncation): the data is still there.
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool softblk fio mkfs.ext4 mkfs.xfs xfs_repair sha256sum blkdiscard
modprobe ublk_drv || vm_skip "no ublk_drv in this kernel"
vm_wait_for /dev/ublk-control
vm_require_module brd rd_nr=1 rd_size=786432

export SOFTBLK_RUN_DIR=/tmp/softblk-run
fio_pid=
cleanup() {
  [ -n "$fio_pid" ] && kill -9 "$fio_pid" 2>/dev/null
  softblk del --all >/dev/null 2>&1 || true
  softblk shutdown >/dev/null 2>&1 || true
  umount /mnt/xfs 2>/dev/null || true
  umount /mnt/data 2>/dev/null || true
}
trap cleanup EXIT

mkfs.ext4 -q -F /dev/ram0
mkdir -p /mnt/data /mnt/xfs
mount /dev/ram0 /mnt/data
img=/mnt/data/disk.img

add() {
  softblk add file "path=$img" "$@" --name f0 --queues 2 --depth 64 --export-opt recovery=reissue |
    tee /tmp/add.txt
  dev=$(grep -o '/dev/ublkb[0-9]*' /tmp/add.txt | head -n1)
  [ -b "$dev" ] || vm_fail "add printed no block device"
}

vm_step "add a file device over ublk"
add size=512M create=1
[ "$(stat -c %s $img)" = $((512 << 20)) ] || vm_fail "image is not 512 MiB"
softblk list | tee /tmp/list.txt
grep -q "^f0 *file .*ublk $dev LIVE" /tmp/list.txt || vm_fail "list does not show f0 on $dev"
if grep -q "O_DIRECT" /tmp/list.txt; then vm_fail "O_DIRECT refused on ext4: $(cat /tmp/list.txt)"; fi
[ "$(blockdev --getss $dev)" = 512 ] || [ "$(blockdev --getss $dev)" = 4096 ] || vm_fail "odd block size"
[ "$(cat /sys/block/${dev#/dev/}/queue/write_cache)" = "write back" ] || vm_fail "no volatile write cache advertised"

vm_step "fio write + verify"
fio --name=verify --filename="$dev" --direct=1 --ioengine=io_uring --iodepth=32 --rw=randwrite \
  --bsrange=4k-128k --size=96M --verify=crc32c --verify_fatal=1 --output-format=terse >/tmp/fio-verify.txt ||
  { cat /tmp/fio-verify.txt; vm_fail "fio verify failed"; }
echo "ok: fio write + verify"

vm_step "discard punches the image, write zeroes reads back zeros"
dd if=/dev/zero of=/tmp/zero16 bs=1M count=16 status=none
sync
before=$(stat -c %b "$img")
blkdiscard -o 0 -l 16M "$dev" || vm_fail "blkdiscard on $dev"
after=$(stat -c %b "$img")
[ "$after" -lt "$before" ] || vm_fail "discard did not free space in the image ($before -> $after blocks)"
dd if="$dev" of=/tmp/back16 bs=1M count=16 iflag=direct status=none
cmp /tmp/back16 /tmp/zero16 || vm_fail "discarded range does not read as zeros"
blkdiscard -z -o 16M -l 16M "$dev" || vm_fail "blkdiscard -z (write zeroes) on $dev"
dd if="$dev" of=/tmp/back16 bs=1M skip=16 count=16 iflag=direct status=none
cmp /tmp/back16 /tmp/zero16 || vm_fail "zeroed range does not read as zeros"
echo "ok: discard freed $(((before - after) / 2)) KiB; write zeroes"

vm_step "mkfs.xfs + xfs_repair"
mkfs.xfs -q -f "$dev"
mount "$dev" /mnt/xfs
for i in $(seq 16); do dd if=/dev/urandom of=/mnt/xfs/f$i bs=64k count=$i status=none; done
sha256sum /mnt/xfs/f* >/tmp/sums.txt
umount /mnt/xfs
xfs_repair -n "$dev" >/tmp/repair.txt 2>&1 || { cat /tmp/repair.txt; vm_fail "xfs_repair -n on the device"; }
mount "$dev" /mnt/xfs
(cd / && sha256sum -c /tmp/sums.txt >/dev/null) || vm_fail "files changed across a remount"
umount /mnt/xfs
echo "ok: xfs"

vm_step "kill -9 under fio with recovery=reissue"
# A marker 8 MiB in, written and flushed before the load, must survive.
dd if=/dev/urandom of=/tmp/marker bs=1M count=1 status=none
dd if=/tmp/marker of="$dev" bs=1M seek=8 oflag=direct conv=fsync status=none
fio --name=load --filename="$dev" --allow_file_create=0 --direct=1 --ioengine=io_uring --iodepth=32 \
  --rw=randwrite --bs=4k --offset=32M --size=128M --runtime=10 --time_based --output-format=terse \
  >/tmp/fio-load.txt 2>&1 &
fio_pid=$!
vm_wait_io "$dev"
sleep 1
kill -0 $fio_pid || vm_fail "fio ended before the kill"
pid=$(softblk list | sed -n 's/.* pid \([0-9]*\) .*/\1/p' | head -n1)
[ -n "$pid" ] || vm_fail "no daemon pid in list"
kill -9 "$pid"
while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
echo "killed daemon $pid"
[ -b "$dev" ] || vm_fail "$dev went away with a recovery=reissue daemon"
softblk list | tee /tmp/list2.txt
grep -q "^f0 .*ublk $dev LIVE" /tmp/list2.txt || vm_fail "f0 not LIVE on $dev after the restart"
rc=0
wait $fio_pid || rc=$?
fio_pid=
[ "$rc" = 0 ] || { cat /tmp/fio-load.txt; vm_fail "fio failed across the daemon restart (exit $rc)"; }
errors=$(cut -d';' -f5 /tmp/fio-load.txt | tail -n1)
vm_expect_eq "fio errors across the restart" "$errors" 0
dd if="$dev" of=/tmp/marker.back bs=1M skip=8 count=1 iflag=direct status=none
cmp /tmp/marker /tmp/marker.back || vm_fail "data written before the kill is gone"
fio --name=verify2 --filename="$dev" --direct=1 --ioengine=io_uring --iodepth=16 --rw=randwrite \
  --bs=4k --offset=64M --size=32M --verify=crc32c --verify_fatal=1 --output-format=terse >/dev/null ||
  vm_fail "write + verify after the restart failed"
echo "ok: recovered, fio clean, data kept"

vm_step "delete and add again on the same image"
sync
softblk del f0
[ "$(stat -c %s $img)" = $((512 << 20)) ] || vm_fail "delete changed the image's size"
add
dd if="$dev" of=/tmp/marker.back bs=1M skip=8 count=1 iflag=direct status=none
cmp /tmp/marker /tmp/marker.back || vm_fail "data gone after delete and add"
softblk del f0
echo "PASS"
