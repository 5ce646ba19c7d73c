#!/bin/bash
# The FAT tools (`softblk fat`) on softblk's virtio-blk driver, on
# qemu-storage-daemon's vhost-user-blk export of an image file and on
# softblk's own export through the daemon (softblk:NAME): mkfs, mkdir,
# copies in and out; fsck.fat then finds the image clean and mtools reads
# the files back.
# Usage: qsd_fat_tools.sh SOFTBLK
set -euo pipefail
softblk=${1:?softblk executable}
skip() { echo "SKIP: $*"; exit 77; }
for tool in qemu-storage-daemon fsck.fat mcopy cmp; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/install-deps.sh)"
done
dir=$(mktemp -d /tmp/softblk-virtio-fat.XXXXXX)
qsd=
cleanup() {
  local rc=$?
  [ -n "$qsd" ] && kill "$qsd" 2>/dev/null && wait "$qsd" 2>/dev/null
  if [ -s "$dir/run/daemon.pid" ]; then kill "$(cat "$dir/run/daemon.pid")" 2>/dev/null; fi
  rm -rf "$dir"
  exit $rc
}
trap cleanup EXIT

truncate -s 64M "$dir/disk.raw"
qemu-storage-daemon --blockdev driver=file,node-name=f0,filename="$dir/disk.raw" \
  --export type=vhost-user-blk,id=e0,node-name=f0,addr.type=unix,addr.path="$dir/qsd.sock",writable=on,num-queues=1 \
  >"$dir/qsd.log" 2>&1 &
qsd=$!
for _ in $(seq 100); do [ -S "$dir/qsd.sock" ] && break; sleep 0.05; done
[ -S "$dir/qsd.sock" ] || { cat "$dir/qsd.log"; echo "FAIL: qemu-storage-daemon did not listen"; exit 1; }

spec="softblk:virtio:path=$dir/qsd.sock,poll_queues=0"
head -c 300000 /dev/urandom >"$dir/a.bin"
head -c 70000 /dev/urandom >"$dir/b.bin"
"$softblk" fat mkfs -n VIRTIO "$spec"
"$softblk" fat mkdir "$spec" ::/docs
"$softblk" fat cp "$spec" "$dir/a.bin" "$dir/b.bin" ::/docs/
"$softblk" fat cp "$spec" ::/docs/a.bin "$dir/a.out"
cmp "$dir/a.bin" "$dir/a.out"
"$softblk" fat ls "$spec" ::/docs
kill "$qsd"; wait "$qsd" 2>/dev/null || true; qsd=
fsck.fat -n "$dir/disk.raw"
mcopy -i "$dir/disk.raw" ::/docs/b.bin "$dir/b.out"
cmp "$dir/b.bin" "$dir/b.out"
echo "ok: FAT tools on qemu-storage-daemon through the driver, fsck.fat clean"

# The same tools on a device of the softblk daemon exported over
# vhost-user-blk (softblk:NAME opens the export with the driver).
export SOFTBLK_RUN_DIR=$dir/run
"$softblk" add null memory_backed=1 size=64 submit_queues=1 poll_queues=0 --name fat0 \
  --export vhost-user-blk >/dev/null
"$softblk" fat mkfs softblk:fat0
"$softblk" fat cp softblk:fat0 "$dir/a.bin" ::/a.bin
"$softblk" fat cp softblk:fat0 ::/a.bin "$dir/a2.out"
cmp "$dir/a.bin" "$dir/a2.out"
echo "ok: FAT tools on softblk's own export (softblk:fat0)"
echo PASS
