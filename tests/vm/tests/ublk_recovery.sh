#!/bin/bash
# A ublk device with user recovery outlives its killed daemon, and
# `softblk-driver --export ublk --recover NAME` re-attaches it from the persisted state files
# alone (the device's settings from the host library's RUN_DIR/devices/NAME.json, the
# kernel facts from the export's RUN_DIR/ublk/NAME.json; no original command line, no
# SET_PARAMS; same /dev/ublkbN):
#  - recovery=reissue: kill -9 under fio load; fio finishes without an error
#    (in-flight I/O is reissued to the new daemon) and a write+verify pass
#    on the recovered device succeeds;
#  - recovery=recover: kill -9 under fio load; the I/O in flight fails (fio
#    reports errors) and the device then recovers and verifies.
# The devices complete each request 5 ms after it arrives (irqmode=2,
# completion_nsec=5000000), so that requests are held by the daemon most
# of the time, and the kill comes only while the daemon is stopped with
# requests in flight (kill_under_load): fio caught between two batches
# leaves nothing in flight to fail or reissue. Requests not yet handed to
# the stopped daemon count as in flight too but are requeued, not failed:
# the recover case kills again (three times at most) until one failed.
# (The memory target's data lives in the daemon and dies with it, so data
# written before the kill is not expected back; the kernel device, its
# queue of waiting I/O and its identity are.)
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool softblk-driver fio
modprobe ublk_drv || vm_skip "no ublk_drv in this kernel"
vm_wait_for /dev/ublk-control

drv="softblk-driver --export ublk"
run=/tmp/run
mkdir -p $run
pid=
fio_pid=
cleanup() {
  [ -n "$fio_pid" ] && kill -9 "$fio_pid" 2>/dev/null
  if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
}
trap cleanup EXIT

# wait_ready NAME: waits for the driver's ready file, sets $dev.
wait_ready() {
  for _ in $(seq 300); do
    [ -s /tmp/$1.ready ] && break
    kill -0 $pid 2>/dev/null || { cat /tmp/$1.err; vm_fail "driver for $1 exited"; }
    sleep 0.1
  done
  [ -s /tmp/$1.ready ] || vm_fail "driver for $1 not ready after 30 s"
  dev=$(sed -n 's/.*"block":"\([^"]*\)".*/\1/p' /tmp/$1.ready)
  cat /tmp/$1.ready
}
serve() {
  local name=$1; shift
  rm -f /tmp/$name.ready
  $drv --run-dir $run --ready-file /tmp/$name.ready "$name" null "$@" \
    >/tmp/$name.out 2>/tmp/$name.err &
  pid=$!
  wait_ready "$name"
}
recover() {
  rm -f /tmp/$1.ready
  $drv --run-dir $run --ready-file /tmp/$1.ready --recover "$1" >/tmp/$1.out 2>/tmp/$1.err &
  pid=$!
  wait_ready "$1"
}
stop() {
  kill -TERM "$pid"
  wait "$pid" || vm_fail "driver exited with $? on SIGTERM: $(cat /tmp/*.err)"
  pid=
}
verify() {
  fio --name=verify --filename="$dev" --direct=1 --ioengine=io_uring --iodepth=16 --rw=randwrite \
    --bsrange=4k-64k --size=64M --verify=crc32c --verify_fatal=1 --output-format=terse >/dev/null ||
    vm_fail "fio write+verify on the recovered device failed"
  echo "ok: fio write+verify on the recovered device"
}

# kill_under_load NAME: runs fio against $dev, kills the daemon with -9 in
# the middle, waits until the kernel has quiesced the device, recovers it,
# and leaves fio's exit status in $fio_rc and its output in /tmp/fio-NAME.txt.
kill_under_load() {
  local name=$1 old_dev=$dev
  fio --name=load --filename="$dev" --allow_file_create=0 --direct=1 --ioengine=io_uring --iodepth=32 --rw=randwrite \
    --bs=4k --size=128M --runtime=12 --time_based --output-format=terse >/tmp/fio-$name.txt 2>&1 &
  fio_pid=$!
  vm_wait_io "$dev"
  sleep 1
  kill -0 $fio_pid || vm_fail "fio ended before the kill"
  # Killed only while the block layer counts requests in flight, with the
  # daemon stopped so that it cannot complete them between the look and the
  # kill: fio refills its queue depth only after a batch completed, and a
  # kill in that gap found nothing to fail or reissue (a CI flake even with
  # the 5 ms hold).
  local tries=0 rd wr
  while :; do
    kill -STOP "$pid"
    read -r rd wr <"/sys/block/${dev#/dev/}/inflight"
    [ $((rd + wr)) -gt 0 ] && break
    kill -CONT "$pid"
    tries=$((tries + 1))
    [ "$tries" -lt 200 ] || vm_fail "never caught a request in flight on $dev"
    sleep 0.01
  done
  kill -9 "$pid"
  wait "$pid" 2>/dev/null || true
  pid=
  echo "killed the daemon under load"
  [ -e "$old_dev" ] || vm_fail "$old_dev disappeared with the daemon"
  echo list | $drv --run-dir $run --commands | tee /tmp/$name.list
  grep -q '"recoverable":true' /tmp/$name.list || vm_fail "device not recoverable after the kill"
  recover "$name"
  vm_expect_eq "device after recovery" "$dev" "$old_dev"
  grep -q '"recovered":true' /tmp/$name.ready || vm_fail "export does not say it recovered"
  grep -q '"state":"LIVE"' /tmp/$name.ready || vm_fail "device not LIVE after recovery"
  fio_rc=0
  wait $fio_pid || fio_rc=$?
  fio_pid=
  echo "fio exit status: $fio_rc"
}

vm_step "recovery=reissue: kill -9 under load, recover, fio finishes clean"
serve r0 -o recovery=reissue submit_queues=2 hw_queue_depth=64 memory_backed=1 size=256 blocksize=4096 \
  irqmode=2 completion_nsec=5000000
grep -q USER_RECOVERY_REISSUE /tmp/r0.ready || vm_fail "REISSUE not granted"
# One owner of the device's settings: the host library's state file has
# them, the ublk export's only its kernel facts; recovery reads both.
grep -q '"type": "null"' $run/devices/r0.json || vm_fail "no settings in $run/devices/r0.json"
if grep -Eq '"(target_type|device_options|export_options)"' $run/ublk/r0.json; then
  vm_fail "the ublk state file holds the device's settings: $(cat $run/ublk/r0.json)"
fi
kill_under_load r0
[ "$fio_rc" = 0 ] || { cat /tmp/fio-r0.txt; vm_fail "fio failed across a REISSUE recovery"; }
errors=$(cut -d';' -f5 /tmp/fio-r0.txt | tail -n1)
vm_expect_eq "fio errors across the recovery" "$errors" 0
verify
stop
[ ! -e "$dev" ] || vm_fail "$dev still there after delete"

vm_step "recovery=recover: kill -9 under load, in-flight I/O fails, device recovers"
serve r1 -o recovery=recover submit_queues=2 hw_queue_depth=64 memory_backed=1 size=256 blocksize=4096 \
  irqmode=2 completion_nsec=5000000
# The block layer's count of requests in flight includes the ones fio
# submitted after the daemon was stopped and ublk had not yet handed over:
# the kernel requeues those at the kill instead of failing them. When a
# kill caught only such requests fio sees no error; the kill is tried
# again on the recovered device, three times at most.
for attempt in 1 2 3; do
  kill_under_load r1
  [ "$fio_rc" = 0 ] || break
  echo "attempt $attempt: fio saw no error (no request had reached the daemon); again"
done
if [ "$fio_rc" = 0 ]; then
  cat /tmp/fio-r1.txt
  vm_fail "fio saw no error in three kills with I/O in flight"
fi
echo "ok: the I/O in flight at the kill failed (fio exit $fio_rc): $(grep -o 'error=[^,]*' /tmp/fio-r1.txt | head -n1)"
verify
stop

vm_step "recovery=none: kill -9 removes the disk; cleanup deletes the leftover"
serve r2 submit_queues=1 hw_queue_depth=32 memory_backed=1 size=64 blocksize=4096
id=$(sed -n 's/.*"dev_id":\([0-9]*\).*/\1/p' /tmp/r2.ready)
kill -9 "$pid"; wait "$pid" 2>/dev/null || true; pid=
for _ in $(seq 50); do [ -e /dev/ublkb$id ] || break; sleep 0.1; done
[ ! -e /dev/ublkb$id ] || vm_fail "/dev/ublkb$id outlived a daemon without recovery"
echo cleanup | $drv --run-dir $run --commands
[ ! -e /dev/ublkc$id ] || vm_fail "/dev/ublkc$id left after cleanup"
[ ! -e $run/ublk/r2.json ] || vm_fail "state file left after cleanup"
echo "ok: no disk, no char device, no state file"
vm_step "a state file whose device id is another server's device now: left alone"
# Server B's device; then a state file of ours that names the same id, as
# if our device of that id had been deleted and the id reused by B (the
# cookie differs). plant NAME: writes our a.json from B's NAME.json.
runb=/tmp/runb
mkdir -p $runb $run/ublk
plant() {
  sed -e "s/\"device\": \"$1\"/\"device\": \"a\"/" -e 's/"cookie": [0-9]*/"cookie": 1/' \
    $runb/ublk/$1.json >$run/ublk/a.json
  grep -q '"cookie": 1,\{0,1\}$' $run/ublk/a.json || vm_fail "no cookie in $(cat $run/ublk/a.json)"
}
# Kept by the kernel for recovery after B's kill: ours must not recover it.
run=$runb serve b -o recovery=recover submit_queues=1 hw_queue_depth=32 memory_backed=1 size=64 \
  blocksize=4096
idb=$(sed -n 's/.*"dev_id":\([0-9]*\).*/\1/p' /tmp/b.ready)
kill -9 "$pid"; wait "$pid" 2>/dev/null || true; pid=
plant b
# Our device is gone: the driver's cleanup at start drops the stale state
# file, and there is nothing of ours left to recover.
if $drv --run-dir $run --recover a </dev/null >/tmp/a.out 2>/tmp/a.err; then
  vm_fail "recovered a from a state file whose device is another server's: $(cat /tmp/a.out)"
fi
grep -q "no saved ublk export" /tmp/a.err || vm_fail "recover a: $(cat /tmp/a.err)"
[ -e /dev/ublkc$idb ] || vm_fail "/dev/ublkc$idb, another server's device, deleted"
run=$runb recover b
vm_expect_eq "B's device after its own recovery" "$(sed -n 's/.*"dev_id":\([0-9]*\).*/\1/p' /tmp/b.ready)" "$idb"
stop
# Dead, without recovery: ours must not delete it in its cleanup.
run=$runb serve c submit_queues=1 hw_queue_depth=32 memory_backed=1 size=64 blocksize=4096
idc=$(sed -n 's/.*"dev_id":\([0-9]*\).*/\1/p' /tmp/c.ready)
kill -9 "$pid"; wait "$pid" 2>/dev/null || true; pid=
plant c
echo cleanup | $drv --run-dir $run --commands
[ -e /dev/ublkc$idc ] || vm_fail "our cleanup deleted /dev/ublkc$idc, another server's device"
[ ! -e $run/ublk/a.json ] || vm_fail "our stale state file kept"
echo cleanup | $drv --run-dir $runb --commands
[ ! -e /dev/ublkc$idc ] || vm_fail "/dev/ublkc$idc left after its own server's cleanup"
echo "ok: a stale id in our state file left another server's devices alone"
echo "PASS"
