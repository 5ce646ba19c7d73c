#!/bin/bash
# Deleting a ublk device while fio runs on it ends cleanly (the daemon stops
# within seconds and fio, whose disk went away under it, ends instead of
# hanging), and 10 add/del
# cycles leave nothing behind: no /dev/ublkb*, /dev/ublkc*, sysfs entries,
# state files or daemons, and the device id is reused each time.
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool softblk-driver fio dd cmp
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
serve() {
  local name=$1; shift
  rm -f /tmp/$name.ready
  $drv --run-dir $run --ready-file /tmp/$name.ready "$name" null "$@" \
    >/tmp/$name.out 2>/tmp/$name.err &
  pid=$!
  for _ in $(seq 300); do
    [ -s /tmp/$name.ready ] && break
    kill -0 $pid 2>/dev/null || { cat /tmp/$name.err; vm_fail "driver for $name exited"; }
    sleep 0.1
  done
  [ -s /tmp/$name.ready ] || vm_fail "driver for $name not ready"
  dev=$(sed -n 's/.*"block":"\([^"]*\)".*/\1/p' /tmp/$name.ready)
  vm_wait_for "$dev"
}
# stop_within SECONDS: SIGTERM, and the daemon must be gone in time.
stop_within() {
  kill -TERM "$pid"
  for _ in $(seq $(($1 * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && vm_fail "daemon still running $1 s after SIGTERM"
  wait "$pid" || vm_fail "daemon exited with $?: $(cat /tmp/*.err)"
  pid=
}

vm_step "delete under I/O"
serve busy submit_queues=2 hw_queue_depth=64 memory_backed=1 size=256 blocksize=4096
fio --name=load --filename="$dev" --allow_file_create=0 --direct=1 --ioengine=io_uring --iodepth=32 --rw=randrw --bs=4k \
  --size=128M --runtime=60 --time_based --numjobs=2 --output-format=terse >/tmp/fio-busy.txt 2>&1 &
fio_pid=$!
vm_wait_io "$dev"
sleep 1
kill -0 $fio_pid || vm_fail "fio ended early"
t0=$(date +%s)
stop_within 20
echo "ok: daemon stopped under load in $(($(date +%s) - t0)) s"
for _ in $(seq 700); do kill -0 $fio_pid 2>/dev/null || break; sleep 0.1; done
kill -0 $fio_pid 2>/dev/null && vm_fail "fio still running 70 s after the device was deleted (hung I/O?)"
fio_rc=0; wait $fio_pid || fio_rc=$?; fio_pid=
grep -v '^3;' /tmp/fio-busy.txt | head -n 3 || true
# What fio sees after the delete is the kernel's business (6.12 has shown
# both failed I/O and a quiet end); what must hold is that nothing hangs.
echo "ok: fio ended (status $fio_rc, error field $(tail -n1 /tmp/fio-busy.txt | cut -d';' -f5))"
[ ! -e "$dev" ] || vm_fail "$dev still there ($(stat -c %F "$dev"))"

# Ten cycles: a leak shows after the first (the checks below count what is
# left), and the id comes back nine times; each cycle costs some 2.5 s
# under TCG, so the twenty this used to run proved no more.
vm_step "10 add/del cycles"
dd if=/dev/urandom of=/tmp/block bs=64k count=1 status=none
for i in $(seq 10); do
  serve c$i submit_queues=2 hw_queue_depth=32 memory_backed=1 size=64 blocksize=4096
  [ "$dev" = /dev/ublkb0 ] || vm_fail "cycle $i: got $dev, expected the id to be reused (/dev/ublkb0)"
  dd if=/tmp/block of=$dev bs=64k seek=$i oflag=direct status=none
  cmp -n 65536 -i 0:$((i * 65536)) /tmp/block $dev || vm_fail "cycle $i: data differs"
  stop_within 10
done
echo "ok: 10 cycles"
left=$(ls /dev | grep -c '^ublk[bc]' || true)
vm_expect_eq "ublk device nodes left" "$left" 0
vm_expect_eq "ublk char devices in sysfs" "$(ls /sys/class/ublk-char 2>/dev/null | wc -l)" 0
vm_expect_eq "ublk disks in sysfs" "$(ls /sys/block | grep -c '^ublkb' || true)" 0
vm_expect_eq "state files left" "$(ls $run/ublk 2>/dev/null | wc -l)" 0
vm_expect_eq "drivers left" "$(ps | grep -c '[s]oftblk-driver' || true)" 0
echo "PASS"
