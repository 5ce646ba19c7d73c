#!/usr/bin/env bash
# File-target benchmark on the host: softblk's `file` target (its daemon,
# O_DIRECT through one io_uring per queue) against its peers, serving
# copies of one raw image, all in the same run, interleaved round by round
# (median of the rounds reported):
#   NBD       softblk --export nbd, nbdkit's file plugin, and
#             qemu-storage-daemon's file driver (aio=io_uring,
#             cache.direct=on) with its NBD export; fio's nbd engine (one
#             connection), 4 KiB random read/write at QD 1 and 32, 128 KiB
#             sequential read/write at QD 8.
#   FUSE+loop softblk --export fuse (the kernel's loop device with direct
#             I/O over the FUSE file) against qemu-storage-daemon's FUSE
#             export of the same kind of file (aio=io_uring, cache.direct=on)
#             under losetup --direct-io=on; fio psync direct, 4 KiB random
#             read/write, 1 and 2 jobs.
# For each job: IOPS, and the server's CPU time per I/O (utime + stime of
# all its threads, /proc/PID/stat, over the job, divided by the I/Os).
#
# usage: bench/file/run.sh [--softblk PATH] [--dir DIR] [--size MiB] [--runtime S] [--rounds N]
#                          [--only nbd|fuse] [--buffered]
#   --dir       where the images live (default /dev/shm: the servers, not a
#               disk, are measured; give a directory on a disk to include it)
#   --buffered  every server through the page cache: softblk buffered_io=1,
#               qemu-storage-daemon cache.direct=off (nbdkit's file plugin
#               always is). Default: direct I/O for softblk and
#               qemu-storage-daemon (nbdkit 1.32 has no O_DIRECT: on a disk
#               its figures are the page cache's, not comparable).
# Needs root for the FUSE part (skipped otherwise). Prints markdown tables.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
softblk=""
dir=/dev/shm
size_mib=512
runtime=5
rounds=3
only=""
buffered=0
while (($#)); do
  case "$1" in
    --softblk) softblk=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --size) size_mib=$2; shift 2 ;;
    --runtime) runtime=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --buffered) buffered=1; shift ;;
    *) echo "usage: $0 [--softblk PATH] [--dir DIR] [--size MiB] [--runtime S] [--rounds N] [--only nbd|fuse]" >&2
       exit 2 ;;
  esac
done
[ -n "$softblk" ] || softblk=$(ls -t "$root"/build*/src/cli/softblk 2>/dev/null | head -1 || true)
[ -x "$softblk" ] || { echo "softblk not found; build it or pass --softblk" >&2; exit 2; }
if [ $buffered = 1 ]; then
  softblk_io=buffered_io=1; qsd_direct=off
else
  softblk_io=buffered_io=0; qsd_direct=on
fi
for tool in fio nbdkit qemu-storage-daemon python3; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed" >&2; exit 77; }
done

work=$(mktemp -d "$dir/softblk-bench-file.XXXXXX")
export SOFTBLK_RUN_DIR=$work/run
pids=()
cleanup() {
  set +e
  timeout 20 "$softblk" del --all >/dev/null 2>&1
  timeout 20 "$softblk" shutdown >/dev/null 2>&1
  for l in $(losetup -nO NAME,BACK-FILE 2>/dev/null | awk -v d="$work/" 'index($2, d) == 1 {print $1}'); do
    losetup -d "$l"
  done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  for m in $(awk -v d="$work/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m"
  done
  rm -rf "$work"
}
trap cleanup EXIT
wait_for() { for _ in $(seq 200); do [ -e "$1" ] && return 0; sleep 0.05; done; echo "no $1" >&2; exit 1; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

# One image with data in every block, copied for each server, so that all
# read the same allocated data.
head -c $((size_mib << 20)) /dev/urandom >"$work/base.img"
# Written back before use: a direct read of a range with dirty pages must
# write them back first (and io_uring hands such reads to a worker), which
# would tax the O_DIRECT servers for the copy, not for serving.
copy() { cp "$work/base.img" "$work/$1.img"; sync "$work/$1.img"; }
daemon_pid() { cat "$SOFTBLK_RUN_DIR/daemon.pid"; }

# ---------------------------------------------------------------- NBD
nbd_part() {
  grep -qw nbd <<<"$(fio --enghelp 2>/dev/null)" || { echo "SKIP (NBD): this fio has no nbd engine" >&2; return; }
  copy softblk-nbd; copy nbdkit; copy qsd-nbd
  local out
  out=$("$softblk" add file "path=$work/softblk-nbd.img" $softblk_io --export nbd --name n0) || { echo "$out" >&2; exit 1; }
  local -A uri pid
  uri[softblk]=$(awk '$1 == "uri:" {print $2}' <<<"$out")
  pid[softblk]=$(daemon_pid)
  nbdkit --foreground --unix "$work/nbdkit.sock" --exportname d0 file "$work/nbdkit.img" \
    >"$work/nbdkit.log" 2>&1 &
  pid[nbdkit]=$!; pids+=($!)
  uri[nbdkit]="nbd+unix:///d0?socket=$work/nbdkit.sock"
  qemu-storage-daemon \
    --blockdev driver=file,node-name=file0,filename="$work/qsd-nbd.img",aio=io_uring,cache.direct=$qsd_direct \
    --blockdev driver=raw,node-name=raw0,file=file0 \
    --nbd-server addr.type=unix,addr.path="$work/qsd.sock" \
    --export type=nbd,id=e0,node-name=raw0,name=d0,writable=on >"$work/qsd.log" 2>&1 &
  pid[qsd]=$!; pids+=($!)
  uri[qsd]="nbd+unix:///d0?socket=$work/qsd.sock"
  wait_for "$work/nbdkit.sock"; wait_for "$work/qsd.sock"

  local jobs=("randread 4k 1" "randread 4k 32" "randwrite 4k 1" "randwrite 4k 32" "read 128k 8" "write 128k 8")
  local systems=(softblk nbdkit qsd)
  local -A iops_s cpu_s
  for round in $(seq "$rounds"); do
    for j in "${jobs[@]}"; do
      read -r rw bs qd <<<"$j"
      for s in "${systems[@]}"; do
        local before after
        before=$(cpu_ticks "${pid[$s]}")
        fio --name=b --ioengine=nbd --uri="${uri[$s]}" --rw="$rw" --bs="$bs" --iodepth="$qd" \
          --size="${size_mib}M" --time_based --runtime="$runtime" --output-format=json \
          >"$work/fio.json" 2>/dev/null
        after=$(cpu_ticks "${pid[$s]}")
        read -r v c < <(python3 - "$work/fio.json" "$before" "$after" "$hz" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
j = json.loads(text[text.index("{"):])["jobs"][0]
ios = j["read"]["total_ios"] + j["write"]["total_ios"]
secs = (j["read"]["runtime"] or j["write"]["runtime"]) / 1000.0
cpu_ns = (int(sys.argv[3]) - int(sys.argv[2])) * 1e9 / int(sys.argv[4])
print(f"{ios / secs:.0f} {cpu_ns / max(ios, 1):.0f}")
PY
)
        iops_s["$s $j"]+="$v "; cpu_s["$s $j"]+="$c "
        echo "  round $round NBD $s $rw $bs qd$qd: $v IOPS, server $c ns/IO" >&2
      done
    done
  done
  echo "### NBD (fio nbd engine, one connection; median of $rounds rounds of ${runtime} s)"
  echo
  echo "| job | softblk IOPS | nbdkit IOPS | qsd IOPS | softblk CPU ns/IO | nbdkit CPU ns/IO | qsd CPU ns/IO | IOPS vs better peer | CPU/IO vs that peer |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  for j in "${jobs[@]}"; do
    read -r rw bs qd <<<"$j"
    local si ni qi sc nc qc
    si=$(median "${iops_s[softblk $j]}"); ni=$(median "${iops_s[nbdkit $j]}"); qi=$(median "${iops_s[qsd $j]}")
    sc=$(median "${cpu_s[softblk $j]}"); nc=$(median "${cpu_s[nbdkit $j]}"); qc=$(median "${cpu_s[qsd $j]}")
    python3 - "$rw-$bs-qd$qd" "$si" "$ni" "$qi" "$sc" "$nc" "$qc" <<'PY'
import sys
name = sys.argv[1]
si, ni, qi, sc, nc, qc = map(float, sys.argv[2:])
best, bi, bc = ("nbdkit", ni, nc) if ni >= qi else ("qsd", qi, qc)
print(f"| {name} | {si:.0f} | {ni:.0f} | {qi:.0f} | {sc:.0f} | {nc:.0f} | {qc:.0f} | "
      f"{si / bi:.2f}x ({best}) | {sc / bc if bc else float('nan'):.2f}x |")
PY
  done
  echo
  "$softblk" del n0 >/dev/null
}

# ---------------------------------------------------------------- FUSE+loop
fuse_part() {
  if [ "$(id -u)" -ne 0 ] || [ ! -c /dev/fuse ] || [ ! -c /dev/loop-control ]; then
    echo "SKIP (FUSE): needs root, /dev/fuse and /dev/loop-control" >&2
    return
  fi
  copy softblk-fuse; copy qsd-fuse
  local out
  out=$("$softblk" add file "path=$work/softblk-fuse.img" bs=4096 $softblk_io --export fuse --name f0) || { echo "$out" >&2; exit 1; }
  local -A dev pid
  dev[softblk]=$(awk '$1 == "loop:" {print $2}' <<<"$out")
  [ -b "${dev[softblk]}" ] || { echo "no loop device: $out" >&2; exit 1; }
  pid[softblk]=$(daemon_pid)
  touch "$work/qsd-mnt"
  qemu-storage-daemon \
    --blockdev "driver=file,node-name=n0,filename=$work/qsd-fuse.img,aio=io_uring,cache.direct=$qsd_direct" \
    --export "type=fuse,id=e0,node-name=n0,mountpoint=$work/qsd-mnt,writable=on" 2>"$work/qsd-fuse.log" &
  pid[qsd]=$!; pids+=($!)
  for _ in $(seq 100); do grep -q " $work/qsd-mnt " /proc/self/mounts && break; sleep 0.1; done
  dev[qsd]=$(losetup --direct-io=on --sector-size 4096 --show -f "$work/qsd-mnt")
  [ "$(cat "/sys/block/${dev[qsd]#/dev/}/loop/dio")" = 1 ] || { echo "qsd loop: no direct I/O" >&2; exit 1; }

  local cases=("randread 1" "randread 2" "randwrite 1" "randwrite 2")
  local systems=(softblk qsd)
  local -A iops_s cpu_s
  for round in $(seq "$rounds"); do
    for c in "${cases[@]}"; do
      read -r rw jobs <<<"$c"
      for s in "${systems[@]}"; do
        local before after v ios
        before=$(cpu_ticks "${pid[$s]}")
        read -r v ios < <(fio --name=b --filename="${dev[$s]}" --ioengine=psync --direct=1 --bs=4k \
          --rw="$rw" --numjobs="$jobs" --size="${size_mib}M" --time_based --runtime="$runtime" \
          --group_reporting --output-format=terse --terse-version=3 |
          awk -F';' '{printf "%d %d\n", $8 + $49, ($6 + $47) / 4}')
        after=$(cpu_ticks "${pid[$s]}")
        local cpu
        cpu=$(awk -v t=$((after - before)) -v hz="$hz" -v n="$ios" 'BEGIN {printf "%.0f", (n > 0) ? t * 1e9 / hz / n : 0}')
        iops_s["$s $c"]+="$v "; cpu_s["$s $c"]+="$cpu "
        echo "  round $round FUSE $s $rw numjobs=$jobs: $v IOPS, server $cpu ns/IO" >&2
      done
    done
  done
  echo "### FUSE+loop (loop with direct I/O over the FUSE file; fio psync direct 4 KiB; median of $rounds rounds of ${runtime} s)"
  echo
  echo "| case | softblk IOPS | qsd IOPS | softblk/qsd | softblk CPU ns/IO | qsd CPU ns/IO |"
  echo "|---|---:|---:|---:|---:|---:|"
  for c in "${cases[@]}"; do
    read -r rw jobs <<<"$c"
    local si qi
    si=$(median "${iops_s[softblk $c]}"); qi=$(median "${iops_s[qsd $c]}")
    awk -v n="$rw numjobs=$jobs" -v s="$si" -v q="$qi" -v sc="$(median "${cpu_s[softblk $c]}")" \
      -v qc="$(median "${cpu_s[qsd $c]}")" \
      'BEGIN {printf "| %s | %d | %d | %.2f | %s | %s |\n", n, s, q, (q > 0) ? s / q : 0, sc, qc}'
  done
  echo
  "$softblk" del f0 >/dev/null
}

echo "softblk $softblk_io, qemu-storage-daemon cache.direct=$qsd_direct"
echo "images in $dir ($(df -T "$dir" | awk 'NR == 2 {print $2}')), ${size_mib} MiB each; $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
[ "$only" = fuse ] || nbd_part
[ "$only" = nbd ] || fuse_part
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
