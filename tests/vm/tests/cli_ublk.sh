#!/bin/bash
# The `softblk` command with ublk, end to end, as a user would run it:
#  - `softblk features` names the ublk feature bits the kernel reports and
#    calls ublk the default export;
#  - `softblk add` (no --export) makes a ublk device and prints /dev/ublkbN;
#  - `softblk list` shows the kernel's state (LIVE), the daemon's pid, the
#    queues and the depth;
#  - kill -9 of the daemon while fio runs on a recovery=reissue device: the
#    disk stays, `softblk list` starts a new daemon, which re-attaches the
#    device from its state file (no command line, no SET_PARAMS), and fio
#    finishes without an error; the device then verifies;
#  - queue_affinity=1 on a device of 2 queues: `softblk list --json` gives
#    each queue the CPUs the kernel's blk-mq map sends to it
#    (/sys/block/ublkbN/mq/Q/cpu_list), and the daemon has a thread pinned
#    to each; without it (the default) no queue is pinned; reads from one
#    CPU count in its queue's `queue_requests` alone; queue_affinity=one
#    pins a 1-queue device's thread to the first CPU of its map;
#    queue_affinity=auto goes between that CPU and all under fio and
#    measures the time per 4 KiB both ways; queue_affinity=2 is refused
#    with a clear error;
#  - idle_spin=auto (the default) measures the spin windows at QD 1 and
#    shows the rates and its choice;
#  - idle_spin=1: at QD 1 the queue thread spins at each wait for a request
#    (`idle_spins` = `idle_waits`), idle_spin=0 never, and idle_spin=2 is
#    refused with a clear error;
#  - `softblk del` and `softblk shutdown` leave no device, state file or daemon.
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool softblk fio
modprobe ublk_drv || vm_skip "no ublk_drv in this kernel"
vm_wait_for /dev/ublk-control

export SOFTBLK_RUN_DIR=/tmp/softblk-run
fio_pid=
cleanup() {
  [ -n "$fio_pid" ] && kill -9 "$fio_pid" 2>/dev/null
  softblk shutdown >/dev/null 2>&1 || true
}
trap cleanup EXIT

# Adds a 64 MiB memory-backed null device NAME of depth 32 with the
# further arguments given; sets `added` to its /dev/ublkbN.
add_null() {
  local name=$1
  shift
  softblk add null --name "$name" --size 64M --bs 4096 --memory-backed --depth 32 "$@" |
    tee "/tmp/add-$name.txt"
  added=$(grep -o '/dev/ublkb[0-9]*' "/tmp/add-$name.txt" | head -n1)
  [ -b "$added" ] || vm_fail "no device for $name"
}
# Writes SIZE of random 4 KiB blocks to DEV at QD 16 and reads them back
# verified; further fio options follow the defaults (later ones win).
write_verify() {
  local dev=$1 size=$2
  shift 2
  fio --name=verify --filename="$dev" --direct=1 --ioengine=io_uring --iodepth=16 --rw=randwrite \
    --bs=4k --size="$size" --verify=crc32c --verify_fatal=1 --output-format=terse "$@" >/dev/null
}

vm_step "features"
softblk features >/tmp/features.txt
grep -i ublk /tmp/features.txt
grep -q 'export types (default: ublk)' /tmp/features.txt || vm_fail "ublk is not the default export"
grep -q 'USER_RECOVERY_REISSUE' /tmp/features.txt || vm_fail "features does not name the kernel's ublk bits"

vm_step "add with the default export"
# Each request is held 2 ms by the device, so that the kill below catches
# requests inside the daemon.
softblk add null --name c0 --size 256M --bs 4096 --memory-backed --queues 2 --depth 64 \
  irqmode=2 completion_nsec=2000000 --export-opt recovery=reissue | tee /tmp/add.txt
dev=$(grep -o '/dev/ublkb[0-9]*' /tmp/add.txt | head -n1)
[ -n "$dev" ] || vm_fail "add printed no /dev/ublkbN"
[ -b "$dev" ] || vm_fail "$dev is not a block device"

vm_step "list"
softblk list | tee /tmp/list.txt
line=$(grep '^c0 ' /tmp/list.txt) || vm_fail "c0 not listed"
echo "$line" | grep -q "ublk $dev LIVE pid [0-9]* queues 2 depth 64" ||
  vm_fail "list does not show the ublk state, pid, queues and depth: $line"
pid=$(echo "$line" | sed -n 's/.* pid \([0-9]*\) .*/\1/p')
kill -0 "$pid" || vm_fail "the pid list shows ($pid) is not running"
[ "$(cat /sys/block/${dev#/dev/}/queue/nr_requests)" = 64 ] || vm_fail "nr_requests is not 64"

vm_step "kill -9 the daemon under fio load, softblk list brings the device back"
fio --name=load --filename="$dev" --allow_file_create=0 --direct=1 --ioengine=io_uring --iodepth=32 --rw=randwrite \
  --bs=4k --size=128M --runtime=10 --time_based --output-format=terse >/tmp/fio-load.txt 2>&1 &
fio_pid=$!
vm_wait_io "$dev"
sleep 1
kill -0 $fio_pid || vm_fail "fio ended before the kill"
kill -9 "$pid"
while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
echo "killed daemon $pid"
[ -b "$dev" ] || vm_fail "$dev went away with a recovery=reissue daemon"
softblk list | tee /tmp/list2.txt
line=$(grep '^c0 ' /tmp/list2.txt) || vm_fail "c0 not listed after the restart"
echo "$line" | grep -q "ublk $dev LIVE pid" || vm_fail "c0 not LIVE on $dev after the restart: $line"
pid2=$(echo "$line" | sed -n 's/.* pid \([0-9]*\) .*/\1/p')
[ "$pid2" != "$pid" ] || vm_fail "still the old daemon pid"
kill -0 "$pid2" || vm_fail "new daemon $pid2 not running"
rc=0
wait $fio_pid || rc=$?
fio_pid=
[ "$rc" = 0 ] || { cat /tmp/fio-load.txt; vm_fail "fio failed across the daemon restart (exit $rc)"; }
errors=$(cut -d';' -f5 /tmp/fio-load.txt | tail -n1)
vm_expect_eq "fio errors across the restart" "$errors" 0
# 2048 writes read back show the restarted daemon serves the device (this
# used to write 32 MiB, four times as many).
write_verify "$dev" 8M || vm_fail "write+verify after the restart failed"
echo "ok: write+verify after the restart"

vm_step "queue_affinity=1: each queue's thread on the CPUs the kernel maps to it"
# Per-queue field NAME of `softblk list --json`, flattened, for the device
# listed Nth: field NAME N (queue_cpus: "[]" per queue while unpinned).
field() { softblk list --json | tr -d ' \n' | grep -o "\"$1\":\[[][0-9a-z,]*\]" | sed -n "$2p"; }
# The default (auto): each of the device's threads free or on one CPU, as
# the device measured (a thread follows it at its next request).
field queue_cpus 1 | grep -qx '"queue_cpus":\[\[[0-9]*\],\[[0-9]*\]\]' ||
  vm_fail "c0's queues (queue_affinity=auto, 2 queues) neither free nor on one CPU: $(field queue_cpus 1)"
if [ "$(nproc)" -ge 2 ]; then
  add_null c1 --queues 2 --export-opt queue_affinity=1
  dev1=$added
  want='"queue_cpus":['
  for q in 0 1; do
    # cpu_list is "0" or "0, 1" style; queue_cpus lists them as [0,1].
    want+="[$(tr -d ' \n' </sys/block/${dev1#/dev/}/mq/$q/cpu_list)]"
    [ $q = 0 ] && want+=","
  done
  want+="]"
  vm_expect_eq "c1's queues against the kernel's map" "$(field queue_cpus 2)" "$want"
  # The main thread is not pinned; each queue's thread has a set of its own.
  all=$(awk '/Cpus_allowed_list/ {print $2}' /proc/"$pid2"/status)
  sets=$(awk '/Cpus_allowed_list/ {print $2}' /proc/"$pid2"/task/*/status | sort -u | grep -vx "$all" || true)
  [ "$(echo "$sets" | grep -c .)" -ge 2 ] ||
    vm_fail "no two threads of the daemon pinned to different CPU sets (all: $all, others: $sets)"
  write_verify "$dev1" 8M --numjobs=2 --offset_increment=8M ||
    vm_fail "write+verify on the pinned queues failed"
  echo "ok: queues pinned as the kernel maps them, write+verify"
  # queue_requests: fio held on queue 1's first CPU feeds queue 1 alone
  # (the block layer picks the queue by the submitting CPU). Queue 0 may
  # see a stray read of udev's; 256 reads it may not.
  cpu=$(grep -o '^[0-9]*' /sys/block/${dev1#/dev/}/mq/1/cpu_list)
  before=$(field queue_requests 2 | tr -dc '0-9,' | tr ',' ' ')
  fio --name=q1 --filename="$dev1" --direct=1 --ioengine=io_uring --iodepth=1 --rw=randread \
    --bs=4k --size=1M --cpus_allowed="$cpu" --output-format=terse >/dev/null ||
    vm_fail "reads on CPU $cpu failed"
  after=$(field queue_requests 2 | tr -dc '0-9,' | tr ',' ' ')
  read -r b0 b1 <<<"$before"
  read -r a0 a1 <<<"$after"
  echo "queue_requests before [$b0, $b1], after 256 reads on CPU $cpu [$a0, $a1]"
  [ $((a1 - b1)) -ge 256 ] && [ $((a0 - b0)) -le 8 ] ||
    vm_fail "256 reads on CPU $cpu did not go to queue 1 alone: [$b0, $b1] -> [$a0, $a1]"
  echo "ok: queue_requests counts each queue's requests"
  softblk del c1
  # queue_affinity=one: a single queue serves every CPU, and its thread
  # still keeps to the first of them (kublk's choice).
  add_null c5 --export-opt queue_affinity=one
  dev5=$added
  first=$(grep -o '^[0-9]*' /sys/block/${dev5#/dev/}/mq/0/cpu_list)
  vm_expect_eq "c5's queue (queue_affinity=one)" "$(field queue_cpus 2)" "\"queue_cpus\":[[$first]]"
  grep -qx "Cpus_allowed_list:[[:space:]]*$first" /proc/"$pid2"/task/*/status ||
    vm_fail "no thread of the daemon pinned to CPU $first alone"
  write_verify "$dev5" 8M || vm_fail "write+verify on the queue pinned to one CPU failed"
  softblk del c5
  # queue_affinity=auto: under load the device's threads go between its
  # first CPU and every CPU, measuring the time per 4 KiB each way. c0
  # (2 queues, idle) comes first in the list.
  add_null c7 --export-opt queue_affinity=auto
  write_verify "$added" 32M || vm_fail "write+verify with queue_affinity=auto failed"
  switches=$(field pin_switches 2 | tr -dc '0-9')
  measured=$(field pin_ns_per_4k 2)
  echo "queue_affinity=auto after 32 MiB: $switches switches, $measured, $(field queue_cpus 2)"
  [ "${switches:-0}" -ge 4 ] || vm_fail "the thread did not go between the two ways ($switches switches)"
  echo "$measured" | grep -q '\[[1-9][0-9]*,[1-9][0-9]*\]' ||
    vm_fail "no time per 4 KiB measured both ways: $measured"
  softblk del c7
  # With 2 queues the device measures, and both threads follow it: two
  # writers, each held on a CPU of its own queue so that both queues get
  # requests all along.
  add_null c8 --queues 2 --export-opt queue_affinity=auto
  cpu0=$(grep -o '^[0-9]*' /sys/block/${added#/dev/}/mq/0/cpu_list)
  cpu1=$(grep -o '^[0-9]*' /sys/block/${added#/dev/}/mq/1/cpu_list)
  write_verify "$added" 16M --numjobs=2 --offset_increment=16M --cpus_allowed="$cpu0,$cpu1" \
    --cpus_allowed_policy=split ||
    vm_fail "write+verify with 2 queues and queue_affinity=auto failed"
  switches=$(field pin_switches 2 | tr -dc '0-9,')
  measured=$(field pin_ns_per_4k 2)
  echo "queue_affinity=auto, 2 queues, after 2 x 16 MiB: switches [$switches], $measured, $(field queue_cpus 2)"
  IFS=, read -r s0 s1 <<<"$switches"
  [ "${s0:-0}" -ge 1 ] && [ "${s1:-0}" -ge 1 ] && [ $((s0 + s1)) -ge 4 ] ||
    vm_fail "the two queues' threads did not follow the device between the two ways ([$switches])"
  echo "$measured" | grep -q '\[[1-9][0-9]*,[1-9][0-9]*\]' ||
    vm_fail "no time per 4 KiB measured both ways for the device: $measured"
  softblk del c8
  echo "ok: queue_affinity=auto measured both ways (1 and 2 queues), write+verify"
  if softblk add null --name c6 --size 64M --export-opt queue_affinity=2 >/tmp/add6.txt 2>&1; then
    vm_fail "queue_affinity=2 was taken"
  fi
  grep -q 'queue_affinity=2: one of 0, 1, one, auto' /tmp/add6.txt || { cat /tmp/add6.txt; vm_fail "no clear error for queue_affinity=2"; }
  echo "ok: queue_affinity=one keeps a single queue's thread on CPU $first; 2 refused"
else
  echo "one CPU: nothing to pin"
fi

vm_step "idle_spin: a queue thread spins for the next request as told"
add_null c2 --export-opt idle_spin=1 --export-opt idle_spin_max=2000
dev2=$added
add_null c3 --export-opt idle_spin=0
dev3=$added
for d in "$dev2" "$dev3"; do
  write_verify "$d" 2M --iodepth=1 || vm_fail "write+verify at QD 1 on $d failed"
done
# c0 (1 of the list) runs the default (auto); c2 and c3 follow in order.
spins2=$(field idle_spins 2 | tr -dc '0-9')
waits2=$(field idle_waits 2 | tr -dc '0-9')
echo "c2: $(field idle_spinning 2) spins $spins2 of $waits2 waits; c3: $(field idle_spins 3) of $(field idle_waits 3)"
[ "${waits2:-0}" -ge 512 ] || vm_fail "c2 counted $waits2 waits for a request, not one per QD 1 write"
vm_expect_eq "c2's spins (idle_spin=1)" "$spins2" "$waits2"
vm_expect_eq "c2 spinning" "$(field idle_spinning 2)" '"idle_spinning":[true]'
vm_expect_eq "c3's spins (idle_spin=0)" "$(field idle_spins 3)" '"idle_spins":[0]'
waits3=$(field idle_waits 3 | tr -dc '0-9')
[ "${waits3:-0}" -ge 512 ] || vm_fail "c3 counted $waits3 waits for a request, not one per QD 1 write"
if softblk add null --name c4 --size 64M --export-opt idle_spin=2 >/tmp/add4.txt 2>&1; then
  vm_fail "idle_spin=2 was taken"
fi
grep -q 'idle_spin=2: one of auto, 0, 1' /tmp/add4.txt || { cat /tmp/add4.txt; vm_fail "no clear error for idle_spin=2"; }
softblk del c2
softblk del c3
echo "ok: idle_spin=1 spins at each wait, 0 never, 2 refused"
# The default (auto) measures the windows (a sweep is 14 epochs of 10 ms)
# and says what it chose and why.
add_null c5
fio --name=qd1 --filename="$added" --direct=1 --ioengine=psync --rw=randread --bs=4k \
  --time_based --runtime=3 --output=/dev/null || vm_fail "QD 1 reads on c5 failed"
# (The choice holds one array of its own, rates_per_s_by_pass.)
spin=$(softblk list --json | tr -d ' \n' | grep -oE '"idle_spin":\[\{([^][]|\[[^]]*\])*\}\]' | tail -n1)
echo "c5 (idle_spin=auto): $spin"
grep -q '"mode":"auto"' <<<"$spin" || vm_fail "c5's idle spin is not measured: $spin"
grep -q '"sweeps":[1-9]' <<<"$spin" || vm_fail "c5 measured no window in 3 s at QD 1: $spin"
grep -q '"rates_per_s"' <<<"$spin" || vm_fail "c5 shows no rates: $spin"
softblk del c5
echo "ok: idle_spin=auto sweeps the windows and says why it chose one"

vm_step "del and shutdown leave nothing"
softblk del c0
[ ! -e "$dev" ] || vm_fail "$dev still there after del"
ls /dev/ublkc* 2>/dev/null && vm_fail "a ublk char device is left"
softblk shutdown
for _ in $(seq 50); do kill -0 "$pid2" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid2" 2>/dev/null && vm_fail "daemon $pid2 still running after shutdown"
left=$(find $SOFTBLK_RUN_DIR -name '*.json' 2>/dev/null)
[ -z "$left" ] || vm_fail "state files left: $left"
echo "ok: no device, daemon or state file left"
echo PASS
