#!/bin/bash
# A ublk disk follows its device's size (issue 16): a file device over ublk
# is resized with `softblk set NAME size=...` (the file target's live size).
#  - Where the kernel has UBLK_F_UPDATE_SIZE (Linux 6.16+: the backports
#    kernel): grown, /dev/ublkbN's size (blockdev --getsize64) follows at
#    once, a write at the new end reads back, the data before the old end
#    is intact, `softblk list --json` shows the kernel's size; shrunk, the
#    size follows and a write at the new end fails with ENOSPC.
#  - Where it lacks it (6.12): the disk keeps its size, `softblk list` shows
#    the device's new size with a warning that the disk kept its own, the
#    daemon's log says once why (naming the kernel), and after a shrink a
#    read beyond the device's end fails with an I/O error while one inside
#    it works.
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool softblk blockdev dd cmp
modprobe ublk_drv || vm_skip "no ublk_drv in this kernel"
vm_wait_for /dev/ublk-control

export SOFTBLK_RUN_DIR=/tmp/softblk-run
cleanup() {
  softblk shutdown >/dev/null 2>&1 || true
}
trap cleanup EXIT

mib=$((1 << 20))
blocks_per_mib=256 # 4 KiB blocks
size_of() { blockdev --getsize64 "$1"; }
kernel_size_json() {
  softblk list --json | grep -o '"kernel_capacity_bytes": [0-9]*' | grep -o '[0-9]*$'
}

softblk features >/tmp/features.txt
if grep -q 'UPDATE_SIZE' /tmp/features.txt; then
  update_size=1
else
  update_size=0
fi
echo "kernel $(uname -r): UPDATE_SIZE $update_size"

vm_step "a 64 MiB file device over ublk"
softblk add file path=/tmp/r0.img size=64M create=1 --bs 4096 --name r0 --export ublk | tee /tmp/add.txt
dev=$(grep -o '/dev/ublkb[0-9]*' /tmp/add.txt | head -n1)
[ -b "$dev" ] || vm_fail "add printed no /dev/ublkbN"
vm_expect_eq "disk size after add" "$(size_of "$dev")" $((64 * mib))
dd if=/dev/urandom of=/tmp/old-end bs=4096 count=1 status=none
dd if=/tmp/old-end of="$dev" bs=4096 seek=$((64 * blocks_per_mib - 1)) oflag=direct conv=notrunc status=none

vm_step "grow to 128 MiB"
softblk set r0 size=128M
softblk list | tee /tmp/list.txt
grep -q '^r0 .* 128\.0 MiB ' /tmp/list.txt || vm_fail "softblk list does not show the device's 128 MiB"

if [ "$update_size" = 1 ]; then
  vm_expect_eq "disk size after growing" "$(size_of "$dev")" $((128 * mib))
  vm_expect_eq "kernel_capacity_bytes" "$(kernel_size_json)" $((128 * mib))
  dd if=/dev/urandom of=/tmp/new-end bs=4096 count=1 status=none
  dd if=/tmp/new-end of="$dev" bs=4096 seek=$((128 * blocks_per_mib - 1)) oflag=direct conv=notrunc status=none ||
    vm_fail "write at the new end failed"
  dd if="$dev" of=/tmp/new-end.back bs=4096 skip=$((128 * blocks_per_mib - 1)) count=1 iflag=direct status=none
  cmp /tmp/new-end /tmp/new-end.back || vm_fail "the new end did not read back"
  dd if="$dev" of=/tmp/old-end.back bs=4096 skip=$((64 * blocks_per_mib - 1)) count=1 iflag=direct status=none
  cmp /tmp/old-end /tmp/old-end.back || vm_fail "the old end's data changed"
  echo "ok: $dev grew to 128 MiB, I/O at the new end works"

  vm_step "shrink to 32 MiB"
  softblk set r0 size=32M
  vm_expect_eq "disk size after shrinking" "$(size_of "$dev")" $((32 * mib))
  # At the new end itself (beyond it even the seek is refused): the write
  # reaches the block layer, which refuses it.
  if dd if=/tmp/old-end of="$dev" bs=4096 seek=$((32 * blocks_per_mib)) oflag=direct conv=notrunc status=none 2>/tmp/dd.err; then
    vm_fail "a write at the shrunk disk's end succeeded"
  fi
  echo "refused as expected: $(cat /tmp/dd.err)"
  grep -q 'No space left on device' /tmp/dd.err || vm_fail "the write at the end did not fail with ENOSPC"
  dd if="$dev" of=/dev/null bs=4096 skip=$((32 * blocks_per_mib - 1)) count=1 iflag=direct status=none ||
    vm_fail "a read of the shrunk disk's last block failed"
  n=$(grep -c 'resized to [0-9]* bytes (UPDATE_SIZE)' "$SOFTBLK_RUN_DIR/daemon.log" || true)
  vm_expect_eq "UPDATE_SIZE lines in the daemon's log" "$n" 2
else
  vm_expect_eq "disk size after growing (no UPDATE_SIZE)" "$(size_of "$dev")" $((64 * mib))
  vm_expect_eq "kernel_capacity_bytes" "$(kernel_size_json)" $((64 * mib))
  grep -q "^r0 .*$dev keeps $((64 * mib)) bytes: kernel $(uname -r) lacks UBLK_F_UPDATE_SIZE" /tmp/list.txt ||
    vm_fail "softblk list does not say that the disk kept its size"
  vm_step "shrink to 32 MiB: beyond the device's end, I/O errors"
  softblk set r0 size=32M
  vm_expect_eq "disk size after shrinking (no UPDATE_SIZE)" "$(size_of "$dev")" $((64 * mib))
  if dd if="$dev" of=/dev/null bs=4096 skip=$((48 * blocks_per_mib)) count=1 iflag=direct status=none 2>/tmp/dd.err; then
    vm_fail "a read beyond the device's end succeeded"
  fi
  echo "failed as expected: $(cat /tmp/dd.err)"
  dd if="$dev" of=/dev/null bs=4096 skip=$((32 * blocks_per_mib - 1)) count=1 iflag=direct status=none ||
    vm_fail "a read inside the device failed"
  n=$(grep -c 'lacks UBLK_F_UPDATE_SIZE' "$SOFTBLK_RUN_DIR/daemon.log" || true)
  vm_expect_eq "log lines saying why the disk keeps its size" "$n" 1
  grep "lacks UBLK_F_UPDATE_SIZE" "$SOFTBLK_RUN_DIR/daemon.log"
  grep -q "this kernel ($(uname -r))" "$SOFTBLK_RUN_DIR/daemon.log" || vm_fail "the log does not name the kernel"
fi

vm_step "del"
softblk del r0
[ ! -e "$dev" ] || vm_fail "$dev still there after del"
echo "ok"
