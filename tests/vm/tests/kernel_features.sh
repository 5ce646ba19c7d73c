#!/bin/bash
# Kernel features the VM lab exists for, which the host kernel lacks: ublk
# (ublk_drv and /dev/ublk-control), nbd.ko, zoned block devices (a zoned
# null_blk, host-managed, with conventional and sequential zones and a
# working write pointer), vfat, and the presence of btrfs and f2fs. Fails
# if this kernel lacks one: every later VM test depends on them.
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool blkzone mkfs.vfat fsck.vfat dd cmp

vm_step "ublk"
modprobe ublk_drv
vm_wait_for /dev/ublk-control
echo "ok: ublk_drv loaded, /dev/ublk-control is $(stat -c '%t:%T' /dev/ublk-control | tr a-f A-F)"

vm_step "nbd"
modprobe nbd nbds_max=4
vm_wait_for /dev/nbd0
vm_expect_eq "nbd devices" "$(ls -d /sys/block/nbd* | wc -l)" 4

vm_step "io_uring"
vm_expect_eq io_uring_disabled "$(cat /proc/sys/kernel/io_uring_disabled)" 0

vm_step "zoned null_blk"
vm_null_blk_create nullb0 size=256 blocksize=4096 memory_backed=1 zoned=1 \
  zone_size=16 zone_nr_conv=2 zone_max_open=4 zone_max_active=6
q=/sys/block/nullb0/queue
echo "zoned: $(cat $q/zoned)"
vm_expect_eq zoned "$(cat $q/zoned)" host-managed
vm_expect_eq nr_zones "$(cat $q/nr_zones)" 16
vm_expect_eq "chunk_sectors (zone size)" "$(cat $q/chunk_sectors)" 32768
vm_expect_eq max_open_zones "$(cat $q/max_open_zones)" 4
vm_expect_eq max_active_zones "$(cat $q/max_active_zones)" 6
blkzone report -c 3 /dev/nullb0
vm_expect_eq "conventional zones" "$(blkzone report /dev/nullb0 | grep -c CONVENTIONAL)" 2
# Zone 2 is the first sequential one: 16 MiB in, starting at sector 65536.
zone=$((2 * 32768))
dd if=/dev/urandom of=/tmp/blk bs=64k count=1 status=none
dd if=/tmp/blk of=/dev/nullb0 bs=64k seek=$((zone * 512 / 65536)) oflag=direct status=none
wp=$(blkzone report -o $zone -c 1 /dev/nullb0 | sed -nE 's/.*wptr (0x[0-9a-f]+).*/\1/p')
vm_expect_eq "write pointer after 64 KiB" "$((wp))" 128
cmp -n 65536 -i 0:$((zone * 512)) /tmp/blk /dev/nullb0 || vm_fail "zone data differs"
if dd if=/tmp/blk of=/dev/nullb0 bs=64k seek=$((zone * 512 / 65536)) oflag=direct status=none 2>/dev/null; then
  vm_fail "a write behind the write pointer succeeded"
fi
echo "ok: a write behind the write pointer is rejected"
blkzone reset -o $zone -c 1 /dev/nullb0
wp=$(blkzone report -o $zone -c 1 /dev/nullb0 | sed -nE 's/.*wptr (0x[0-9a-f]+).*/\1/p')
vm_expect_eq "write pointer after reset" "$((wp))" 0
vm_null_blk_remove nullb0

vm_step "vfat on null_blk"
vm_null_blk_create nullb1 size=64 blocksize=512 memory_backed=1
mkfs.vfat -F 32 /dev/nullb1 >/dev/null
mkdir -p /mnt/fat
mount -t vfat /dev/nullb1 /mnt/fat
echo hello >/mnt/fat/HELLO.TXT
umount /mnt/fat
fsck.vfat -n /dev/nullb1 >/tmp/fsck.out || { cat /tmp/fsck.out; vm_fail "fsck.vfat found errors"; }
mount -t vfat -o ro /dev/nullb1 /mnt/fat
vm_expect_eq "file on vfat" "$(cat /mnt/fat/HELLO.TXT)" hello
umount /mnt/fat
vm_null_blk_remove nullb1

vm_step "btrfs and f2fs are available as modules"
# Loading btrfs runs the raid6 benchmarks, seconds under TCG: check only.
for m in btrfs f2fs; do
  modinfo -F filename $m >/dev/null || vm_fail "no $m module"
  echo "ok: $m module present"
done
