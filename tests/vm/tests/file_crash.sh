#!/bin/bash
# Crash consistency of the file target over ublk: in each of 20 rounds a
# writer (softblk-crash-writer) writes 4 KiB blocks to the device and
# flushes every 8 writes, recording what was acknowledged and what was
# flushed; the daemon is killed with SIGKILL at a random moment (0.3 to
# 1.5 s in); the image file is then read directly and every write that
# was acknowledged and flushed must be there, whole. The next round's
# daemon re-opens the same image (`softblk recover`) and the writer goes on
# where it stopped, so each check covers every earlier round too.
#
# What this proves: the daemon never acknowledges a write or a flush it has
# not done. The guest kernel survives the kill (its page cache with it);
# losing power is a different test (docs/file.md says what FLUSH promises).
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool softblk softblk-crash-writer mkfs.ext4
modprobe ublk_drv || vm_skip "no ublk_drv in this kernel"
vm_wait_for /dev/ublk-control
vm_require_module brd rd_nr=1 rd_size=786432

export SOFTBLK_RUN_DIR=/tmp/softblk-run
vm_writer_pid=
cleanup() {
  [ -n "$vm_writer_pid" ] && kill -9 "$vm_writer_pid" 2>/dev/null
  softblk del --all >/dev/null 2>&1 || true
  softblk shutdown >/dev/null 2>&1 || true
  umount /mnt/data 2>/dev/null || true
}
trap cleanup EXIT

mkfs.ext4 -q -F /dev/ram0
mkdir -p /mnt/data
mount /dev/ram0 /mnt/data
img=/mnt/data/crash.img
log=/tmp/writes.log
blocks=65536  # 256 MiB of 4 KiB blocks
rounds=${ROUNDS:-20}
: >"$log"

softblk add file "path=$img" size=256M create=1 --name c0 --queues 2 --depth 32 | tee /tmp/add.txt
# Each softblk command costs about a second under TCG: the device is
# taken from the listing that shows it back after a recover.
dev=$(grep -o '/dev/ublkb[0-9]*' /tmp/add.txt | head -n1)
for round in $(seq "$rounds"); do
  vm_step "round $round"
  [ -n "$dev" ] && [ -b "$dev" ] || vm_fail "round $round: no device ($(softblk list))"
  vm_kill_under_writer "$dev" "$log" $blocks
  softblk-crash-writer check "$img" "$log" $blocks || vm_fail "round $round: an acknowledged and flushed write is missing"
  # The next daemon re-opens the image from the state file.
  softblk recover >/dev/null 2>&1 || true
  dev=$(vm_softblk_device c0) || dev=
done
flushes=$(grep -c '^F' "$log")
[ "$flushes" -ge "$rounds" ] || vm_fail "only $flushes flushes in $rounds rounds: the writer hardly ran"
echo "PASS: $rounds rounds, $(grep -c '^W' "$log") writes, $flushes flushes"
