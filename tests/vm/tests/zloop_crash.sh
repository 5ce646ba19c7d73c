#!/bin/bash
# Crash consistency of the zloop target over ublk: in each round a writer
# (softblk-crash-writer ... sequential) writes 4 KiB blocks one after the
# other at the write pointer, filling the zones in order, and flushes every
# 8 writes, recording what was acknowledged and what was flushed; the
# daemon is killed with SIGKILL at a random moment (0.3 to 1.5 s in), and
# `softblk recover` starts it again on the same zone files. Then:
#  - every write that was acknowledged and flushed reads back whole through
#    the restarted device (so each check covers the earlier rounds too);
#  - the zones are consistent: the report of the restarted device matches
#    the zone files (a sequential zone's write pointer is its file's size,
#    a full zone's file holds its capacity), no zone is left open (open
#    zones come back closed), and every zone below the one being written is
#    full.
# The zone files are on the guest's tmpfs, as in zloop_kernel.sh, or with
# ZONE_FS=xfs on XFS on a RAM disk, where they are preallocated. The
# guest kernel survives the kill (its page cache with it): what this proves
# is that the daemon never acknowledges a write or flush it has not done
# and that a restart rebuilds the zones from the files.
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool softblk softblk-crash-writer blkzone
modprobe ublk_drv || vm_skip "no ublk_drv in this kernel"
vm_wait_for /dev/ublk-control

export SOFTBLK_RUN_DIR=/tmp/softblk-run
vm_writer_pid=
cleanup() {
  [ -n "$vm_writer_pid" ] && kill -9 "$vm_writer_pid" 2>/dev/null
  softblk del --all >/dev/null 2>&1 || true
  softblk shutdown >/dev/null 2>&1 || true
  vm_zone_fs_cleanup
}
trap cleanup EXIT

vm_zone_fs_root "${ZONE_FS:-tmpfs}"
dir=$zone_root/zl
mkdir -p $dir/0
log=/tmp/writes.log
zone_mb=8
blocks=$((512 * 256))  # 512 MiB of 4 KiB blocks
rounds=${ROUNDS:-6}
: >"$log"

# EXPORT_OPTS: ublk export options, as "batch_io=1" (each word one option).
export_args=()
for o in ${EXPORT_OPTS:-}; do export_args+=(--export-opt "$o"); done
softblk add zloop --name zc base_dir=$dir id=0 capacity_mb=512 zone_size_mb=$zone_mb conv_zones=0 \
  nr_queues=2 queue_depth=32 "${export_args[@]}" | tee /tmp/add.txt
if [[ " ${EXPORT_OPTS:-} " == *" batch_io=1 "* ]]; then
  # (grep without -q reads it all: an early exit would fail the pipe.)
  softblk list --json | grep '"batch_io": *true' >/dev/null || vm_fail "the export is not batched"
fi
if [ "${ZONE_FS:-tmpfs}" = xfs ]; then
  vm_expect_eq "prealloc on XFS" "$(vm_json_field prealloc)" true
fi
# Each softblk command costs about a second under TCG: the device is
# taken from the listing that shows it back after a recover.
dev=$(grep -o '/dev/ublkb[0-9]*' /tmp/add.txt | head -n1)
for round in $(seq "$rounds"); do
  vm_step "round $round"
  [ -n "$dev" ] && [ -b "$dev" ] || vm_fail "round $round: no device ($(softblk list))"
  vm_kill_under_writer "$dev" "$log" $blocks sequential
  vm_step "round $round: recover and check"
  # The next daemon re-opens the zone files from the state file.
  softblk recover >/dev/null 2>&1 || true
  dev=$(vm_softblk_device zc) || dev=
  [ -n "$dev" ] && [ -b "$dev" ] || vm_fail "round $round: not back after recover ($(softblk list))"
  softblk-crash-writer check "$dev" "$log" $blocks sequential ||
    vm_fail "round $round: an acknowledged and flushed write is missing"
  blkzone report "$dev" >/tmp/report.txt
  if grep -E 'zcond: *[23]\(' /tmp/report.txt; then vm_fail "round $round: open zones after the restart"; fi
  vm_zloop_check_files /tmp/report.txt $dir/0 >/dev/null
  # Zones fill in order: the first not full is the one being written, the
  # rest are empty.
  conds=$(sed -n 's/.*zcond: *\([0-9]*\).*/\1/p' /tmp/report.txt | tr '\n' ' ')
  echo "$conds" | grep -qE '^(14 )*((4|1) )?(1 )*$' ||
    vm_fail "round $round: zone conditions out of order: $conds"
  # Writes that landed unacknowledged may have moved the write pointer past
  # the log: the next round starts at it.
  wp=0
  while read -r len wptr cond; do
    if [ "$cond" = 14 ]; then wp=$((wp + 0x$len / 8)); else wp=$((wp + 0x$wptr / 8)); fi
  done < <(sed -n 's/.*len 0x\([0-9a-f]*\),.*wptr 0x\([0-9a-f]*\) .*zcond: *\([0-9]*\).*/\1 \2 \3/p' /tmp/report.txt)
  echo "S $wp" >>"$log"
done
flushes=$(grep -c '^F' "$log")
[ "$flushes" -ge "$rounds" ] || vm_fail "only $flushes flushes in $rounds rounds: the writer hardly ran"
echo "PASS: $rounds rounds, $(grep -c '^W' "$log") writes, $flushes flushes"
