#!/usr/bin/env bash
# `softblk fat` on devices hosted by the softblk daemon (`softblk:NAME`),
# end to end with a real daemon in a private run directory:
#   - NBD export (any user): mkfs, cp -r in, ls, cat, mv, rm, mkdir, df, cp
#     out; the export copied out with nbdcopy passes fsck.fat -n and mtools
#     reads the files back byte for byte.
#   - FUSE export (root and /dev/fuse): the same through the exported file,
#     checked with fsck.fat -n and mtools on that file.
#   - a device without an export, and an unknown name: errors that name
#     the fix.
# Usage: daemon_device.sh PATH/TO/softblk        (exit 77: skipped)
set -euo pipefail

softblk=${1:?usage: $0 PATH/TO/softblk}
skip() { echo "SKIP: $*"; exit 77; }
# Every command gets a deadline, so that a hang fails the test with its
# cleanup run, instead of ctest killing the script and leaving the daemon.
sb() { timeout 60 "$softblk" "$@"; }
for tool in fsck.fat mcopy mtype; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/install-deps.sh)"
done

run_dir=$(mktemp -d /tmp/softblk-fatdaemon.XXXXXX)
export SOFTBLK_RUN_DIR=$run_dir
work=$run_dir/work
mkdir -p "$work"
daemon_pid=
cleanup() {
  set +e
  if [ -s "$run_dir/daemon.pid" ]; then daemon_pid=$(cat "$run_dir/daemon.pid"); fi
  if [ -n "$daemon_pid" ]; then
    sb del --all >/dev/null 2>&1
    kill -TERM "$daemon_pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$daemon_pid" 2>/dev/null
  fi
  findmnt -rn -o TARGET | grep "^$run_dir/" | sort -r | while read -r m; do umount -l "$m"; done
  rm -rf "$run_dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; [ -f "$run_dir/daemon.log" ] && tail -20 "$run_dir/daemon.log" >&2; exit 1; }

# A small tree to copy in: a 3 MiB random file, long names, a subdirectory.
mkdir -p "$work/tree/sub dir"
head -c $((3 << 20)) /dev/urandom >"$work/tree/big.bin"
echo "a file with a long name" >"$work/tree/A file with a long name.txt"
head -c 10000 /dev/urandom >"$work/tree/sub dir/small.dat"

# Runs the tool round trip on softblk:$1; $2 is a command that writes the
# device's current image to a file ($3).
round_trip() {
  local name=$1 dump=$2 image=$3 dev=softblk:$1
  sb fat mkfs "$dev" -n SOFTBLK >/dev/null || fail "mkfs $dev"
  sb fat cp "$dev" -r "$work/tree" ::/tree || fail "cp -r into $dev"
  sb fat ls "$dev" /tree | grep -qx "A file with a long name.txt" || fail "ls $dev did not list the long name"
  cmp <(sb fat cat "$dev" /tree/big.bin) "$work/tree/big.bin" || fail "cat $dev /tree/big.bin differs"
  sb fat mkdir "$dev" -p /x/y || fail "mkdir -p on $dev"
  sb fat mv "$dev" "/tree/sub dir" /x/y || fail "mv on $dev"
  sb fat rm "$dev" "/tree/A file with a long name.txt" || fail "rm on $dev"
  sb fat df "$dev" | grep -q "State: clean" || fail "df $dev: not clean after the tools"
  rm -rf "$work/out"
  sb fat cp "$dev" -r ::/x "$work/out" || fail "cp -r out of $dev"
  cmp "$work/out/y/sub dir/small.dat" "$work/tree/sub dir/small.dat" || fail "$dev: small.dat came back different"
  # What the daemon's device holds, checked by other tools.
  $dump "$image" || fail "could not read $dev's image"
  fsck.fat -n "$image" >"$work/fsck.txt" 2>&1 || { cat "$work/fsck.txt"; fail "fsck.fat -n found problems on $dev"; }
  cmp <(mtype -i "$image" ::/tree/big.bin) "$work/tree/big.bin" || fail "mtype read $dev's big.bin differently"
  mcopy -n -i "$image" "::/x/y/sub dir/small.dat" "$work/small.mtools" || fail "mcopy out of $dev's image"
  cmp "$work/small.mtools" "$work/tree/sub dir/small.dat" || fail "mcopy read $dev's small.dat differently"
  echo "ok: $dev"
}

ran=0

echo "== NBD export"
if ! command -v nbdcopy >/dev/null; then
  echo "SKIP (part): nbdcopy is not installed (libnbd-bin), needed to check the NBD export's image"
elif ! out=$(sb add null memory_backed=1 size=64 bs=4096 --export nbd --name n0 2>&1); then
  echo "SKIP (part): this softblk has no NBD export: $out"
else
  uri=$(sb list --json | jq -r '.[] | select(.name == "n0") | .export.uri')
  [ -n "$uri" ] && [ "$uri" != null ] || fail "n0 has no NBD URI"
  round_trip n0 "nbdcopy $uri" "$work/n0.img"
  ran=$((ran + 1))
fi

echo "== FUSE export"
if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP (part): the FUSE export needs root here"
elif [ ! -c /dev/fuse ]; then
  echo "SKIP (part): no /dev/fuse"
else
  sb add null memory_backed=1 size=48 bs=512 --export fuse --export-opt loop=0 --name f0 >/dev/null ||
    fail "add with a FUSE export"
  file=$(sb list --json | jq -r '.[] | select(.name == "f0") | .export.file')
  [ -f "$file" ] || fail "f0 has no exported file"
  round_trip f0 "cp $file" "$work/f0.img"
  ran=$((ran + 1))
fi

echo "== errors name the fix"
sb add null memory_backed=1 size=16 --export none --name x0 >/dev/null || fail "add without export"
if msg=$(sb fat ls softblk:x0 2>&1); then fail "ls on a device without export succeeded"; fi
grep -q -- "--export nbd" <<<"$msg" || fail "no fix named for a device without export: $msg"
if msg=$(sb fat ls softblk:nosuch 2>&1); then fail "ls on an unknown device succeeded"; fi
grep -q "has no device \"nosuch\"" <<<"$msg" || fail "unknown device: $msg"
grep -q "x0" <<<"$msg" || fail "unknown device: the daemon's devices are not listed: $msg"

[ "$ran" -gt 0 ] || skip "neither the NBD nor the FUSE export could be tested"
echo "PASS ($ran export types)"
