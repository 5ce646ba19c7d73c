#!/usr/bin/env bash
# no_sched=1 reaches the loop device of a FUSE export (docs/null.md,
# "no_sched"): its I/O scheduler is "none" after every power on, whatever
# it was before; the scheduler it had comes back when the export stops, and
# without no_sched the disk keeps the one it has. Loop devices default to
# "none" (BLK_MQ_F_NO_SCHED_BY_DEFAULT), so the test first gives the loop
# device mq-deadline by hand, as a kernel or udev rule might.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib_fuse.sh"
require_host losetup python3
[ -n "${SOFTBLK_CLI:-}" ] || skip "needs the CLI's daemon (SOFTBLK_CLI): power cycles go through set"
start_daemon

# The schedulers this test changed, put back on exit (other tests share
# the pool of loop devices).
declare -A saved=()
restore_schedulers() {
    local d
    for d in "${!saved[@]}"; do echo "${saved[$d]}" >"/sys/block/$d/queue/scheduler" 2>/dev/null; done
}
trap 'rc=$?; restore_schedulers; (exit $rc); cleanup_host' EXIT

active() { sed -n 's/.*\[\(.*\)\].*/\1/p' "/sys/block/$1/queue/scheduler"; }
set_active() {
    local d=$1 s=$2
    [ -n "${saved[$d]:-}" ] || saved[$d]=$(active "$d")
    echo "$s" >"/sys/block/$d/queue/scheduler"
}
loop_of() { # the export's loop device as listed, e.g. loop3
    "$SOFTBLK_CLI" list --json | python3 -c '
import json, sys
for d in json.load(sys.stdin):
    if d["name"] == sys.argv[1]:
        print(d.get("export", {}).get("loop", "").removeprefix("/dev/"))' "$1"
}
listed_scheduler() {
    "$SOFTBLK_CLI" list --json | python3 -c '
import json, sys
for d in json.load(sys.stdin):
    if d["name"] == sys.argv[1]:
        print(d.get("export", {}).get("scheduler", ""))' "$1"
}
cli() { "$SOFTBLK_CLI" "$@" >/dev/null || fail "softblk $*"; }

cli add null size=16 memory_backed=1 --export fuse --name s
loop=$(loop_of s)
[ -n "$loop" ] || fail "no loop device listed for s"
grep -qw mq-deadline "/sys/block/$loop/queue/scheduler" ||
    skip "the loop driver here offers no mq-deadline: $(cat "/sys/block/$loop/queue/scheduler")"
note "without no_sched: $loop keeps the scheduler it has ($(active "$loop"), then mq-deadline)"
set_active "$loop" mq-deadline
[ "$(listed_scheduler s)" = mq-deadline ] || fail "list shows scheduler '$(listed_scheduler s)'"

note "no_sched=1, powered on again: the loop device the export gets has none"
cli set s power=0
cli set s no_sched=1
# The loop device comes from LOOP_CTL_GET_FREE: normally the one just
# freed, which has mq-deadline; another test may take it meanwhile, then
# the next one gets mq-deadline and the device is cycled again.
for try in 1 2 3 4 5; do
    set_active "$loop" mq-deadline
    cli set s power=1
    now=$(loop_of s)
    [ "$now" = "$loop" ] && break
    cli set s power=0
    loop=$now
done
[ "$now" = "$loop" ] || fail "never got the prepared loop device back (last $now)"
[ "$(active "$loop")" = none ] ||
    fail "no_sched=1: $loop has scheduler '$(active "$loop")', expected none ($(cat "/sys/block/$loop/queue/scheduler"))"
[ "$(listed_scheduler s)" = none ] || fail "list shows scheduler '$(listed_scheduler s)'"
# Data still flows (the scheduler change is not a new disk).
head -c $((1 << 20)) /dev/urandom >"$RUN_DIR/data"
dd if="$RUN_DIR/data" of="/dev/$loop" bs=64k oflag=direct status=none
cmp -n $((1 << 20)) "$RUN_DIR/data" "/dev/$loop" || fail "data through /dev/$loop"

note "power off: the loop device gets its mq-deadline back"
cli set s power=0
[ "$(active "$loop")" = mq-deadline ] ||
    fail "after power=0, $loop has '$(active "$loop")', expected mq-deadline back"

note "a live restart of the export (submit_queues) applies no_sched again"
cli set s power=1
now=$(loop_of s)
set_active "$now" mq-deadline
cli set s submit_queues=1 poll_queues=0
now=$(loop_of s)
[ "$(active "$now")" = none ] || fail "after the export's restart, $now has '$(active "$now")'"

note "no_sched=0 again: the disk keeps what it has"
cli set s power=0
cli set s no_sched=0
for try in 1 2 3 4 5; do
    set_active "$loop" mq-deadline
    cli set s power=1
    now=$(loop_of s)
    [ "$now" = "$loop" ] && break
    cli set s power=0
    loop=$now
done
[ "$now" = "$loop" ] || fail "never got the prepared loop device back (last $now)"
[ "$(active "$loop")" = mq-deadline ] || fail "no_sched=0: $loop has '$(active "$loop")'"

cli del s
[ -z "$(leftovers)" ] || fail "left behind: $(leftovers)"
echo PASS
