#!/bin/bash
# An unprivileged ublk device (UBLK_F_UNPRIVILEGED_DEV, Linux 6.5+): a plain
# user (uid 1000, no capabilities) serves a memory-backed null device and
# runs fio --verify on it.
# The guest has no udev, so the test does what ublksrv's udev rules do on a
# real system: /dev/ublk-control mode 0666, and each new /dev/ublkcN and
# /dev/ublkbN chowned to the user who created it (the kernel checks the
# caller's permission on /dev/ublkcN for every control command of an
# unprivileged device, and lets only the owner open /dev/ublkbN).
# Also checked: the kernel refuses recovery for such devices and the driver
# says so before asking it; stopping removes the device; without the udev
# rule the driver fails with an error that names it instead of hanging.
# (The device such a failed attempt leaves cannot be deleted by its owner,
# who may not touch its char device; the VM is discarded.)
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool softblk-driver fio su
modprobe ublk_drv || vm_skip "no ublk_drv in this kernel"
vm_wait_for /dev/ublk-control
drv="$(command -v softblk-driver) --export ublk"
mkdir -p /tmp/run
grep -q '"UNPRIVILEGED_DEV"' <<<"$(echo features | $drv --run-dir /tmp/run --commands)" ||
  vm_skip "kernel $(uname -r) has no UBLK_F_UNPRIVILEGED_DEV"

echo "tester:x:1000:1000::/tmp/tester:/bin/sh" >>/etc/passwd
echo "tester:x:1000:" >>/etc/group
mkdir -p /tmp/tester /tmp/tester/run
chown -R 1000:1000 /tmp/tester
as_user() { su -s /bin/sh tester -c "$*"; }

# ublksrv's rules, by hand: KERNEL=="ublk-control", MODE="0666"; and
# KERNEL=="ublk[bc]*" -> chown to the device's owner.
chmod 0666 /dev/ublk-control
udev_pid=
cleanup() {
  [ -n "$udev_pid" ] && kill "$udev_pid" 2>/dev/null
  pkill -u 1000 2>/dev/null || true
}
trap cleanup EXIT
(
  set +e  # nodes come and go under the loop
  while :; do
    for d in /dev/ublkc* /dev/ublkb*; do
      [ -e "$d" ] && [ "$(stat -c %u "$d")" != 1000 ] && chown 1000:1000 "$d" 2>/dev/null
    done
    sleep 0.05
  done
) &
udev_pid=$!

vm_step "refused combinations"
if as_user "$drv --run-dir /tmp/tester/run -o recovery=reissue bad null size=16" \
    >/tmp/bad.out 2>&1; then
  vm_fail "an unprivileged device with recovery=reissue was accepted"
fi
cat /tmp/bad.out
grep -q 'recovery' /tmp/bad.out || vm_fail "the error does not name recovery"

vm_step "a user serves an unprivileged device"
as_user "$drv --run-dir /tmp/tester/run --ready-file /tmp/tester/u0.ready u0 null \
  submit_queues=2 hw_queue_depth=32 memory_backed=1 size=128 blocksize=4096 \
  >/tmp/tester/u0.out 2>/tmp/tester/u0.err" &
for _ in $(seq 300); do [ -s /tmp/tester/u0.ready ] && break; sleep 0.1; done
[ -s /tmp/tester/u0.ready ] || { cat /tmp/tester/u0.err; vm_fail "the unprivileged driver did not get ready"; }
cat /tmp/tester/u0.ready
grep -q '"unprivileged":true' /tmp/tester/u0.ready || vm_fail "device is not unprivileged"
grep -q '"UNPRIVILEGED_DEV"' /tmp/tester/u0.ready || vm_fail "kernel did not grant UNPRIVILEGED_DEV"
dev=$(sed -n 's/.*"block":"\([^"]*\)".*/\1/p' /tmp/tester/u0.ready)
pid=$(sed -n 's/.*"daemon_pid":\([0-9]*\).*/\1/p' /tmp/tester/u0.ready)
vm_expect_eq "daemon uid" "$(stat -c %u /proc/$pid)" 1000
grep -q '^CapEff:[[:space:]]*0*$' /proc/$pid/status || vm_fail "the daemon has capabilities: $(grep Cap /proc/$pid/status)"
vm_wait_for "$dev"
for _ in $(seq 50); do [ "$(stat -c %u "$dev")" = 1000 ] && break; sleep 0.1; done

vm_step "the owner runs fio --verify on it"
as_user "fio --name=v --filename=$dev --direct=1 --ioengine=io_uring --iodepth=16 --rw=randwrite \
  --bsrange=4k-64k --size=64M --verify=crc32c --verify_fatal=1 --output-format=terse >/tmp/tester/fio.txt" ||
  vm_fail "fio --verify as the owner failed"
echo "ok: fio write+verify as uid 1000"

vm_step "stop"
kill -TERM "$pid"
for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && vm_fail "the driver did not stop on SIGTERM"
for _ in $(seq 50); do [ -e "$dev" ] || break; sleep 0.1; done
[ ! -e "$dev" ] || vm_fail "$dev left after the driver stopped"
echo "ok: device removed"

vm_step "without the udev rule the driver gives up with a clear error (no hang)"
kill -0 "$udev_pid" || vm_fail "the udev stand-in died early"
kill "$udev_pid"; wait "$udev_pid" 2>/dev/null || true; udev_pid=
start=$(date +%s)
if as_user "timeout 30 $drv --run-dir /tmp/tester/run -o add_timeout=1000 u1 null \
    size=16 >/tmp/u1.out 2>&1"; then
  vm_fail "the driver started without access to its char device"
fi
cat /tmp/u1.out
grep -q 'udev rule' /tmp/u1.out || vm_fail "the error does not name the missing udev rule"
[ $(( $(date +%s) - start )) -lt 20 ] || vm_fail "the driver took too long to give up"
echo "ok: failed in $(( $(date +%s) - start )) s"
echo PASS
