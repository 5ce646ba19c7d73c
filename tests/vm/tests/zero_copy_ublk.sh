#!/bin/bash
# ublk zero copy (UBLK_F_SUPPORT_ZERO_COPY, Linux 6.15+: the backports
# kernel) for the targets that write through a file ring (issue 14): a
# write's pages stay in the kernel, the queue's file ring registers them in
# its table of fixed buffers and writes the file from there.
#  - zloop (zero_copy=auto): the export says zero_copy, fio --zonemode=zbd
#    with crc32c verify over writes of 4 KiB to 512 KiB, the counters show
#    writes from the kernel and no buffer error; removed, added again on the
#    same directory: the same write pointers and the same contents.
#  - file target with user_copy=1 (auto): fio random writes with verify, and
#    zero_copy_min=65536 keeps 4 KiB writes on the copy path while 128 KiB
#    ones take zero copy; measured (zero_copy_min=-1), 4 KiB writes at
#    QD 32 take zero copy (each finds others in flight).
#  - zero_copy=0 turns it off; zero_copy=1 on a null device is refused with
#    the reason.
#  - The file I/O runs in the ublk queue threads' rings (borrowed_rings),
#    not with shared_ring=0.
#  - Where the kernel has UBLK_F_AUTO_BUF_REG (6.16+), zero copy takes it:
#    the kernel puts a request's pages in the queue's ring itself and the
#    writes take no register entries (buffer_registers 0, issue 45); every
#    write of a file device with zero_copy_min=0 goes zero copy and the
#    image file holds what was written. auto_buf_reg=0 keeps the register
#    entries (SUPPORT_ZERO_COPY, the 6.15 way): the same checks, with one
#    register entry per zero-copy write.
# Where the kernel lacks zero copy (6.12) the test skips with the reason.
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool softblk fio blkzone mkfs.ext4
modprobe ublk_drv || vm_skip "no ublk_drv in this kernel"
vm_wait_for /dev/ublk-control

export SOFTBLK_RUN_DIR=/tmp/softblk-run
cleanup() {
  softblk del --all >/dev/null 2>&1 || true
  softblk shutdown >/dev/null 2>&1 || true
  vm_zone_fs_cleanup
}
trap cleanup EXIT

# ext4 on a brd RAM disk (guest/lib.sh).
vm_zone_fs_root ext4
fs=$zone_root

softblk features >/tmp/features.txt
if grep -q 'AUTO_BUF_REG' /tmp/features.txt; then
  way=auto_buf_reg
else
  way=register_entries
fi
echo "kernel $(uname -r): zero copy by $way"
zc_way() {
  softblk list --json | grep -o '"zero_copy_way": *"[a-z_]*"' | sed -n '1s/.*: *"\(.*\)"/\1/p'
}
# DEV PATH BYTES: BYTES of random data written to DEV (1 MiB writes,
# direct), read back through it, and, after the device is deleted by the
# caller, compared with the image PATH (check_image).
write_known() {
  dd if=/dev/urandom of=/tmp/known bs=1M count=$(($3 >> 20)) status=none
  dd if=/tmp/known of="$1" bs=1M oflag=direct status=none
  cmp /tmp/known <(dd if="$1" bs=1M count=$(($3 >> 20)) iflag=direct status=none) ||
    vm_fail "$1: read back differs from what was written"
}
check_image() {
  cmp /tmp/known <(head -c "$2" "$1") || vm_fail "$1: the image differs from what was written"
}

vm_step "zloop over ublk, zero_copy=auto"
mkdir -p $fs/zl/0
vm_add_ublk zl zloop base_dir=$fs/zl id=0 capacity_mb=256 zone_size_mb=16 conv_zones=2
zc=$(vm_json_field zero_copy)
if [ "$zc" != true ]; then
  softblk features | tee /tmp/features.txt
  vm_skip "kernel $(uname -r): no ublk zero copy for zloop (export zero_copy=$zc)"
fi
# Random sizes (a zone takes one write at a time: zbd mode keeps them at
# the write pointer), every block checked after the writes.
fio --name=zc --filename="$dev" --ioengine=io_uring --direct=1 --zonemode=zbd --rw=randwrite \
  --bsrange=4k-512k --iodepth=16 --size=192M --io_size=96M --verify=crc32c --verify_fatal=1 \
  --do_verify=1 --output=/tmp/fio-zl.txt || { cat /tmp/fio-zl.txt; vm_fail "fio verify on zloop"; }
writes=$(vm_json_field kernel_buffer_writes)
errors=$(vm_json_field kernel_buffer_errors)
echo "zloop: kernel_buffer_writes $writes kernel_buffer_errors $errors"
[ "${writes:-0}" -gt 0 ] || vm_fail "no write took zero copy"
vm_expect_eq "kernel_buffer_errors" "$errors" 0
vm_expect_eq "zloop zero_copy_way" "$(zc_way)" "$way"
if [ "$way" = auto_buf_reg ]; then
  vm_expect_eq "zloop buffer_registers (AUTO_BUF_REG)" "$(vm_json_field buffer_registers)" 0
fi
# The queue's file I/O ran in its ublk ring (shared_ring=1, the default).
vm_expect_eq "borrowed_rings (nr_queues=1)" "$(vm_json_field borrowed_rings)" 1
# The conventional zones too (plain writes, not appends).
dd if=/dev/urandom of=/tmp/conv bs=1M count=4 status=none
dd if=/tmp/conv of="$dev" bs=1M oflag=direct status=none
dd if="$dev" of=/tmp/conv.back bs=1M count=4 iflag=direct status=none
cmp /tmp/conv /tmp/conv.back || vm_fail "conventional zone read back differs"
blkzone report "$dev" >/tmp/zones-before.txt
sum_before=$(dd if="$dev" bs=1M iflag=direct status=none | md5sum)
softblk del zl
vm_zloop_check_files /tmp/zones-before.txt $fs/zl/0

vm_step "the same directory again: the data verifies"
vm_add_ublk zl2 zloop base_dir=$fs/zl id=0 capacity_mb=256 zone_size_mb=16 conv_zones=2
blkzone report "$dev" >/tmp/zones-after.txt
# The same write pointers (open zones come back closed).
diff <(sed 's/zcond.*//' /tmp/zones-before.txt) <(sed 's/zcond.*//' /tmp/zones-after.txt) ||
  vm_fail "write pointers differ after re-adding"
vm_expect_eq "the device's contents (md5) after re-adding" \
  "$(dd if="$dev" bs=1M iflag=direct status=none | md5sum)" "$sum_before"
softblk del zl2

vm_step "file target, user_copy=1 (zero copy auto), zero_copy_min=65536"
vm_add_ublk f1 file path=$fs/f1.img size=128M create=1 --bs 4096 \
  --export-opt user_copy=1 --export-opt zero_copy_min=65536
vm_expect_eq "file export zero_copy" "$(vm_json_field zero_copy)" true
fio --name=small --filename="$dev" --ioengine=io_uring --direct=1 --rw=randwrite --bs=4k \
  --iodepth=8 --size=32M --io_size=8M --verify=crc32c --verify_fatal=1 --do_verify=1 \
  --output=/tmp/fio-f1.txt || { cat /tmp/fio-f1.txt; vm_fail "fio verify, 4 KiB"; }
vm_expect_eq "kernel_buffer_writes after 4 KiB writes below zero_copy_min" \
  "$(vm_json_field kernel_buffer_writes)" 0
# No merges: two of the random writes that happen to be adjacent would go
# as one 256 KiB request, one write from the kernel fewer (a CI run saw 766).
echo 2 >"/sys/block/${dev#/dev/}/queue/nomerges"
fio --name=big --filename="$dev" --ioengine=io_uring --direct=1 --rw=randwrite --bs=128k \
  --iodepth=8 --offset=32M --size=96M --verify=crc32c --verify_fatal=1 --do_verify=1 \
  --output=/tmp/fio-f2.txt || { cat /tmp/fio-f2.txt; vm_fail "fio verify, 128 KiB"; }
writes=$(vm_json_field kernel_buffer_writes)
echo "file: kernel_buffer_writes $writes"
[ "$writes" -ge 768 ] || vm_fail "128 KiB writes: $writes from the kernel, expected at least 768"
vm_expect_eq "kernel_buffer_errors" "$(vm_json_field kernel_buffer_errors)" 0
softblk del f1

vm_step "file target, zero copy measured: writes with others in flight go zero copy"
vm_add_ublk f3 file path=$fs/f3.img size=64M create=1 --bs 4096 --export-opt user_copy=1
# 4 KiB writes at QD 32: whatever the queue measured for a lone write,
# one that finds others in flight is not copied (copy_chooser.hpp).
fio --name=deep --filename="$dev" --ioengine=io_uring --direct=1 --rw=randwrite --bs=4k \
  --iodepth=32 --size=64M --io_size=8M --verify=crc32c --verify_fatal=1 --do_verify=1 \
  --output=/tmp/fio-f3.txt || { cat /tmp/fio-f3.txt; vm_fail "fio verify, 4 KiB at QD 32"; }
writes=$(vm_json_field kernel_buffer_writes)
echo "file, QD 32: kernel_buffer_writes $writes of 2048"
[ "$writes" -ge 1536 ] || vm_fail "4 KiB writes at QD 32: $writes of 2048 from the kernel, expected at least 1536"
vm_expect_eq "kernel_buffer_errors" "$(vm_json_field kernel_buffer_errors)" 0
softblk del f3

vm_step "file target, zero_copy=1 zero_copy_min=0: every write zero copy, $way"
vm_add_ublk f4 file path=$fs/f4.img size=64M create=1 --bs 4096 \
  --export-opt zero_copy=1 --export-opt zero_copy_min=0
vm_expect_eq "f4 zero_copy_way" "$(zc_way)" "$way"
echo 2 >"/sys/block/${dev#/dev/}/queue/nomerges"
fio --name=mixed --filename="$dev" --ioengine=io_uring --direct=1 --rw=randwrite \
  --bsrange=4k-128k --iodepth=16 --offset=16M --size=48M --io_size=16M --verify=crc32c \
  --verify_fatal=1 --do_verify=1 --output=/tmp/fio-f4.txt ||
  { cat /tmp/fio-f4.txt; vm_fail "fio verify, zero copy on every write"; }
write_known "$dev" $fs/f4.img $((16 << 20))
writes=$(vm_json_field kernel_buffer_writes)
registers=$(vm_json_field buffer_registers)
echo "f4: kernel_buffer_writes $writes buffer_registers $registers"
[ "${writes:-0}" -ge 16 ] || vm_fail "f4: $writes writes from the kernel, expected at least 16"
vm_expect_eq "f4 kernel_buffer_errors" "$(vm_json_field kernel_buffer_errors)" 0
if [ "$way" = auto_buf_reg ]; then
  vm_expect_eq "f4 buffer_registers (the kernel registers the pages)" "$registers" 0
else
  [ "$registers" -ge "$writes" ] || vm_fail "f4: $registers register entries for $writes writes"
fi
softblk del f4
check_image $fs/f4.img $((16 << 20))

vm_step "file target, zero_copy=1 auto_buf_reg=0: register entries"
vm_add_ublk f5 file path=$fs/f5.img size=64M create=1 --bs 4096 \
  --export-opt zero_copy=1 --export-opt zero_copy_min=0 --export-opt auto_buf_reg=0
vm_expect_eq "f5 zero_copy_way" "$(zc_way)" register_entries
echo 2 >"/sys/block/${dev#/dev/}/queue/nomerges"
fio --name=mixed --filename="$dev" --ioengine=io_uring --direct=1 --rw=randwrite \
  --bsrange=4k-128k --iodepth=16 --offset=16M --size=48M --io_size=16M --verify=crc32c \
  --verify_fatal=1 --do_verify=1 --output=/tmp/fio-f5.txt ||
  { cat /tmp/fio-f5.txt; vm_fail "fio verify, register entries"; }
write_known "$dev" $fs/f5.img $((16 << 20))
writes=$(vm_json_field kernel_buffer_writes)
registers=$(vm_json_field buffer_registers)
echo "f5: kernel_buffer_writes $writes buffer_registers $registers"
[ "${writes:-0}" -ge 16 ] || vm_fail "f5: $writes writes from the kernel, expected at least 16"
[ "$registers" -ge "$writes" ] || vm_fail "f5: $registers register entries for $writes writes"
vm_expect_eq "f5 kernel_buffer_errors" "$(vm_json_field kernel_buffer_errors)" 0
softblk del f5
check_image $fs/f5.img $((16 << 20))
if [ "$way" = auto_buf_reg ]; then
  # Refused with the reason where it cannot be.
  if softblk add file path=$fs/f6.img size=16M create=1 --name f6 --export ublk \
    --export-opt zero_copy=1 --export-opt auto_buf_reg=1 --export-opt shared_ring=0 \
    >/tmp/add-f6.txt 2>&1; then
    vm_fail "auto_buf_reg=1 with shared_ring=0 was accepted"
  fi
  grep -q "shared_ring=1" /tmp/add-f6.txt || vm_fail "refusal does not say why: $(cat /tmp/add-f6.txt)"
fi

vm_step "zero_copy=0, and zero_copy=1 where the target needs the bytes"
vm_add_ublk f2 file path=$fs/f2.img size=16M create=1 --bs 4096 \
  --export-opt user_copy=1 --export-opt zero_copy=0 --export-opt shared_ring=0
vm_expect_eq "zero_copy=0" "$(vm_json_field zero_copy)" false
vm_expect_eq "borrowed_rings with shared_ring=0" "$(vm_json_field borrowed_rings)" 0
softblk del f2
if softblk add null --name n1 --size 16M --memory-backed --export ublk --export-opt zero_copy=1 \
  >/tmp/add-n1.txt 2>&1; then
  vm_fail "zero_copy=1 on a memory-backed null device was accepted"
fi
grep -q "zero_copy=1" /tmp/add-n1.txt || vm_fail "refusal does not name zero_copy=1: $(cat /tmp/add-n1.txt)"
cat /tmp/add-n1.txt
echo "PASS"
