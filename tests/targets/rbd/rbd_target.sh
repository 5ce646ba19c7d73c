#!/usr/bin/env bash
# The rbd target end to end against a real single-node Ceph cluster that
# this script starts in a temporary directory (tests/targets/rbd/lib_ceph.sh: one
# monitor, one memstore OSD, replication size 1) and tears down on exit,
# even on failure:
#   - errors at add time: a missing pool, image and snapshot, bad
#     credentials and an unreachable cluster (within connect_timeout);
#   - NBD: data written through the export equals `rbd export` of the image
#     byte for byte; the allocation map (nbdinfo --map, rbd_diff_iterate2)
#     shows the holes; discard is reflected in `rbd du` and the map; write
#     zeroes reads back as zeros (with and without unmap);
#   - a snapshot served read-only (snap=): writes refused, the snapshot's
#     data while the image moves on;
#   - FUSE + loop (root): fio verify (crc32c, libaio, QD 16, O_DIRECT);
#   - kill -9 of the daemon during FUA writes, then the next daemon
#     re-opens the image: every acknowledged write is there;
#   - the OSD stopped (SIGTERM) under I/O and started again: the writes
#     that waited complete, nothing acknowledged is lost.
# Usage: rbd_target.sh PATH/TO/softblk          (exit 77: skipped)
softblk=${1:?usage: $0 PATH/TO/softblk}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../../support/lib_cli.sh
set -euo pipefail  # before the library, so that a missing one stops the test
source "$here/../../support/lib_cli.sh"
# shellcheck source=lib_ceph.sh
source "$here/lib_ceph.sh"
sb() { timeout 120 "$softblk" "$@"; }
ceph_test_requires

setup_run_dir rbd
work=$run_dir/work
mkdir -p "$work"
writer_pid=
# Before lib_cli's own cleanup (daemons, mounts, loop devices): the
# writer, the daemon's devices while the cluster still serves them, then
# the cluster.
extra_cleanup=('[ -n "$writer_pid" ] && kill -9 "$writer_pid"'
  'sb shutdown --force >/dev/null 2>&1' 'ceph_stop')
uri_of() { awk '$1 == "uri:" {print $2}' <<<"$1"; }
MiB=$((1 << 20))
# `rbd export` of img0 into a new file.
rbd_export() { rm -f "$1"; rbd_cmd export --no-progress rbd/img0 "$1" >/dev/null 2>&1 || fail "rbd export"; }

ceph_test_start 1536

# ---------------------------------------------------------------- errors
note "errors at add time"
err=$(sb add rbd pool=nopool image=x "$conf" --export none --name bad 2>&1) && fail "a missing pool was accepted"
grep -q "pool=nopool: no such pool" <<<"$err" || fail "missing pool: $err"
err=$(sb add rbd image=nothere "$conf" --export none --name bad 2>&1) && fail "a missing image was accepted"
grep -q "image=nothere: no such image in pool rbd" <<<"$err" || fail "missing image: $err"
# A keyring whose key the cluster does not know.
ceph-authtool --create-keyring "$work/wrong.keyring" --gen-key -n client.admin >/dev/null
err=$(sb add rbd image=x "$conf" "keyring=$work/wrong.keyring" connect_timeout=5 --export none --name bad 2>&1) &&
  fail "a wrong key was accepted"
grep -q "cannot connect to the cluster" <<<"$err" || fail "wrong key: $err"
# A monitor address nobody listens on: refused within connect_timeout.
sed "s/^mon host = .*/mon host = v1:127.0.0.1:9/" "$CEPH_CONF" >"$work/dead.conf"
t0=$(date +%s)
err=$(sb add rbd image=x "conf=$work/dead.conf" connect_timeout=3 --export none --name bad 2>&1) &&
  fail "an unreachable cluster was accepted"
took=$(($(date +%s) - t0))
grep -q "cannot connect to the cluster" <<<"$err" || fail "unreachable cluster: $err"
[ "$took" -le 30 ] || fail "an unreachable cluster took $took s to refuse (connect_timeout=3)"
err=$(sb add rbd image=x "conf=$work/missing.conf" --export none --name bad 2>&1) && fail "a missing conf was accepted"
grep -q "conf=$work/missing.conf" <<<"$err" || fail "missing conf: $err"
sb list | grep -q "^bad " && fail "a refused add left a device"
echo "ok: errors (unreachable cluster refused in $took s)"

# ---------------------------------------------------------------- NBD
note "NBD export of a new image: data, rbd export, allocation map"
out=$(sb add rbd image=img0 create=1 size=128M "$conf" --export nbd --name r0 2>&1) || fail "add: $out"
uri=$(uri_of "$out")
[ -n "$uri" ] || fail "no NBD URI in: $out"
rbd_cmd info rbd/img0 | grep -q "size 128 MiB" || fail "create=1 size=128M did not make a 128 MiB image"
head -c $((8 * MiB)) /dev/urandom >"$work/data.bin"
# 8 MiB at 16 MiB (objects 4 and 5 of 4 MiB), half with FUA; the rest of
# the image stays unallocated.
/usr/bin/python3 - "$uri" "$work/data.bin" <<'EOF' || fail "writing through NBD"
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
assert h.can_fua() and h.can_trim() and h.can_zero() and h.can_flush()
data = open(sys.argv[2], "rb").read()
for i, off in enumerate(range(0, len(data), 1 << 20)):
    h.pwrite(data[off:off + (1 << 20)], (16 << 20) + off, nbd.CMD_FLAG_FUA if i % 2 else 0)
h.flush()
assert h.pread(len(data), 16 << 20) == data
h.shutdown()
EOF
rbd_export "$work/export.bin"
cmp <(tail -c +$((16 * MiB + 1)) "$work/export.bin" | head -c $((8 * MiB))) "$work/data.bin" ||
  fail "rbd export does not hold what was written"
cmp <(head -c $((16 * MiB)) "$work/export.bin") <(head -c $((16 * MiB)) /dev/zero) ||
  fail "rbd export: the unwritten start is not zeros"
map=$(nbdinfo --map "$uri")
grep -Eq "^ +0 +16777216 +3 +hole,zero" <<<"$map" || fail "base:allocation: no hole before the data: $map"
grep -Eq "^ +16777216 +8388608 +0 +data" <<<"$map" || fail "base:allocation: the data is not at 16 MiB: $map"
grep -Eq "^ +25165824 +109051904 +3 +hole,zero" <<<"$map" || fail "base:allocation: no hole after the data: $map"
echo "ok: NBD data = rbd export, base:allocation"

note "discard and write zeroes"
used() { rbd_cmd du rbd/img0 2>/dev/null | awk '$1 == "img0" {print $4 $5}'; }
[ "$(used)" = 8MiB ] || fail "rbd du: expected 8 MiB used before the discard, got $(used)"
/usr/bin/python3 - "$uri" <<'EOF' || fail "discard / write zeroes through NBD"
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
h.trim(4 << 20, 20 << 20)          # object 5: 20..24 MiB
h.zero(1 << 20, 17 << 20)          # 17..18 MiB, may unmap
h.zero(1 << 20, 18 << 20, nbd.CMD_FLAG_NO_HOLE)  # 18..19 MiB, stays allocated
h.flush()
assert h.pread(1 << 20, 17 << 20) == bytes(1 << 20)
assert h.pread(1 << 20, 18 << 20) == bytes(1 << 20)
h.shutdown()
EOF
[ "$(used)" = 4MiB ] || fail "rbd du: the discard of object 5 did not free it (used $(used))"
map=$(nbdinfo --map "$uri")
grep -Eq "^ +16777216 +4194304 +0 +data" <<<"$map" || fail "base:allocation after discard: $map"
grep -Eq "^ +20971520 +113246208 +3 +hole,zero" <<<"$map" || fail "base:allocation after discard: $map"
rbd_export "$work/export.bin"
cmp <(tail -c +$((17 * MiB + 1)) "$work/export.bin" | head -c $((2 * MiB))) <(head -c $((2 * MiB)) /dev/zero) ||
  fail "rbd export: the zeroed range is not zeros"
cmp <(tail -c +$((19 * MiB + 1)) "$work/export.bin" | head -c $((1 * MiB))) \
  <(tail -c +$((3 * MiB + 1)) "$work/data.bin" | head -c $((1 * MiB))) ||
  fail "rbd export: write zeroes touched data next to it"
echo "ok: discard in rbd du and the map, write zeroes"

# ---------------------------------------------------------------- snapshot
note "a snapshot served read-only"
rbd_cmd snap create rbd/img0@s1 >/dev/null 2>&1 || fail "rbd snap create"
cp "$work/export.bin" "$work/s1.bin"
out=$(sb add rbd image=img0 snap=s1 "$conf" --export nbd --name r0s 2>&1) || fail "add snap: $out"
suri=$(uri_of "$out")
err=$(sb add rbd image=img0 snap=nosnap "$conf" --export none --name bad 2>&1) && fail "a missing snapshot was accepted"
grep -q "snap=nosnap: image rbd/img0 has no such snapshot" <<<"$err" || fail "missing snapshot: $err"
/usr/bin/python3 - "$uri" "$suri" "$work/s1.bin" <<'EOF' || fail "snapshot"
import nbd, sys
head = nbd.NBD(); head.connect_uri(sys.argv[1])
snap = nbd.NBD(); snap.connect_uri(sys.argv[2])
assert snap.is_read_only(), "the snapshot's export is writable"
head.pwrite(b"\xab" * (1 << 20), 16 << 20)   # the image moves on
head.flush()
s1 = open(sys.argv[3], "rb").read()
assert snap.pread(4 << 20, 16 << 20) == s1[16 << 20:20 << 20], "the snapshot changed"
assert head.pread(1 << 20, 16 << 20) == b"\xab" * (1 << 20)
try:
    snap.pwrite(b"x" * 4096, 0)
    raise SystemExit("a write to the snapshot succeeded")
except nbd.Error:
    pass
head.shutdown(); snap.shutdown()
EOF
sb del r0s >/dev/null || fail "del r0s"
sb list --json | grep -q '"snap"' && fail "del r0s left the device"
echo "ok: snapshot"

# ---------------------------------------------------------------- kill -9
note "kill -9 of the daemon during FUA writes"
# The writer logs each block's number once its FUA write is acknowledged;
# after the kill every logged block must hold its pattern.
cat >"$work/writer.py" <<'EOF'
import nbd, sys, time
h = nbd.NBD(); h.connect_uri(sys.argv[1])
log = open(sys.argv[2], "w", buffering=1)
start, count = int(sys.argv[3]), int(sys.argv[4])
for i in range(count):
    blk = (start + i) % 16384            # 64 MiB of 4 KiB blocks from 32 MiB
    h.pwrite((b"%08d" % (start + i)) * 512, (32 << 20) + blk * 4096, nbd.CMD_FLAG_FUA)
    log.write("%d\n" % (start + i))
EOF
/usr/bin/python3 "$work/writer.py" "$uri" "$work/acked.txt" 0 1000000 2>/dev/null &
writer_pid=$!
for _ in $(seq 200); do [ "$(cat "$work/acked.txt" 2>/dev/null | wc -l)" -ge 200 ] && break; sleep 0.1; done
pid=$(cat "$run_dir/daemon.pid")
kill -KILL "$pid"
wait "$writer_pid" 2>/dev/null || true
writer_pid=
acked=$(wc -l <"$work/acked.txt")
[ "$acked" -ge 1 ] || fail "no write was acknowledged before the kill"
sb recover >/dev/null || fail "recover after SIGKILL"
sb list | grep -q "^r0 .* running" || fail "r0 did not come back: $(sb list)"
/usr/bin/python3 - "$uri" "$work/acked.txt" <<'EOF' || fail "acknowledged FUA writes lost after kill -9"
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
acked = [int(l) for l in open(sys.argv[2]) if l.strip()]
last = {}
for n in acked:
    last[n % 16384] = n
bad = [n for blk, n in last.items()
       if h.pread(4096, (32 << 20) + blk * 4096) != (b"%08d" % n) * 512]
assert not bad, "%d acknowledged blocks lost, first %s" % (len(bad), bad[:5])
print("verified %d acknowledged writes" % len(acked))
EOF
echo "ok: kill -9 ($acked acknowledged writes verified)"

# ---------------------------------------------------------------- OSD outage
note "the OSD stopped under I/O and started again"
rm -f "$work/acked.txt"
/usr/bin/python3 "$work/writer.py" "$uri" "$work/acked.txt" 100000 600 2>"$work/writer.err" &
writer_pid=$!
for _ in $(seq 200); do [ "$(cat "$work/acked.txt" 2>/dev/null | wc -l)" -ge 100 ] && break; sleep 0.1; done
ceph_stop_osd
before=$(wc -l <"$work/acked.txt")
sleep 3
during=$(wc -l <"$work/acked.txt")
[ "$during" -le $((before + 1)) ] || fail "writes were acknowledged while the OSD was down ($before -> $during)"
sb list >/dev/null || fail "the daemon does not answer while the OSD is down"
ceph_start_osd || fail "the OSD did not come back"
wait "$writer_pid" || { cat "$work/writer.err"; fail "the writer failed across the OSD restart"; }
writer_pid=
[ "$(wc -l <"$work/acked.txt")" = 600 ] || fail "not every write completed after the OSD came back"
/usr/bin/python3 - "$uri" "$work/acked.txt" <<'EOF' || fail "data lost across the OSD restart"
import nbd, sys
h = nbd.NBD(); h.connect_uri(sys.argv[1])
for n in (int(l) for l in open(sys.argv[2]) if l.strip()):
    blk = n % 16384
    assert h.pread(4096, (32 << 20) + blk * 4096) == (b"%08d" % n) * 512, n
EOF
echo "ok: OSD outage (writes waited, then completed; data verified)"

# ---------------------------------------------------------------- FUSE + loop
note "FUSE export + loop: fio verify"
if [ "$(id -u)" -ne 0 ] || [ ! -c /dev/fuse ] || [ ! -c /dev/loop-control ]; then
  echo "SKIP (part): FUSE + loop needs root, /dev/fuse and /dev/loop-control"
else
  out=$(sb add rbd image=img1 create=1 size=128M "$conf" --export fuse --name r1 2>&1) || fail "add r1: $out"
  loop=$(awk '$1 == "loop:" {print $2}' <<<"$out")
  [ -b "$loop" ] || fail "no loop device in: $out"
  fio --name=verify --filename="$loop" --rw=randwrite --bs=4k --size=64M --io_size=32M \
    --ioengine=libaio --iodepth=16 --direct=1 --verify=crc32c --verify_fatal=1 \
    --do_verify=1 --verify_state_save=0 --output="$work/fio.txt" >/dev/null 2>&1 || { cat "$work/fio.txt"; fail "fio verify on $loop"; }
  grep -q "err= 0" "$work/fio.txt" || { cat "$work/fio.txt"; fail "fio reported errors"; }
  sb del r1 >/dev/null || fail "del r1"
  echo "ok: FUSE + loop fio verify"
fi
sb del r0 >/dev/null || fail "del r0"
echo PASS
