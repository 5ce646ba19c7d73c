#!/usr/bin/env bash
# The rbd target when the cluster changes under it, against a real
# single-node Ceph cluster (tests/targets/rbd/lib_ceph.sh, as rbd_target.sh):
#   - a device with 2 queues (FUSE + loop, a worker per queue) under fio
#     verify while the monitor is stopped and started again: the I/O goes
#     on (or resumes) and verifies;
#   - resize: `rbd resize` grows the image and the device follows (the
#     FUSE file's size and its loop device, `softblk list`; NBD: a new
#     connection is told the new size, an open one keeps its own); a
#     shrink makes I/O beyond the new end fail with EIO;
#   - the OSD stopped: an allocation map (NBD BLOCK_STATUS, which waits
#     for the OSD) does not hold up another device served by the same NBD
#     loop; a device with osd_op_timeout=5 fails its read after about 5 s
#     while the daemon serves the others; `del` of a device with a write
#     held by the outage answers after --stop-timeout; `add` is refused
#     within connect_timeout (or osd_op_timeout) with the reason; after the
#     OSD is back, the map completes, the timed-out device serves again
#     and the deleted device is gone (or, when the outage outlasted the NBD
#     export's 10 s wait and the del failed, a second del removes it).
# Usage: rbd_outage.sh PATH/TO/softblk          (exit 77: skipped)
softblk=${1:?usage: $0 PATH/TO/softblk}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../../support/lib_cli.sh
set -euo pipefail  # before the library, so that a missing one stops the test
source "$here/../../support/lib_cli.sh"
# shellcheck source=lib_ceph.sh
source "$here/lib_ceph.sh"
sb() { timeout 120 "$softblk" "$@"; }
ceph_test_requires jq
[ "$(id -u)" -eq 0 ] && [ -c /dev/fuse ] && [ -c /dev/loop-control ] ||
  skip "the FUSE + loop parts need root, /dev/fuse and /dev/loop-control"

setup_run_dir rbd-outage
work=$run_dir/work
mkdir -p "$work"
bg_pids=()
# Before lib_cli's own cleanup: the clients, the cluster back whole (so
# that the daemon's devices can close), the daemon, then the cluster.
extra_cleanup=('for p in "${bg_pids[@]}"; do kill -9 "$p"; done'
  '[ -s "$CEPH_DIR/run/mon.a.pid" ] || ceph_start_mon >/dev/null 2>&1'
  '[ -s "$CEPH_DIR/run/osd.0.pid" ] || ceph_start_osd >/dev/null 2>&1'
  'sb shutdown --force >/dev/null 2>&1' 'ceph_stop')
uri_of() { awk '$1 == "uri:" {print $2}' <<<"$1"; }
MiB=$((1 << 20))
# Waits up to $3 s until `list` shows device $1 with capacity $2.
wait_capacity() {
  local i
  for i in $(seq $(($3 * 10))); do
    [ "$(field "$1" .capacity_bytes)" = "$2" ] && return 0
    sleep 0.1
  done
  return 1
}
# One NBD operation in python: nbd_py URI CODE (h is the handle).
nbd_py() {
  /usr/bin/python3 - "$1" <<EOF
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
$2
EOF
}

ceph_test_start 1024
"$softblk" daemon --stop-timeout 3000 || fail "the daemon did not start"

# ---------------------------------------------------------------- queues + monitor
note "2 queues under fio verify across a monitor outage"
out=$(sb add rbd image=mq create=1 size=64M submit_queues=2 "$conf" --export fuse --name mq 2>&1) ||
  fail "add mq: $out"
loop=$(awk '$1 == "loop:" {print $2}' <<<"$out")
file=$(awk '$1 == "file:" {print $2}' <<<"$out")
[ -b "$loop" ] && [ -f "$file" ] || fail "no loop device or file in: $out"
[ "$(field mq .submit_queues)" = 2 ] || fail "mq does not have 2 queues: $(sb list --json)"
fio --name=verify --filename="$loop" --rw=randwrite --bs=4k --size=32M --loops=8 \
  --ioengine=libaio --iodepth=16 --direct=1 --verify=crc32c --verify_fatal=1 \
  --do_verify=1 --verify_state_save=0 --output="$work/fio.txt" >/dev/null 2>&1 &
fio_pid=$!
bg_pids+=("$fio_pid")
sleep 2
ceph_stop_mon
sleep 5
alive "$fio_pid" || fail "fio ended while the monitor was down: $(cat "$work/fio.txt")"
ceph_start_mon || fail "the monitor did not come back"
wait "$fio_pid" || { cat "$work/fio.txt"; fail "fio verify across the monitor outage"; }
grep -q "err= 0" "$work/fio.txt" || { cat "$work/fio.txt"; fail "fio reported errors"; }
echo "ok: 2 queues, fio verify across a monitor outage"

# ---------------------------------------------------------------- resize
note "resize: FUSE file and loop device"
rbd_cmd resize --no-progress --size 96M rbd/mq >/dev/null 2>&1 || fail "rbd resize mq"
wait_capacity mq $((96 * MiB)) 20 || fail "list does not show the new size: $(sb list --json)"
[ "$(stat -c %s "$file")" = $((96 * MiB)) ] || fail "the FUSE file did not grow: $(stat -c %s "$file")"
for _ in $(seq 50); do [ "$(blockdev --getsize64 "$loop")" = $((96 * MiB)) ] && break; sleep 0.1; done
[ "$(blockdev --getsize64 "$loop")" = $((96 * MiB)) ] || fail "$loop did not grow: $(blockdev --getsize64 "$loop")"
head -c $MiB /dev/urandom >"$work/tail.bin"
dd if="$work/tail.bin" of="$loop" bs=1M seek=90 oflag=direct conv=fsync status=none ||
  fail "writing beyond the old end of $loop"
cmp <(dd if="$loop" bs=1M skip=90 count=1 iflag=direct status=none) "$work/tail.bin" ||
  fail "the grown part of $loop does not read back"
sb list | grep -q "^mq .*96" || fail "softblk list does not show 96 MiB: $(sb list)"
echo "ok: the FUSE file and $loop grew to 96 MiB"

note "resize: NBD (new connections see the new size)"
out=$(sb add rbd image=rz create=1 size=32M "$conf" --export nbd --name rz 2>&1) || fail "add rz: $out"
rz=$(uri_of "$out")
# One connection held open across both resizes.
mkfifo "$work/held.in"
/usr/bin/python3 - "$rz" "$work/held.in" >"$work/held.out" 2>&1 <<'EOF' &
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
print("size", h.get_size(), flush=True)
for line in open(sys.argv[2]):
    try:
        h.pread(4096, int(line))
        print("read ok", flush=True)
    except nbd.Error as e:
        print("read failed", e.errno, flush=True)
EOF
held=$!
bg_pids+=("$held")
exec 7>"$work/held.in"
for _ in $(seq 100); do grep -q "^size" "$work/held.out" && break; sleep 0.1; done
grep -q "^size $((32 * MiB))" "$work/held.out" || fail "held connection: $(cat "$work/held.out")"
rbd_cmd resize --no-progress --size 48M rbd/rz >/dev/null 2>&1 || fail "rbd resize rz"
wait_capacity rz $((48 * MiB)) 20 || fail "list does not show rz's new size"
nbd_py "$rz" "
assert h.get_size() == 48 << 20, h.get_size()
h.pwrite(b'\x5a' * 4096, 40 << 20)
assert h.pread(4096, 40 << 20) == b'\x5a' * 4096" || fail "a new connection after the growth"
rbd_cmd resize --no-progress --allow-shrink --size 16M rbd/rz >/dev/null 2>&1 || fail "rbd resize --allow-shrink rz"
wait_capacity rz $((16 * MiB)) 20 || fail "list does not show rz's shrunk size"
nbd_py "$rz" "assert h.get_size() == 16 << 20, h.get_size()" || fail "a new connection after the shrink"
# The held connection was told 32 MiB: inside the new end it reads, beyond
# it the device refuses (EIO, as the block layer beyond a device's end).
echo $((8 * MiB)) >&7
echo $((20 * MiB)) >&7
exec 7>&-
wait "$held" 2>/dev/null
sed -n 2,3p "$work/held.out" | tr '\n' ' ' | grep -q "read ok read failed EIO" ||
  fail "held connection after the shrink: $(cat "$work/held.out")"
echo "ok: NBD new connections see 48 MiB then 16 MiB; an open one reads inside 16 MiB, EIO beyond"

# ---------------------------------------------------------------- OSD outage
note "devices for the OSD outage (one NBD server, one loop)"
# m0 first: the server's loop count comes from the first export's queues (1).
out=$(sb add rbd image=mimg create=1 size=64M "$conf" --export nbd --name m0 2>&1) || fail "add m0: $out"
m0=$(uri_of "$out")
out=$(sb add null memory_backed=1 size=16 --export nbd --name n0 2>&1) || fail "add n0: $out"
n0=$(uri_of "$out")
out=$(sb add rbd image=timg create=1 size=64M osd_op_timeout=5 "$conf" --export nbd --name t0 2>&1) ||
  fail "add t0: $out"
t0uri=$(uri_of "$out")
out=$(sb add rbd image=dimg create=1 size=64M "$conf" --export nbd --name d0 2>&1) || fail "add d0: $out"
d0=$(uri_of "$out")
nbd_py "$m0" "h.pwrite(b'\x11' * (1 << 20), 8 << 20); h.flush()" || fail "writing m0"
[ "$(nbdinfo --map "$m0" | grep -c data)" = 1 ] || fail "m0's map before the outage: $(nbdinfo --map "$m0")"

note "the OSD stopped"
ceph_stop_osd
# A map that waits for the OSD, and a write that does.
timeout 300 nbdinfo --map "$m0" >"$work/map.txt" 2>&1 &
map_pid=$!
bg_pids+=("$map_pid")
nbd_py "$d0" "h.pwrite(b'\x22' * 4096, 0, nbd.CMD_FLAG_FUA)" >/dev/null 2>&1 &
bg_pids+=("$!")
sleep 2
alive "$map_pid" || fail "the map of m0 ended while the OSD was down: $(cat "$work/map.txt")"
t=$(now_ms)
timeout 20 /usr/bin/python3 -c "
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
h.pwrite(b'\x33' * 65536, 0)
assert h.pread(65536, 0) == b'\x33' * 65536" "$n0" || fail "n0 (same NBD loop) did not serve while m0's map waited"
took=$(($(now_ms) - t))
[ "$took" -le 5000 ] || fail "n0 took $took ms while m0's map waited"
echo "ok: n0 served in $took ms while m0's BLOCK_STATUS waited for the OSD"

t=$(now_ms)
nbd_py "$t0uri" "
try:
    h.pread(65536, 32 << 20)
    raise SystemExit('read on t0 succeeded with the OSD down')
except nbd.Error as e:
    print('t0 read failed:', e)" || fail "t0 (osd_op_timeout=5)"
took=$(($(now_ms) - t))
[ "$took" -ge 3000 ] && [ "$took" -le 30000 ] || fail "t0's read failed after $took ms (osd_op_timeout=5)"
[ "$(field t0 .target.io_errors)" -ge 1 ] 2>/dev/null || echo "note: io_errors: $(field t0 .target)"
echo "ok: t0's read failed after $took ms (osd_op_timeout=5)"
timeout 20 /usr/bin/python3 -c "
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
assert h.pread(65536, 0) == b'\x33' * 65536" "$n0" || fail "n0 after t0's timeout"
timeout 10 "$softblk" list >/dev/null || fail "the daemon does not answer during the outage"

t=$(now_ms)
del_rc=0
timeout 60 "$softblk" del d0 >"$work/del.txt" 2>&1 || del_rc=$?
took=$(($(now_ms) - t))
[ "$del_rc" != 124 ] && [ "$took" -le 15000 ] || fail "del d0 during the outage took $took ms (rc $del_rc)"
echo "ok: del d0 with a write held by the outage answered in $took ms (rc $del_rc: $(head -c 200 "$work/del.txt"))"

for args in "connect_timeout=5:connect_timeout=5 s" "osd_op_timeout=3:osd_op_timeout=3 s"; do
  t=$(now_ms)
  err=$(timeout 100 "$softblk" add rbd image=mimg "$conf" "${args%%:*}" --export none --name late 2>&1) &&
    fail "add while the OSD is down succeeded (${args%%:*})"
  took=$(($(now_ms) - t))
  grep -q "no OSD answered within ${args#*:}" <<<"$err" || fail "add with the OSD down (${args%%:*}): $err"
  [ "$took" -le 40000 ] || fail "add with the OSD down took $took ms (${args%%:*})"
  echo "ok: add refused in $took ms: $err"
done
sb list | grep -q "^late " && fail "a refused add left a device"

note "the OSD back"
ceph_start_osd || fail "the OSD did not come back"
wait "$map_pid" || fail "m0's map after the outage: $(cat "$work/map.txt")"
grep -Eq "^ +8388608 +1048576 +0 +data" "$work/map.txt" || fail "m0's map after the outage: $(cat "$work/map.txt")"
nbd_py "$t0uri" "h.pread(65536, 32 << 20)" || fail "t0 does not serve again after the outage"
# The NBD export waits 10 s for its connections' requests, then its stop
# fails and the device stays (the del during the outage said so): once
# the OSD is back, del removes it.
for _ in $(seq 50); do sb list | grep -q "^d0 " || break; sleep 0.1; done
if sb list | grep -q "^d0 "; then
  echo "d0 stayed after its del failed; del again"
  sb del d0 >"$work/del.txt" 2>&1 || fail "del d0 after the outage: $(cat "$work/del.txt")"
fi
sb list | grep -q "^d0 " && fail "d0 is still there after the OSD came back: $(sb list)"
echo "ok: the map completed, t0 serves again, d0 is gone"

for d in mq rz m0 n0 t0; do sb del "$d" >/dev/null || fail "del $d"; done
echo PASS
