#!/bin/bash
# The device's queue choices on its ublk disk (docs/null.md, "no_sched";
# docs/ublk.md, "Scheduler and poll queues"):
#  - without no_sched a 1-queue /dev/ublkbN keeps the kernel's default
#    (mq-deadline on 6.12: ublk_drv does not ask for none);
#  - no_sched=1 gives /dev/ublkbN the scheduler none, `list` shows it,
#    and again after a power cycle (a new disk) and after a live restart
#    of the export (poll_queues changed while powered on);
#  - poll_queues=1 given to a ublk export: `add` says the disk has none
#    (ublk_drv makes one queue map and no .poll), the disk has the
#    submit_queues alone (mq/) and queue/io_poll 0; what a polled read
#    (fio --hipri) does there is shown.
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool softblk fio
modprobe ublk_drv || vm_skip "no ublk_drv in this kernel"
vm_wait_for /dev/ublk-control

export SOFTBLK_RUN_DIR=/tmp/softblk-run
cleanup() { softblk shutdown >/dev/null 2>&1 || true; }
trap cleanup EXIT

active() { sed -n 's/.*\[\(.*\)\].*/\1/p' "/sys/block/$1/queue/scheduler"; }
# The export's "scheduler" as the daemon shows it (get --json: one device).
listed_scheduler() {
  softblk get "$1" power --json | grep -o '"scheduler": *"[^"]*"' | sed -n '1s/.*: *"\(.*\)"/\1/p'
}

vm_step "without no_sched: the kernel's default"
vm_add_ublk a null --size 64M --bs 4096 --memory-backed --queues 1
da=${dev#/dev/}
cat "/sys/block/$da/queue/scheduler"
[ "$(active "$da")" = mq-deadline ] ||
  vm_fail "$da: expected the kernel's default for one queue (mq-deadline), got $(cat "/sys/block/$da/queue/scheduler")"
[ "$(listed_scheduler a)" = mq-deadline ] || vm_fail "list shows '$(listed_scheduler a)' for a"

vm_step "no_sched=1: none"
vm_add_ublk b null --size 64M --bs 4096 --memory-backed --queues 1 no_sched=1
db=${dev#/dev/}
cat "/sys/block/$db/queue/scheduler"
[ "$(active "$db")" = none ] || vm_fail "no_sched=1: $db has $(cat "/sys/block/$db/queue/scheduler")"
[ "$(listed_scheduler b)" = none ] || vm_fail "list shows '$(listed_scheduler b)' for b"
fio --name=rw --filename="$dev" --direct=1 --ioengine=io_uring --iodepth=8 --rw=randwrite --bs=4k \
  --size=8M --verify=crc32c --verify_fatal=1 --output-format=terse >/dev/null ||
  vm_fail "I/O on $dev with no_sched=1"

vm_step "power cycle: the new disk has none again"
softblk set b power=0
softblk set b power=1
dev=$(vm_softblk_device b) || vm_fail "b has no disk after power=1"
db=${dev#/dev/}
[ "$(active "$db")" = none ] || vm_fail "after the power cycle $db has $(cat "/sys/block/$db/queue/scheduler")"

vm_step "live restart of the export (poll_queues changed): none again"
softblk set b poll_queues=0
dev=$(vm_softblk_device b) || vm_fail "b has no disk after the restart"
db=${dev#/dev/}
[ "$(active "$db")" = none ] || vm_fail "after the restart $db has $(cat "/sys/block/$db/queue/scheduler")"

vm_step "poll_queues=1: not exported, and add says so"
vm_add_ublk c null --size 64M --bs 4096 --memory-backed --queues 1 poll_queues=1
dc=${dev#/dev/}
cat "/tmp/add-c.txt"
grep -q 'poll_queues=1 not exported: ublk has no poll queues' /tmp/add-c.txt ||
  vm_fail "add did not say that poll_queues=1 is not exported"
softblk list | grep '^c ' | grep -q 'poll_queues=1 not exported' || vm_fail "list does not say it"
[ "$(ls "/sys/block/$dc/mq" | wc -l)" = 1 ] ||
  vm_fail "$dc has $(ls "/sys/block/$dc/mq" | wc -l) hardware queues, expected the 1 submit queue"
[ "$(cat "/sys/block/$dc/queue/io_poll")" = 0 ] ||
  vm_fail "$dc: io_poll $(cat "/sys/block/$dc/queue/io_poll")"
# What a polled read does on a disk without poll queues (Linux 6.12's
# submit_bio_noacct fails REQ_POLLED bios without BLK_FEAT_POLL: EOPNOTSUPP).
if out=$(fio --name=hipri --filename="$dev" --direct=1 --ioengine=io_uring --hipri=1 --rw=randread \
  --bs=4k --size=4M --output-format=terse 2>&1); then
  echo "polled read on $dev: completed (not polled: io_poll 0)"
else
  echo "polled read on $dev: failed: $(echo "$out" | grep -io 'operation not supported\|err=[ 0-9]*' | head -n1)"
fi
# Without poll_queues given (the default 1), add says nothing of it.
vm_add_ublk d null --size 16M --bs 4096 --memory-backed --queues 1
if grep -q 'not exported' "/tmp/add-d.txt"; then vm_fail "add warns without poll_queues given"; fi

softblk del a
softblk del b
softblk del c
softblk del d
echo PASS
