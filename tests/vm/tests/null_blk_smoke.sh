#!/bin/bash
# null_blk smoke test: the kernel's own null_blk, made through configfs with
# the attributes softblk's null target copies (memory_backed, blocksize,
# size in MiB, irqmode, hw_queue_depth, submit_queues, poll_queues,
# discard), must hold
# data (fio --verify=crc32c), carry an ext4 file system that survives a
# remount and a forced fsck, read zeros after blkdiscard, and show the
# queue limits it was configured with. It is the reference side for
# softblk's own null device.
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool fio mkfs.ext4 e2fsck blkdiscard blockdev cmp sha256sum

dev=/dev/nullb0
vm_step "create nullb0 through configfs"
vm_null_blk_create nullb0 size=128 blocksize=4096 memory_backed=1 irqmode=0 \
  hw_queue_depth=64 submit_queues=2 poll_queues=1 discard=1

vm_step "queue limits in sysfs"
q=/sys/block/nullb0/queue
vm_expect_eq "size (bytes)" "$(blockdev --getsize64 $dev)" $((128 << 20))
vm_expect_eq logical_block_size "$(cat $q/logical_block_size)" 4096
vm_expect_eq physical_block_size "$(cat $q/physical_block_size)" 4096
vm_expect_eq rotational "$(cat $q/rotational)" 0
vm_expect_eq zoned "$(cat $q/zoned)" none
# null_blk has submit_queues + poll_queues hardware queues.
vm_expect_eq "hardware queues" "$(ls /sys/block/nullb0/mq | wc -l)" 3
vm_expect_eq "tags per queue" "$(cat /sys/block/nullb0/mq/0/nr_tags)" 64
vm_expect_eq discard_granularity "$(cat $q/discard_granularity)" 4096
[ "$(cat $q/discard_max_bytes)" -gt 0 ] || vm_fail "discard_max_bytes is 0"
echo "ok: discard_max_bytes = $(cat $q/discard_max_bytes)"

vm_step "fio random writes, then verify (crc32c)"
fio --name=verify --filename=$dev --ioengine=io_uring --direct=1 \
  --rw=randwrite --bsrange=4k-64k --iodepth=16 --size=32M \
  --verify=crc32c --verify_fatal=1 --do_verify=1 --randrepeat=0 \
  --output-format=terse --terse-version=3 >/tmp/fio.out ||
  { cat /tmp/fio.out; vm_fail "fio verify failed"; }
echo "ok: fio wrote and verified 32 MiB"

vm_step "ext4: mkfs, mount, write, remount, read back, fsck"
mkfs.ext4 -q -F $dev
mkdir -p /mnt/t
mount -t ext4 $dev /mnt/t
dd if=/dev/urandom of=/mnt/t/data bs=1M count=4 status=none
sum=$(sha256sum </mnt/t/data)
mkdir /mnt/t/dir && echo hello >/mnt/t/dir/file
umount /mnt/t
mount -t ext4 $dev /mnt/t
vm_expect_eq "data checksum after remount" "$(sha256sum </mnt/t/data)" "$sum"
vm_expect_eq "small file" "$(cat /mnt/t/dir/file)" hello
umount /mnt/t
e2fsck -fn $dev >/tmp/fsck.out 2>&1 || { cat /tmp/fsck.out; vm_fail "e2fsck found errors"; }
echo "ok: e2fsck -fn is clean"

vm_step "blkdiscard, then the device reads zeros"
blkdiscard -f $dev
cmp -n $((128 << 20)) $dev /dev/zero || vm_fail "nonzero data after blkdiscard"
echo "ok: all 128 MiB read as zeros"

vm_null_blk_remove nullb0
[ ! -e $dev ] || vm_fail "$dev still there after removal"
echo "ok: nullb0 removed"
