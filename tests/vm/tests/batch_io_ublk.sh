#!/bin/bash
# ublk's batched commands (UBLK_F_BATCH_IO, export option batch_io=1; the
# backports kernel has them, 6.12 does not): requests arrive as lists of
# tags from one multishot fetch and results go back in lists; with
# AUTO_BUF_REG a write's pages are in the queue's ring as it arrives, and a
# zero-copy write carries its commit linked after it, so the kernel
# completes the request where the write completed.
#  - zloop: the export says batch_io and zero_copy; fio --zonemode=zbd with
#    crc32c verify over writes of 4 KiB to 512 KiB; writes ended by their
#    linked commit (linked_commits), no error; conventional zones read back;
#    blkzone reset and finish through the batched commits; removed and
#    added again without batch_io: the same write pointers and contents.
#  - file target: random writes and reads at QD 32 with verify.
#  - null target (no file ring: nothing linked): verify.
#  - batch_io=1 with recovery=recover, or user_copy=0, is refused with the
#    reason.
# Where the kernel lacks UBLK_F_BATCH_IO the test skips with the reason.
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

vm_step "zloop over ublk, batch_io=1"
mkdir -p $fs/zl/0
zl="base_dir=$fs/zl id=0 capacity_mb=256 zone_size_mb=16 conv_zones=2"
# shellcheck disable=SC2086
if ! softblk add zloop $zl --name zl --export ublk --export-opt batch_io=1 >/tmp/add-zl.txt 2>&1; then
  cat /tmp/add-zl.txt
  grep -q "lacks UBLK_F_BATCH_IO" /tmp/add-zl.txt &&
    vm_skip "kernel $(uname -r): no UBLK_F_BATCH_IO ($(head -n1 /tmp/add-zl.txt))"
  vm_fail "add zl with batch_io=1"
fi
dev=$(grep -o '/dev/ublkb[0-9]*' /tmp/add-zl.txt | head -n1)
vm_expect_eq "export batch_io" "$(vm_json_field batch_io)" true
vm_expect_eq "export zero_copy" "$(vm_json_field zero_copy)" true
fio --name=bt --filename="$dev" --ioengine=io_uring --direct=1 --zonemode=zbd --rw=randwrite \
  --bsrange=4k-512k --iodepth=16 --size=192M --io_size=96M --verify=crc32c --verify_fatal=1 \
  --do_verify=1 --output=/tmp/fio-zl.txt || { cat /tmp/fio-zl.txt; vm_fail "fio verify on zloop"; }
linked=$(vm_json_field linked_commits)
echo "zloop: linked_commits $linked kernel_buffer_writes $(vm_json_field kernel_buffer_writes)"
[ "${linked:-0}" -gt 0 ] || vm_fail "no write was ended by its linked commit"
vm_expect_eq "errors" "$(vm_json_field errors)" 0
vm_expect_eq "kernel_buffer_errors" "$(vm_json_field kernel_buffer_errors)" 0
dd if=/dev/urandom of=/tmp/conv bs=1M count=4 status=none
dd if=/tmp/conv of="$dev" bs=1M oflag=direct status=none
dd if="$dev" of=/tmp/conv.back bs=1M count=4 iflag=direct status=none
cmp /tmp/conv /tmp/conv.back || vm_fail "conventional zone read back differs"
# Zone management, committed in lists: the third zone reset, the fourth
# finished (16 MiB zones: sectors 0x10000 and 0x18000).
blkzone reset -o 0x10000 -c 1 "$dev"
blkzone finish -o 0x18000 -c 1 "$dev"
blkzone report -o 0x10000 -c 2 "$dev" | tee /tmp/z2.txt
grep -q 'wptr 0x000000 .*zcond: *1(' <(head -n1 /tmp/z2.txt) || vm_fail "reset zone not empty"
grep -q 'zcond:14(' <(tail -n1 /tmp/z2.txt) || vm_fail "finished zone not full"
blkzone report "$dev" >/tmp/zones-before.txt
sum_before=$(dd if="$dev" bs=1M iflag=direct status=none | md5sum)
softblk del zl
vm_zloop_check_files /tmp/zones-before.txt $fs/zl/0

vm_step "the same directory without batch_io: the data verifies"
# shellcheck disable=SC2086
vm_add_ublk zl2 zloop $zl
diff <(sed 's/zcond.*//' /tmp/zones-before.txt) <(blkzone report "$dev" | sed 's/zcond.*//') ||
  vm_fail "write pointers differ after re-adding"
vm_expect_eq "the device's contents (md5) after re-adding" \
  "$(dd if="$dev" bs=1M iflag=direct status=none | md5sum)" "$sum_before"
softblk del zl2

vm_step "file target, batch_io=1: random writes and reads at QD 32"
vm_add_ublk f1 file path=$fs/f1.img size=64M create=1 --bs 4096 --export-opt batch_io=1
fio --name=rw --filename="$dev" --ioengine=io_uring --direct=1 --rw=randrw --bsrange=4k-128k \
  --iodepth=32 --size=64M --io_size=32M --verify=crc32c --verify_fatal=1 --do_verify=1 \
  --output=/tmp/fio-f1.txt || { cat /tmp/fio-f1.txt; vm_fail "fio verify on the file target"; }
linked=$(vm_json_field linked_commits)
echo "file: linked_commits $linked"
[ "${linked:-0}" -gt 0 ] || vm_fail "no write was ended by its linked commit"
vm_expect_eq "errors" "$(vm_json_field errors)" 0
softblk del f1

vm_step "null target, batch_io=1"
vm_add_ublk n1 null --size 64M --memory-backed --export-opt batch_io=1
fio --name=n --filename="$dev" --ioengine=io_uring --direct=1 --rw=randrw --bs=4k --iodepth=32 \
  --size=64M --io_size=16M --verify=crc32c --verify_fatal=1 --do_verify=1 \
  --output=/tmp/fio-n1.txt || { cat /tmp/fio-n1.txt; vm_fail "fio verify on the null target"; }
vm_expect_eq "linked_commits (no file ring)" "$(vm_json_field linked_commits)" 0
vm_expect_eq "errors" "$(vm_json_field errors)" 0
softblk del n1

vm_step "refusals"
for opts in "recovery=recover" "user_copy=0"; do
  if softblk add null --name n2 --size 16M --export ublk --export-opt batch_io=1 \
    --export-opt "$opts" >/tmp/add-n2.txt 2>&1; then
    vm_fail "batch_io=1 with $opts was accepted"
  fi
  grep -q "batch_io=1" /tmp/add-n2.txt || vm_fail "refusal does not name batch_io=1: $(cat /tmp/add-n2.txt)"
  cat /tmp/add-n2.txt
done
echo "PASS"
