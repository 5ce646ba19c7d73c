#!/bin/bash
# softblk's configfs-shaped tree against the kernel's null_blk configfs:
# the same shell session (tests/cli/nullb_script.sh: mkdir, attribute
# writes and reads, power cycles with data and bad blocks, the
# fault-injection directories, rmdir) runs against
# /sys/kernel/config/nullb and against `softblk nullb mount` (ublk
# export); the two transcripts (every read, every write's errno, every
# data check) must be equal, and the kernel's must be the one the host
# test expects (tests/cli/nullb_expected.txt). A device with 8 KiB blocks
# is refused by the ublk export with an error naming its limit; a power
# cycle through `softblk set` brings the same /dev/ublkbN back with the data.
# The attribute table tests/cli/nullb_limits.tsv (every attribute at and
# beyond its limits) runs against the kernel's configfs, which must give
# the table's results; a device deeper than ublk's 4096 tags gets 4096.
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool softblk dd cmp diff
files=/softblk-vm/files
modprobe null_blk nr_devices=0 || vm_skip "no null_blk in this kernel"
modprobe ublk_drv || vm_skip "no ublk_drv in this kernel"
modprobe fuse 2>/dev/null || true
[ -c /dev/fuse ] || vm_skip "no /dev/fuse"
vm_wait_for /dev/ublk-control

export SOFTBLK_RUN_DIR=/tmp/softblk-run
tree=/tmp/nullb
cleanup() {
  softblk nullb umount "$tree" >/dev/null 2>&1 || true
  softblk shutdown --force >/dev/null 2>&1 || true
}
trap cleanup EXIT

# A kernel without CONFIG_BLK_DEV_NULL_BLK_FAULT_INJECTION has no
# timeout_inject/ directories: both sides then leave them out.
flags=
mkdir /sys/kernel/config/nullb/probe
[ -d /sys/kernel/config/nullb/probe/timeout_inject ] || flags=--no-faults
rmdir /sys/kernel/config/nullb/probe
echo "kernel $(uname -r), fault injection: ${flags:-yes}"

vm_step "the session against the kernel's configfs"
sh "$files/nullb_script.sh" /sys/kernel/config/nullb k0 $flags >/tmp/kernel.txt 2>&1 || true
cat /tmp/kernel.txt

vm_step "the same session against softblk's tree"
mkdir -p "$tree"
softblk nullb mount "$tree" || vm_fail "softblk nullb mount failed"
sh "$files/nullb_script.sh" "$tree" s0 $flags >/tmp/softblk.txt 2>&1 || true

vm_step "the transcripts"
diff -u /tmp/kernel.txt /tmp/softblk.txt || vm_fail "softblk's tree differs from the kernel's configfs"
# Without fault injection the expected transcript loses that section.
if [ -n "$flags" ]; then
  sed '/^== fault injection/,/^== power off and rmdir/{/^== power off and rmdir/!d;}' \
    "$files/nullb_expected.txt" >/tmp/expected.txt
else
  cp "$files/nullb_expected.txt" /tmp/expected.txt
fi
diff -u /tmp/expected.txt /tmp/kernel.txt ||
  vm_fail "the kernel's transcript is not tests/cli/nullb_expected.txt"
echo "ok: the kernel's configfs and softblk's tree give the same transcript"

vm_step "the attribute table (tests/cli/nullb_limits.tsv) against the kernel"
# Every attribute at and beyond its limits: the kernel must give the
# table's errno and value read back (its own column where docs/null.md
# records a difference). max_sectors below a page makes the block layer
# WARN (blk_validate_limits) as it refuses: that warning, and only it, is
# expected.
sh "$files/nullb_limits.sh" "$files/nullb_limits.tsv" tree /sys/kernel/config/nullb --kernel $flags ||
  vm_fail "the kernel's configfs does not give the table's results"
# (CMake passes --env SOFTBLK_VM_ALLOW_KERNEL_WARNINGS=1 for that warning;
# this script checks at its end that there is no other.)

vm_step "a power cycle through softblk set keeps the data and /dev/ublkbN"
# A device before it and gone by the power cycle frees a lower id: u0
# must come back with its own, not the lowest free one.
softblk add null size=16 --name first >/dev/null || vm_fail "add first"
softblk add null size=16 memory_backed=1 bs=4096 --name u0 >/tmp/add.txt || vm_fail "add u0"
dev=$(grep -o '/dev/ublkb[0-9]*' /tmp/add.txt | head -n1)
[ -b "$dev" ] || vm_fail "add printed no /dev/ublkbN: $(cat /tmp/add.txt)"
softblk del first >/dev/null || vm_fail "del first"
dd if=/dev/urandom of=/tmp/u0.data bs=4096 count=64 2>/dev/null
dd if=/tmp/u0.data of="$dev" bs=4096 oflag=direct 2>/dev/null || vm_fail "write to $dev"
softblk set u0 power=0 >/dev/null || vm_fail "power=0"
softblk set u0 power=1 >/dev/null || vm_fail "power=1"
again=$(softblk get u0 power --json | grep -o '/dev/ublkb[0-9]*' | head -n1)
vm_expect_eq "device after the power cycle" "$again" "$dev"
vm_wait_for "$dev"
dd if="$dev" of=/tmp/u0.back bs=4096 count=64 iflag=direct 2>/dev/null || vm_fail "read $dev"
cmp /tmp/u0.data /tmp/u0.back || vm_fail "the data did not survive the power cycle"
echo "ok: $dev came back with the same data"
softblk del u0 >/dev/null

vm_step "hw_queue_depth above ublk's 4096 tags: reduced, the attribute keeps its value"
softblk add null size=16 hw_queue_depth=10241 --name deep >/dev/null || vm_fail "hw_queue_depth=10241 refused"
vm_expect_eq "hw_queue_depth read back" "$(softblk get deep hw_queue_depth)" 10241
# grep -q on a pipe ends the writer early; with pipefail that reads as no
# match. Here-strings hand grep the whole output instead.
grep -q '"depth": 4096' <<<"$(softblk list --json)" || vm_fail "the ublk export does not have 4096 tags: $(softblk list --json)"
softblk del deep >/dev/null

vm_step "a block larger than ublk carries: refused by ublk naming the limit, another default"
if msg=$(softblk add null size=16 bs=8192 --name big --export ublk 2>&1); then
  vm_fail "bs=8192 exported through ublk: $msg"
fi
echo "$msg"
echo "$msg" | grep -q "at most 4096 bytes" || vm_fail "the error does not name ublk's limit"
# Without --export the default is chosen per device from what can carry
# it (docs/reliability.md "The default export carries the device").
msg=$(softblk add null size=16 bs=8192 --name big 2>&1) || vm_fail "bs=8192 with the default export: $msg"
echo "$msg"
echo "$msg" | grep -q "export type: ublk" && vm_fail "the default export for bs=8192 is ublk"
softblk del big || vm_fail "del big"

# The table's max_sectors rows make blk_validate_limits WARN (expected, and
# allowed through --env); any other kernel problem fails the test.
kmsg=$(dmesg)
if [[ -n $(grep 'WARNING:' <<<"$kmsg" | grep -v 'blk-settings.c') ]] ||
  grep -qE '(BUG:|Oops|general protection fault|UBSAN:|KASAN:)' <<<"$kmsg"; then
  grep -E -A5 '(WARNING:|BUG:|Oops|general protection fault|UBSAN:|KASAN:)' <<<"$kmsg" | tail -40
  vm_fail "a kernel problem other than blk_validate_limits' warning"
fi
