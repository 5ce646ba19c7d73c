#!/bin/bash
# recovery=fail_io (UBLK_F_USER_RECOVERY_FAIL_IO, Linux 6.13+): after kill -9
# of the daemon I/O fails at once instead of waiting (the device state is
# FAIL_IO), and `recover` brings the device back to LIVE with verified I/O.
# Skips on kernels whose ublk driver lacks the feature (6.12 does).
set -euo pipefail
. /softblk-vm/lib.sh
vm_require_tool softblk-driver fio dd
modprobe ublk_drv || vm_skip "no ublk_drv in this kernel"
vm_wait_for /dev/ublk-control
drv="softblk-driver --export ublk"
run=/tmp/run
mkdir -p $run
features=$(echo features | $drv --run-dir $run --commands)
echo "$features"
echo "$features" | grep -q '"USER_RECOVERY_FAIL_IO"' ||
  vm_skip "kernel $(uname -r) has no UBLK_F_USER_RECOVERY_FAIL_IO (Linux 6.13+)"

pid=
trap '[ -n "$pid" ] && kill -TERM $pid 2>/dev/null; wait 2>/dev/null' EXIT
wait_ready() {
  for _ in $(seq 300); do [ -s /tmp/$1.ready ] && break; sleep 0.1; done
  [ -s /tmp/$1.ready ] || vm_fail "driver for $1 not ready: $(cat /tmp/$1.err)"
  dev=$(sed -n 's/.*"block":"\([^"]*\)".*/\1/p' /tmp/$1.ready)
}
$drv --run-dir $run --ready-file /tmp/f0.ready -o recovery=fail_io f0 null \
  submit_queues=1 hw_queue_depth=32 memory_backed=1 size=64 blocksize=4096 2>/tmp/f0.err &
pid=$!
wait_ready f0
kill -9 $pid; wait $pid 2>/dev/null || true; pid=
sleep 1
if dd if=/dev/zero of=$dev bs=4k count=1 oflag=direct status=none 2>/dev/null; then
  vm_fail "a write succeeded while the device had no daemon (FAIL_IO)"
fi
echo "ok: I/O fails while the daemon is gone"
echo list | $drv --run-dir $run --commands | tee /tmp/f0.list
grep -q '"state":"FAIL_IO"' /tmp/f0.list || vm_fail "the kernel does not report FAIL_IO for the orphaned device"
echo "ok: state FAIL_IO while the daemon is gone"
rm -f /tmp/f0.ready
$drv --run-dir $run --ready-file /tmp/f0.ready --recover f0 2>/tmp/f0.err &
pid=$!
wait_ready f0
fio --name=v --filename=$dev --direct=1 --rw=randwrite --bs=4k --size=16M --verify=crc32c \
  --verify_fatal=1 --output-format=terse >/dev/null || vm_fail "verify after recovery failed"
echo "ok: recovered, verified"
echo PASS
