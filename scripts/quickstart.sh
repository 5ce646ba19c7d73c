#!/usr/bin/env bash
# softblk quickstart, the README's first command (`./scripts/quickstart.sh`,
# as root or as a user with sudo). On a fresh Debian 12 machine it
#   1. installs the Debian packages (scripts/install-deps.sh; through sudo
#      when not root),
#   2. configures and builds softblk (build/, Release, Ninja) as the caller,
#   3. runs softblk's main job once: creates a memory-backed null device
#      through the `softblk` CLI, exported through FUSE as a loop device;
#      runs fio with crc32c verification on it; makes an ext4 file system,
#      mounts it, writes files, syncs, unmounts, checks it with fsck and
#      reads the files back; prints what happened (device, sizes,
#      throughput, memory used) and tears everything down, also on failure.
#      The job needs root (a loop device, a mount): a caller that is not
#      root runs this script again through sudo for step 3.
#
# Options:
#   --no-deps       skip step 1          --no-build     skip step 2
#   --no-sudo       not root: skip the job (exit 77) instead of using sudo
#   --bin PATH      the softblk executable to use (default build/src/cli/softblk)
#   --size SIZE     device size (default 1G)
#   --quick         smaller runs (the test suite uses it)
# The job runs its own daemon in a private run directory (or
# $SOFTBLK_RUN_DIR, which sudo does not pass on), so a softblk daemon you
# already run is not touched.
# Exit status: 0 done, 1 failed, 77 this machine cannot run the job.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
args=("$@")
deps=1
build=1
use_sudo=1
softblk=$repo/build/src/cli/softblk
size=1G
fio_size=256M
file_mib=64
while (($#)); do
  case $1 in
    --no-deps) deps=0 ;;
    --no-build) build=0 ;;
    --no-sudo) use_sudo=0 ;;
    --bin) softblk=$2; shift ;;
    --size) size=$2; shift ;;
    --quick) size=256M fio_size=64M file_mib=16 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "quickstart: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

if ((deps)); then
  step "installing Debian packages"
  "$repo/scripts/install-deps.sh"
fi
if ((build)); then
  step "building softblk (build/, Release)"
  # The configuration of scripts/test.sh's release stage (warnings are
  # errors; none with Debian 12's GCC), so that the test suite reuses these
  # objects.
  cmake -S "$repo" -B "$repo/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSOFTBLK_WERROR=ON \
    -DSOFTBLK_SANITIZE= -DSOFTBLK_ONLY_NOSAN_GTESTS=ON >/dev/null
  ninja -C "$repo/build" -j"$(nproc)" softblk
fi

if [ "$(id -u)" -ne 0 ]; then
  if ((use_sudo)) && command -v sudo >/dev/null; then
    step "running the job as root (sudo): it attaches a loop device and mounts a file system"
    exec sudo -- "$repo/scripts/quickstart.sh" "${args[@]}" --no-deps --no-build
  fi
  echo "SKIP: quickstart's job attaches a loop device and mounts a file system, which needs" \
    "root: run $0 as root or as a user with sudo" >&2
  exit 77
fi

for need in /dev/fuse /dev/loop-control; do
  [ -e "$need" ] || { echo "SKIP: quickstart: $need is missing: the FUSE export and loop devices cannot run here"; exit 77; }
done
[ -x "$softblk" ] || { echo "quickstart: $softblk is not built" >&2; exit 1; }

# ------------------------------------------------------------------ the job
own_run_dir=0
if [ -z "${SOFTBLK_RUN_DIR:-}" ]; then
  SOFTBLK_RUN_DIR=$(mktemp -d /tmp/softblk-quickstart.XXXXXX)
  own_run_dir=1
fi
export SOFTBLK_RUN_DIR
work=$(mktemp -d /tmp/softblk-quickstart-mnt.XXXXXX)
mnt=$work/mnt
mkdir -p "$mnt"
name=quickstart
status=failed

teardown() {
  set +e
  step "tearing down"
  if mountpoint -q "$mnt"; then umount "$mnt" || umount -l "$mnt"; fi
  if [ -S "$SOFTBLK_RUN_DIR/control.sock" ]; then
    "$softblk" del "$name" 2>/dev/null
    "$softblk" shutdown
  fi
  # A daemon that did not stop (or a job killed half way): stop it by pid.
  if [ -s "$SOFTBLK_RUN_DIR/daemon.pid" ]; then
    pid=$(cat "$SOFTBLK_RUN_DIR/daemon.pid")
    kill -TERM "$pid" 2>/dev/null && sleep 1 && kill -KILL "$pid" 2>/dev/null
  fi
  findmnt -rn -o TARGET | grep "^$SOFTBLK_RUN_DIR/" | sort -r | while read -r m; do umount -l "$m"; done
  rm -rf "$work"
  if ((own_run_dir)); then
    [ "$status" = ok ] || { echo "daemon log:"; tail -20 "$SOFTBLK_RUN_DIR/daemon.log" 2>/dev/null; }
    rm -rf "$SOFTBLK_RUN_DIR"
  fi
  echo "quickstart: $status"
}
trap teardown EXIT

step "creating a memory-backed null device ($size, 4 KiB blocks) exported through FUSE"
echo "\$ softblk add null memory_backed=1 --size $size --bs 4096 --export fuse --name $name"
added=$("$softblk" add null memory_backed=1 --size "$size" --bs 4096 --export fuse --name "$name")
echo "$added"
loop=$(awk '$1 == "loop:" {print $2}' <<<"$added")
[ -b "$loop" ] || { echo "quickstart: no loop device in the output above" >&2; exit 1; }
echo "kernel block device: $loop, $(blockdev --getsize64 "$loop") bytes, logical block $(blockdev --getss "$loop") bytes"

step "fio: random writes, then reads that verify every block (crc32c)"
fio_out=$(fio --name=verify --filename="$loop" --direct=1 --ioengine=libaio --iodepth=16 --rw=randwrite \
  --bs=64k --size="$fio_size" --verify=crc32c --verify_fatal=1 --do_verify=1 --randrepeat=0 \
  --verify_state_save=0 \
  --output-format=normal 2>&1) || { echo "$fio_out"; echo "quickstart: fio verification failed" >&2; exit 1; }
grep -E '^ +(READ|WRITE):|verify|err=' <<<"$fio_out" | sed 's/^ *//'
fio_write=$(grep -E '^ +WRITE:' <<<"$fio_out" | sed -E 's/.*bw=([^ ]+) \(([^)]+)\).*/\2/')
fio_read=$(grep -E '^ +READ:' <<<"$fio_out" | sed -E 's/.*bw=([^ ]+) \(([^)]+)\).*/\2/')

step "ext4: mkfs, mount, write files, sync, unmount, fsck, read back"
mkfs.ext4 -q -F -b 4096 "$loop"
mount "$loop" "$mnt"
head -c $((file_mib << 20)) /dev/urandom >"$work/data.bin"
mkdir "$mnt/files"
for i in 1 2 3 4; do cp "$work/data.bin" "$mnt/files/data$i.bin"; done
echo "hello from softblk" >"$mnt/files/hello.txt"
(cd "$mnt/files" && sha256sum ./* >"$work/sums")
sync
df -h "$mnt" | tail -1 | awk '{print "file system: " $2 " total, " $3 " used"}'
umount "$mnt"
fsck.ext4 -fn "$loop" >"$work/fsck.log" 2>&1 || { cat "$work/fsck.log"; echo "quickstart: fsck found errors" >&2; exit 1; }
tail -1 "$work/fsck.log"
mount -o ro "$loop" "$mnt"
(cd "$mnt/files" && sha256sum -c --quiet "$work/sums") || { echo "quickstart: files did not read back" >&2; exit 1; }
echo "$(($(wc -l <"$work/sums"))) files read back intact after unmount and remount"
umount "$mnt"

step "what softblk saw"
"$softblk" list
summary=$("$softblk" list --json | jq -r --arg n "$name" '.[] | select(.name == $n) |
  "device \(.name): \(.capacity_bytes / 1048576) MiB, \(.logical_block_size)-byte blocks, " +
  "\(.submit_queues) queue(s) of \(.queue_depth); memory used \(.memory_bytes / 1048576 | floor) MiB; " +
  "\(.stats.bytes_written / 1048576 | floor) MiB written, \(.stats.bytes_read / 1048576 | floor) MiB read, " +
  "\(.stats.errors) errors"')
echo "$summary"
echo "fio throughput: write $fio_write, verify-read $fio_read"
status=ok
