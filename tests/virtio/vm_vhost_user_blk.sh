#!/bin/bash
# A Linux guest (the VM lab's Debian kernel under QEMU, vhost-user-blk-pci
# with its memory from memory-backend-memfd,share=on) on softblk's
# vhost-user-blk back end, served by the softblk daemon on the host:
#   basic     fio verify on two queues, ext4 mkfs + fsck, write zeroes and
#             discard reaching the back end (its counters; discard frees
#             the null device's memory)
#   restart   the daemon is killed (-9) under guest I/O and started again;
#             QEMU reconnects, the new back end resubmits what was in
#             flight (inflight region) and the guest sees no I/O error
#   resize    a file device grown with `softblk set size=` while the guest
#             runs: the guest's disk follows (CONFIG_CHANGE_MSG);
#   zoned     a zoned device is seen by the guest as zoned (blkzone report);
#             skipped until a zoned target type exists, and with a QEMU
#             whose vhost-user-blk does not pass VIRTIO_BLK_F_ZONED
# Usage: vm_vhost_user_blk.sh SOFTBLK SCENARIO
set -euo pipefail
softblk=${1:?softblk executable}
scenario=${2:?scenario}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/tests/support/lib_cli.sh"

[ "$(id -u)" -eq 0 ] || skip "needs root (QEMU and the daemon share the socket)"
for tool in jq qemu-system-x86_64; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/install-deps.sh)"
done
setup_run_dir vhost-vm
name=vub0
mem_mib=1024

case $scenario in
basic)
  "$softblk" add null memory_backed=1 size=256 bs=4096 discard=1 submit_queues=2 poll_queues=0 \
    --name $name --export vhost-user-blk --export-opt num-queues=2 >/dev/null
  ;;
restart)
  # Completions take 20 ms, so requests are in flight whenever the back end
  # is killed; the device's options come back with the daemon.
  "$softblk" add null size=256 bs=4096 submit_queues=1 poll_queues=0 irqmode=2 \
    completion_nsec=20000000 --name $name --export vhost-user-blk >/dev/null
  ;;
resize)
  # A file device whose size= the host changes while the guest runs: the
  # guest sees the new capacity (the back end's CONFIG_CHANGE_MSG, QEMU's
  # GET_CONFIG, the virtio config interrupt).
  img=$run_dir/resize.img
  "$softblk" add file "path=$img" size=64M create=1 --name $name --export vhost-user-blk >/dev/null
  ;;
zoned)
  ztype=$("$softblk" features --json 2>/dev/null |
    jq -r '[.targets[]?.name | select(test("zone|zloop"))][0] // empty' || true)
  [ -n "$ztype" ] || skip "no zoned target type is registered yet (softblk features)"
  qv=$(qemu-system-x86_64 --version | sed -n 's/.*version \([0-9]*\)\..*/\1/p')
  [ "${qv:-0}" -ge 8 ] || skip "QEMU $(qemu-system-x86_64 --version | head -1 | awk '{print $4}') predates VIRTIO_BLK_F_ZONED (8.0)"
  "$softblk" add "$ztype" --name $name --export vhost-user-blk >/dev/null
  ;;
*)
  echo "unknown scenario $scenario" >&2
  exit 2
  ;;
esac
remember_daemon
sock=$(field $name .export.socket)
[ -S "$sock" ] || fail "the export names no socket ($sock)"
note "back end on $sock"

reconnect=
[ "$scenario" = restart ] && reconnect=,reconnect=1
qemu_args=(--qemu-arg -object --qemu-arg "memory-backend-memfd,id=mem,size=${mem_mib}M,share=on"
  --qemu-arg -numa --qemu-arg node,memdev=mem
  --qemu-arg -chardev --qemu-arg "socket,path=$sock,id=vub$reconnect"
  --qemu-arg -device --qemu-arg "vhost-user-blk-pci,chardev=vub,num-queues=$([ "$scenario" = basic ] && echo 2 || echo 1)")
log=$run_dir/console.log
vm_cmd=(bash "$root/tests/vm/run-vm" "$root/tests/vm/tests/vhost_user_blk_guest.sh" --mem $mem_mib
  --timeout 400 --log "$log" "${qemu_args[@]}" -- "$scenario" "$name")

# The guest's last words (the run directory goes with the test).
guest_log() { [ -f "$log" ] && grep -v '^\[ *[0-9.]*\]' "$log" | tail -25 >&2; }
guest_failed() {
  guest_log
  exit "$1"
}
# Waits for the VM started in the background ($vm); exits with its status
# and the guest's last words if it failed.
wait_guest() {
  local rc=0
  wait $vm || rc=$?
  [ $rc -eq 0 ] || guest_failed $rc
}
# Starts the VM in the background ($vm), stopped by the cleanup if the test
# ends first.
start_guest() {
  "${vm_cmd[@]}" &
  vm=$!
  extra_cleanup+=("kill $vm 2>/dev/null")
}

if [ "$scenario" = resize ]; then
  start_guest
  # The guest writes a marker at the disk's start once it has checked the
  # first size; then the host grows the device.
  marker() { head -c 14 "$img" 2>/dev/null | tr -d '\0'; }
  for i in $(seq 1 600); do
    [ "$(marker)" = SOFTBLK-RESIZE ] && break
    kill -0 $vm 2>/dev/null || break
    sleep 0.5
  done
  [ "$(marker)" = SOFTBLK-RESIZE ] || {
    wait $vm || true
    guest_log
    fail "the guest never wrote its marker"
  }
  "$softblk" set $name size=128M >/dev/null || fail "softblk set $name size=128M"
  note "grew $name to 128 MiB: $(field $name .export | jq -c '{connected, stats: .stats.requests}')"
  wait_guest
  [ "$(stat -c %s "$img")" -eq $((128 << 20)) ] || fail "the image is $(stat -c %s "$img") bytes, not 128 MiB"
  [ "$(marker)" = SOFTBLK-RESIZE ] || fail "the marker at the disk's start is gone"
elif [ "$scenario" != restart ]; then
  set +e
  "${vm_cmd[@]}"
  rc=$?
  set -e
  [ $rc -eq 0 ] || guest_failed $rc
else
  start_guest
  # Wait until the guest's fio has the back end busy, then kill it while
  # requests are in the device: a guest slowed by a loaded host can leave
  # the back end idle for longer than a request takes (20 ms), and a kill
  # then leaves nothing in the inflight region to resubmit.
  pid=$(cat "$run_dir/daemon.pid")
  for i in $(seq 1 600); do
    read -r n inflight <<<"$(field $name '"\(.export.stats.requests) \(.stats.submitted - .stats.completed)"' 2>/dev/null || echo 0 0)"
    [ "${n:-0}" -gt 2000 ] && [ "${inflight:-0}" -gt 0 ] && break
    kill -0 $vm 2>/dev/null || break
    sleep 0.2
  done
  if [ "${n:-0}" -le 2000 ] || [ "${inflight:-0}" -le 0 ]; then
    wait $vm || true
    guest_log
    fail "the guest never got its I/O going ($n requests, $inflight in flight)"
  fi
  kill -KILL "$pid"
  note "killed the daemon (pid $pid) after $n requests, $inflight of them in the device"
  wait_gone "$pid" 10 || fail "daemon $pid survived kill -9"
  sleep 2
  # Any command starts a new daemon, which re-creates the device and its
  # export on the same socket; QEMU reconnects within a second.
  "$softblk" list >/dev/null
  remember_daemon
  for i in $(seq 1 60); do
    [ "$(field $name .export.connected)" = true ] && break
    sleep 0.5
  done
  [ "$(field $name .export.connected)" = true ] || fail "QEMU did not reconnect to the new back end"
  note "QEMU reconnected; resubmitted: $(field $name .export.stats.resubmitted)"
  wait_guest
  [ "$(field $name .export.stats.resubmitted)" -gt 0 ] ||
    fail "the new back end resubmitted nothing from the inflight region"
fi

stats=$(field $name .export.stats)
note "back end counters: $(echo "$stats" | jq -c .)"
case $scenario in
basic)
  [ "$(echo "$stats" | jq .discard)" -gt 0 ] || fail "no discard reached the back end"
  [ "$(echo "$stats" | jq .write_zeroes)" -gt 0 ] || fail "no write zeroes reached the back end"
  [ "$(echo "$stats" | jq .bad_requests)" -eq 0 ] || fail "the back end saw malformed requests"
  # Data pages only: the store keeps some freed pages for reuse (up to 1/8
  # of the capacity, docs/null.md), which memory_bytes still counts.
  memory=$(field $name .target.data_page_bytes)
  [ "$memory" -lt $((4 << 20)) ] || fail "discarding the whole disk left $memory bytes of data in the target"
  # Both rings carried requests.
  q1=$(field $name '.stats.submitted')
  note "device requests: $q1, data after discard: $memory bytes (kept free: $(field $name .target.store_free_page_bytes))"
  ;;
esac
echo "PASS: vhost-user-blk $scenario"
