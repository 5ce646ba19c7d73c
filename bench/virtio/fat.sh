#!/usr/bin/env bash
# The FAT benchmark (softblk-bench-fat, docs/benchmarks.md "FAT") over the
# virtio path: the FAT library on softblk's virtio-blk driver, on the
# softblk daemon's vhost-user-blk export of a memory-backed null device
# (bs=512, as the in-process run uses), next to the in-process run of the
# same program (library on the null device through device::execute) in
# the same invocation. FUSE and mtools rows are left out (they do not
# depend on the device path).
#
#   bench/virtio/fat.sh [--build DIR] [-- softblk-bench-fat options]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=$repo/build
if [ "${1:-}" = --build ]; then build=$2; shift 2; fi
[ "${1:-}" = -- ] && shift
if [ -z "${SOFTBLK_BENCH_LOCKED:-}" ]; then
  export SOFTBLK_BENCH_LOCKED=1
  exec flock /tmp/softblk-bench.lock "$0" --build "$build" -- "$@"
fi
softblk=$build/src/cli/softblk
fat=$build/bench/fat/softblk-bench-fat
work=$(mktemp -d /dev/shm/softblk-virtio-fat.XXXXXX)
cleanup() {
  if [ -s "$work/run/daemon.pid" ]; then kill "$(cat "$work/run/daemon.pid")" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
export SOFTBLK_RUN_DIR=$work/run
"$softblk" add null memory_backed=1 size=512 bs=512 max_sectors=2048 submit_queues=1 poll_queues=0 \
  --name fat0 --export vhost-user-blk --export-opt socket="$work/fat0.sock" >/dev/null
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for device in "" "virtio:path=$work/fat0.sock,poll_queues=0" \
              "virtio:path=$work/fat0.sock,poll_queues=0,poll=1"; do
  echo "### ${device:-in-process null device}"
  if [ -z "$device" ]; then
    "$fat" --no-fuse --no-mtools "$@"
  else
    "$fat" --no-fuse --no-mtools --device "$device" "$@"
  fi
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
