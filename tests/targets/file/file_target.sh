#!/usr/bin/env bash
# The file target end to end with the softblk daemon on this machine:
#   - NBD: data written through the export is in the image (qemu-img
#     compare of the export against the image file), and the allocation
#     map shows the holes (nbdinfo --map base:allocation);
#   - restart: the daemon killed with SIGKILL, then shut down cleanly: each
#     time the next daemon re-opens the file (not re-created, not
#     truncated) and the data is still there;
#   - FUSE + loop (root): lseek SEEK_DATA/SEEK_HOLE on the FUSE file shows
#     the image's holes; mkfs.ext4 on the loop device, files copied in,
#     e2fsck -fn clean; `softblk set e0 size=320M` grows the image, the
#     FUSE file and the loop device; then e2fsck -fn of the image file;
#   - `softblk fat` on a file device: fsck.fat -n and mtools on the image;
#   - bad input through the CLI: errors name the path, nothing is created.
# (Debian's python3-libnbd, imported by /usr/bin/python3.)
# Usage: file_target.sh PATH/TO/softblk          (exit 77: skipped)
set -euo pipefail

softblk=${1:?usage: $0 PATH/TO/softblk}
skip() { echo "SKIP: $*"; exit 77; }
sb() { timeout 60 "$softblk" "$@"; }
for tool in qemu-img nbdinfo /usr/bin/python3; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/install-deps.sh)"
done

run_dir=$(mktemp -d /tmp/softblk-filetarget.XXXXXX)
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
uri_of() { awk '$1 == "uri:" {print $2}' <<<"$1"; }

# ---------------------------------------------------------------- NBD
note "NBD export of a new sparse image"
img=$work/disk.img
out=$(sb add file "path=$img" size=64M create=1 --export nbd --name f0 2>&1) || fail "add: $out"
uri=$(uri_of "$out")
[ -n "$uri" ] || fail "no NBD URI in: $out"
[ "$(stat -c %s "$img")" = $((64 << 20)) ] || fail "the image is not 64 MiB"
head -c $((8 << 20)) /dev/urandom >"$work/data.bin"
# 8 MiB at 1 MiB; the rest stays a hole.
/usr/bin/python3 - "$uri" "$work/data.bin" <<'EOF' || fail "writing through NBD"
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
data = open(sys.argv[2], "rb").read()
for off in range(0, len(data), 1 << 20):
    h.pwrite(data[off:off + (1 << 20)], (1 << 20) + off)
h.flush()
h.shutdown()
EOF
qemu-img compare -f raw -F raw "$img" "$uri" >/dev/null || fail "qemu-img compare: the image differs from the export"
cmp <(tail -c +$(((1 << 20) + 1)) "$img" | head -c $((8 << 20))) "$work/data.bin" ||
  fail "the image does not hold what was written"
map=$(nbdinfo --map "$uri")
grep -q "hole,zero" <<<"$map" || fail "base:allocation shows no hole: $map"
grep -Eq "^ +1048576 +8388608 +0 +data" <<<"$map" || fail "base:allocation does not show the data at 1 MiB: $map"
echo "ok: NBD, qemu-img compare, base:allocation"

# ---------------------------------------------------------------- restart
note "daemon killed with SIGKILL: the next one re-opens the image"
pid=$(cat "$run_dir/daemon.pid")
kill -KILL "$pid"
for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
sb recover >/dev/null || fail "recover after SIGKILL"
list=$(sb list) || fail "list after recover"
grep -q "^f0 .* running" <<<"$list" || fail "f0 did not come back: $list"
[ "$(stat -c %s "$img")" = $((64 << 20)) ] || fail "the restart changed the image's size"
qemu-img compare -f raw -F raw "$img" "$uri" >/dev/null || fail "after SIGKILL: export and image differ"
/usr/bin/python3 - "$uri" "$work/data.bin" <<'EOF' || fail "after SIGKILL the data is gone"
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
assert h.pread(8 << 20, 1 << 20) == open(sys.argv[2], "rb").read()
h.shutdown()
EOF
note "clean shutdown and recover"
sb shutdown >/dev/null || fail "shutdown"
for _ in $(seq 100); do kill -0 "$(cat "$run_dir/daemon.pid" 2>/dev/null || echo 0)" 2>/dev/null || break; sleep 0.05; done
sb recover >/dev/null || fail "recover after shutdown"
qemu-img compare -f raw -F raw "$img" "$uri" >/dev/null || fail "after shutdown: export and image differ"
echo "ok: restarts"

# ---------------------------------------------------------------- bad input
note "bad input"
err=$(sb add file "path=$work/missing.img" --export nbd --name bad 2>&1) && fail "a missing file was accepted"
grep -q "$work/missing.img" <<<"$err" || fail "the error does not name the path: $err"
[ ! -e "$work/missing.img" ] || fail "a refused add created the file"
err=$(sb add file "path=$work" --export nbd --name bad 2>&1) && fail "a directory was accepted"
grep -q "directory" <<<"$err" || fail "the error does not say directory: $err"
err=$(sb add file "path=$img" --export nbd --name bad 2>&1) && fail "a second device on one image was accepted"
grep -q "in use by another device" <<<"$err" || fail "the error does not say the image is in use: $err"
sb del f0 >/dev/null || fail "del f0"
echo "ok: errors"

# ---------------------------------------------------------------- FAT
note "softblk fat on a file device"
if command -v fsck.fat >/dev/null && command -v mtype >/dev/null; then
  fat=$work/fat.img
  # The friendly --size flag gives the file target its byte size.
  out=$(sb add file "path=$fat" --size 64M create=1 --export nbd --name fat0 2>&1) || fail "add fat0: $out"
  [ "$(stat -c %s "$fat")" = $((64 << 20)) ] || fail "--size 64M did not make a 64 MiB image"
  sb fat mkfs softblk:fat0 -n FILEDEV >/dev/null || fail "fat mkfs"
  sb fat cp softblk:fat0 "$work/data.bin" ::/data.bin || fail "fat cp"
  sb del fat0 >/dev/null || fail "del fat0"
  fsck.fat -n "$fat" >"$work/fsck.txt" 2>&1 || { cat "$work/fsck.txt"; fail "fsck.fat -n on the image"; }
  cmp <(mtype -i "$fat" ::/data.bin) "$work/data.bin" || fail "mtype read data.bin differently from the image"
  echo "ok: fat"
else
  echo "SKIP (part): fsck.fat or mtools missing"
fi

# ---------------------------------------------------------------- FUSE + loop
note "FUSE export + loop: ext4"
if [ "$(id -u)" -ne 0 ] || [ ! -c /dev/fuse ] || [ ! -c /dev/loop-control ]; then
  echo "SKIP (part): FUSE + loop needs root, /dev/fuse and /dev/loop-control"
else
  ext=$work/ext4.img
  out=$(sb add file "path=$ext" size=256M create=1 --export fuse --name e0 2>&1) || fail "add e0: $out"
  loop=$(awk '$1 == "loop:" {print $2}' <<<"$out")
  [ -b "$loop" ] || fail "no loop device in: $out"
  # FUSE lseek: the new sparse image is one hole until data is written.
  fuse_file=$(awk '$1 == "file:" {print $2}' <<<"$out")
  [ -f "$fuse_file" ] || fail "no FUSE file in: $out"
  /usr/bin/python3 - "$fuse_file" <<'EOF' || fail "FUSE lseek(SEEK_DATA/SEEK_HOLE) does not show the image's holes"
import errno, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
assert os.lseek(fd, 0, os.SEEK_HOLE) == 0
try:
    os.lseek(fd, 0, os.SEEK_DATA)
    raise SystemExit("data found in a new sparse image")
except OSError as e:
    assert e.errno == errno.ENXIO, e
os.pwrite(fd, b"x" * 4096, 1 << 20)
os.fsync(fd)
assert os.lseek(fd, 0, os.SEEK_DATA) == 1 << 20
assert os.lseek(fd, 1 << 20, os.SEEK_HOLE) == (1 << 20) + 4096
EOF
  mkfs.ext4 -q -F "$loop" || fail "mkfs.ext4"
  mkdir -p "$work/mnt"
  mount "$loop" "$work/mnt" || fail "mount"
  cp "$work/data.bin" "$work/mnt/a.bin"
  mkdir -p "$work/mnt/dir"
  for i in $(seq 20); do head -c $((i * 4099)) /dev/urandom >"$work/mnt/dir/f$i"; done
  sync
  umount "$work/mnt"
  e2fsck -fn "$loop" >"$work/fsck.txt" 2>&1 || { cat "$work/fsck.txt"; fail "e2fsck on the loop device"; }
  # A live size= (docs/file.md "Resize"): the image grows (create=1), the
  # FUSE file and its loop device follow.
  sb set e0 size=320M >/dev/null || fail "set e0 size=320M"
  [ "$(stat -c %s "$ext")" = $((320 << 20)) ] || fail "size=320M did not grow the image"
  [ "$(stat -c %s "$fuse_file")" = $((320 << 20)) ] || fail "the FUSE file did not follow size=320M"
  [ "$(blockdev --getsize64 "$loop")" = $((320 << 20)) ] || fail "the loop device did not follow size=320M"
  e2fsck -fn "$loop" >"$work/fsck.txt" 2>&1 || { cat "$work/fsck.txt"; fail "e2fsck after the resize"; }
  sb del e0 >/dev/null || fail "del e0"
  e2fsck -fn "$ext" >"$work/fsck.txt" 2>&1 || { cat "$work/fsck.txt"; fail "e2fsck on the image file"; }
  echo "ok: FUSE + loop ext4"
fi
echo PASS
