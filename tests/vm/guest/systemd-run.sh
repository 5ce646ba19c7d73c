#!/bin/sh
# Runs the test of a `run-vm --root-image` boot under systemd (started by
# softblk-vm-test.service): /softblk-vm/test.sh with the arguments in
# /softblk-vm/args, then the result line for run-vm, then poweroff.
. /softblk-vm/env
export PATH=/softblk-vm/local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LC_ALL=C TERM=dumb
[ -n "$(ls /softblk-vm/local/lib 2>/dev/null)" ] && export LD_LIBRARY_PATH=/softblk-vm/local/lib
read -r nonce </softblk-vm/nonce
set --
while IFS= read -r arg; do set -- "$@" "$arg"; done </softblk-vm/args
echo "softblk-vm: systemd is up at $(cut -d' ' -f1 /proc/uptime) s ($(systemctl is-system-running 2>&1))"
cd /tmp
/softblk-vm/test.sh "$@" </dev/null
rc=$?
echo "softblk-vm: test finished at $(cut -d' ' -f1 /proc/uptime) s with status $rc"
if dmesg | grep -qE '(WARNING:|BUG:|Oops|general protection fault|Call Trace:|UBSAN:|KASAN:)'; then
  echo "softblk-vm: the kernel reported a problem:"
  dmesg | tail -n 80
  if [ "$rc" = 0 ] && [ "${SOFTBLK_VM_ALLOW_KERNEL_WARNINGS:-0}" != 1 ]; then rc=1; fi
elif [ "$rc" != 0 ] && [ "$rc" != 77 ]; then
  echo "softblk-vm: last kernel messages:"
  dmesg | tail -n 25
fi
# The disk image is the next boot's: everything written reaches it before
# run-vm (which stops QEMU a second after the result line) can cut it off.
sync
echo "SOFTBLK-VM-EXIT $nonce $rc"
systemctl start --no-block poweroff.target
