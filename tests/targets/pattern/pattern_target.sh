#!/usr/bin/env bash
# The pattern target (docs/pattern.md) end to end with the softblk daemon:
# every way in that this host has, each read checked against the pattern
# (each 8-byte word holds its own byte offset, big-endian) and a write
# refused:
#   - the CLI: `softblk add pattern`, `features pattern` (its options from
#     the table), `get` (configfs-style key=value), `list --json`, and
#     option errors;
#   - NBD: nbdcopy of the whole device, libnbd reads at odd offsets, a
#     pwrite refused, nbdinfo says read-only;
#   - vhost-user-blk, read by softblk's own virtio driver (`add virtio`)
#     exported through NBD;
#   - FUSE + loop (root, /dev/fuse, /dev/loop-control): the loop device is
#     read-only and reads back the pattern;
#   - ublk (when /dev/ublk-control exists): /dev/ublkbN likewise.
# The in-process API is pattern_target_test.cpp's. The `softblk nullb`
# configfs tree makes null devices only, as /sys/kernel/config/nullb does.
# Usage: pattern_target.sh PATH/TO/softblk         (exit 77: skipped)
set -euo pipefail

softblk=${1:?usage: $0 PATH/TO/softblk}
skip() { echo "SKIP: $*"; exit 77; }
sb() { timeout 60 "$softblk" "$@"; }
for tool in nbdinfo nbdcopy /usr/bin/python3; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/install-deps.sh)"
done
/usr/bin/python3 -c "import nbd" 2>/dev/null || skip "python3-libnbd is not installed (scripts/install-deps.sh)"

run_dir=$(mktemp -d /tmp/softblk-pattern.XXXXXX)
export SOFTBLK_RUN_DIR=$run_dir
work=$run_dir/work
mkdir -p "$work"
source "$(dirname "$0")/../../support/lib_run_dir.sh"
cleanup() {
  set +e
  clear_run_dir "$run_dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; [ -f "$run_dir/daemon.log" ] && tail -20 "$run_dir/daemon.log" >&2; exit 1; }
note() { echo "== $*"; }
field() { awk -v k="$1:" '$1 == k {print $2}' <<<"$2"; }

# check_file PATH SIZE: PATH (a block device or file) holds the pattern:
# read whole, and at odd offsets; a write is refused.
check_file() {
  /usr/bin/python3 - "$1" "$2" <<'PY' || fail "$1 does not hold the pattern"
import errno, os, struct, sys
path, size = sys.argv[1], int(sys.argv[2])
def check(buf, off):
    for i in range(0, len(buf) - 7, 8):
        (word,) = struct.unpack_from(">Q", buf, i)
        if word != off + i:
            raise SystemExit(f"{path}: word at {off + i} holds {word}")
fd = os.open(path, os.O_RDONLY)
assert os.lseek(fd, 0, os.SEEK_END) == size, f"{path}: size {os.lseek(fd, 0, os.SEEK_END)}, not {size}"
off = 0
while off < size:
    buf = os.pread(fd, 1 << 20, off)
    assert buf, f"{path}: short read at {off}"
    check(buf, off)
    off += len(buf)
for off, n in ((0, 8), (4096 * 7 + 512, 1536), (size - 512, 512), (size // 3 // 4096 * 4096, 128 << 10)):
    check(os.pread(fd, n, off), off)
os.close(fd)
try:
    fd = os.open(path, os.O_WRONLY)
    os.pwrite(fd, b"x" * 4096, 0)
    os.fsync(fd)
    raise SystemExit(f"{path}: a write was accepted")
except OSError as e:
    assert e.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO), e
PY
}

# check_nbd URI SIZE: the export holds the pattern (nbdcopy whole, libnbd
# at odd offsets), says it is read-only and refuses a write.
check_nbd() {
  nbdcopy "$1" "$work/copy.bin" || fail "nbdcopy $1"
  /usr/bin/python3 - "$work/copy.bin" "$2" <<'PY' || fail "nbdcopy of $1 does not hold the pattern"
import struct, sys
data = open(sys.argv[1], "rb").read()
assert len(data) == int(sys.argv[2]), len(data)
words = struct.unpack(f">{len(data) // 8}Q", data)
bad = next((i for i, w in enumerate(words) if w != i * 8), None)
assert bad is None, f"word at {bad * 8} holds {words[bad]}"
PY
  rm -f "$work/copy.bin"
  /usr/bin/python3 - "$1" "$2" <<'PY' || fail "libnbd reads or the write refusal of $1"
import nbd, struct, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
size = int(sys.argv[2])
assert h.get_size() == size, h.get_size()
assert h.is_read_only(), "the export is not read-only"
for off, n in ((0, 4096), (4096 * 3, 8192), (size - 4096, 4096), (size // 2 // 4096 * 4096, 299008)):
    buf = h.pread(n, off)
    for i in range(0, n - 7, 8):
        (word,) = struct.unpack_from(">Q", buf, i)
        assert word == off + i, f"word at {off + i} holds {word}"
try:
    h.pwrite(b"x" * 512, 0)
    raise SystemExit("a write through NBD was accepted")
except nbd.Error as e:
    print("write refused:", e)
h.shutdown()
PY
  nbdinfo "$1" | grep -Eq "is_read_only: *true" || fail "nbdinfo does not say $1 is read-only"
}

# ---------------------------------------------------------------- CLI
note "CLI: add, features, get, list --json, errors"
out=$(sb add pattern --name p0 size=8M --export nbd 2>&1) || fail "add pattern: $out"
uri=$(field uri "$out")
[ -n "$uri" ] || fail "no NBD URI in: $out"
feat=$(sb features pattern) || fail "features pattern"
for opt in size blocksize; do
  grep -Eq "^ *$opt\b" <<<"$feat" || fail "features pattern does not list $opt: $feat"
done
sb features --json | /usr/bin/python3 -c '
import json, sys
t = {t["name"]: t for t in json.load(sys.stdin)["targets"]}["pattern"]
o = {o["name"]: o for o in t["options"]}
assert o["size"]["default"] == "1G", o["size"]
assert o["blocksize"]["default"] == "512" and o["blocksize"]["alias"] == "bs", o["blocksize"]
' || fail "features --json: the pattern type's options"
got=$(sb get p0) || fail "get p0"
grep -qx "size=8M" <<<"$got" || fail "get p0 does not show size=8M: $got"
grep -qx "blocksize=512" <<<"$got" || fail "get p0 does not show blocksize=512: $got"
[ "$(sb get p0 size)" = 8M ] || fail "get p0 size: $(sb get p0 size)"
sb list --json | /usr/bin/python3 -c '
import json, sys
devs = json.load(sys.stdin)
devs = devs["devices"] if isinstance(devs, dict) else devs
d = [d for d in devs if d["name"] == "p0"][0]
assert d["type"] == "pattern", d
text = json.dumps(d)
assert "8388608" in text, "capacity 8388608 not in " + text
assert "\"read_only\": true" in text, "not read-only: " + text
' || fail "list --json does not show p0 as an 8 MiB read-only pattern device: $(sb list --json)"
err=$(sb add pattern --name bad size=1000 --export nbd 2>&1) && fail "size=1000 was accepted"
grep -q "multiple of blocksize" <<<"$err" || fail "the size error does not say what to give: $err"
err=$(sb add pattern --name bad bs=3072 --export nbd 2>&1) && fail "bs=3072 was accepted"
grep -q "4096" <<<"$err" || fail "the block size error does not name the sizes: $err"
echo "ok: CLI"

# ---------------------------------------------------------------- NBD
note "NBD: nbdcopy, libnbd reads, a write refused"
check_nbd "$uri" $((8 << 20))
echo "ok: NBD"

# ---------------------------------------------------------------- vhost-user-blk
note "vhost-user-blk, read by softblk's virtio driver through NBD"
out=$(sb add pattern --name pv size=4M bs=4096 --export vhost-user-blk 2>&1) || fail "add pv: $out"
sock=$(field socket "$out")
[ -S "$sock" ] || fail "no socket in: $out"
out=$(sb add virtio "path=$sock" poll_queues=0 --name v0 --export nbd 2>&1) || fail "add virtio: $out"
vuri=$(field uri "$out")
[ -n "$vuri" ] || fail "no NBD URI in: $out"
check_nbd "$vuri" $((4 << 20))
sb del v0 >/dev/null || fail "del v0"
sb del pv >/dev/null || fail "del pv"
echo "ok: vhost-user-blk"

# ---------------------------------------------------------------- FUSE + loop
note "FUSE + loop"
if [ "$(id -u)" -ne 0 ] || [ ! -c /dev/fuse ] || [ ! -c /dev/loop-control ]; then
  echo "SKIP (part): FUSE + loop needs root, /dev/fuse and /dev/loop-control"
else
  out=$(sb add pattern --name pf size=16M --export fuse 2>&1) || fail "add pf: $out"
  loop=$(field loop "$out")
  [ -b "$loop" ] || fail "no loop device in: $out"
  [ "$(blockdev --getro "$loop")" = 1 ] || fail "$loop is not read-only"
  check_file "$loop" $((16 << 20))
  check_file "$(field file "$out")" $((16 << 20))
  sb del pf >/dev/null || fail "del pf"
  echo "ok: FUSE + loop"
fi

# ---------------------------------------------------------------- ublk
note "ublk"
if [ "$(id -u)" -ne 0 ] || [ ! -c /dev/ublk-control ]; then
  echo "SKIP (part): ublk needs root and /dev/ublk-control (modprobe ublk_drv)"
else
  out=$(sb add pattern --name pu size=16M --export ublk 2>&1) || fail "add pu: $out"
  dev=$(field device "$out")
  [ -b "$dev" ] || fail "no block device in: $out"
  [ "$(blockdev --getro "$dev")" = 1 ] || fail "$dev is not read-only"
  check_file "$dev" $((16 << 20))
  sb del pu >/dev/null || fail "del pu"
  echo "ok: ublk"
fi
sb del p0 >/dev/null || fail "del p0"
echo PASS
