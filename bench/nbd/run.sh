#!/usr/bin/env bash
# NBD server benchmark: softblk (softblk-driver --export nbd, null target
# with memory_backed=1) against nbdkit's memory plugin and qemu-storage-daemon's
# NBD export of a raw image in tmpfs (qemu has no RAM block driver that
# keeps data; null-co drops writes), all over unix sockets, measured in
# the same run with fio's nbd engine (libnbd, one connection per job).
#
# For each job it reports IOPS and the server's CPU time per I/O: utime +
# stime of the server process (all threads) from /proc/PID/stat, before and
# after the job, divided by the I/Os fio completed. A second table gives the
# client's side, fio's own CPU time (usr_cpu + sys_cpu) per I/O and how much
# of one CPU it used, which is what bounds IOPS when the client saturates a
# CPU (fio runs one thread; the machine may have few CPUs).
#
#   bench/nbd/run.sh [--driver PATH] [--baseline PATH] [--runtime SECONDS] [--size MiB]
#                    [--threads N] [--export-opt KEY=VALUE]...
#
# --threads N gives the device N submit queues and the server N loop
# threads. --baseline PATH also serves the same device with another build
# (its softblk-driver, or the softblk-nbd of builds before softblk-driver
# replaced it), run job by job beside the others, and adds a table of
# softblk against it: a change's cost measured under the same load.
#
# --driver defaults to the newest build*/src/driver/softblk-driver under the
# repository. Prints a table (markdown) on stdout.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
source "$repo/bench/common/machine.sh"
driver=""
baseline=""
runtime=5
size_mib=256
threads=1
export_opts=()
while (($#)); do
  case "$1" in
    --driver) driver=$2; shift 2 ;;
    --baseline) baseline=$2; shift 2 ;;
    --runtime) runtime=$2; shift 2 ;;
    --size) size_mib=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --export-opt) export_opts+=(-o "$2"); shift 2 ;;  # e.g. coalesce-us=20, passed to the server
    *) echo "usage: $0 [--driver PATH] [--baseline PATH] [--runtime S] [--size MiB] [--threads N] [--export-opt K=V]..." >&2
       exit 2 ;;
  esac
done
for tool in fio nbdkit qemu-storage-daemon python3; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed" >&2; exit 77; }
done
grep -qw nbd <<<"$(fio --enghelp 2>/dev/null)" || { echo "SKIP: this fio has no nbd engine" >&2; exit 77; }
[ -n "$driver" ] || driver=$(ls -t "$repo"/build*/src/driver/softblk-driver 2>/dev/null | head -1 || true)
[ -x "$driver" ] || { echo "softblk-driver not found (build it, or --driver PATH)" >&2; exit 2; }
[ -z "$baseline" ] || [ -x "$baseline" ] || { echo "--baseline $baseline: not an executable" >&2; exit 2; }

work=$(mktemp -d /dev/shm/softblk-nbd-bench.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

wait_socket() {
  for _ in $(seq 100); do [ -S "$1" ] && return 0; sleep 0.05; done
  echo "server did not create $1" >&2; exit 1
}

# serve_softblk PROGRAM RUN_DIR SOCKET: the device d0 over NBD, in this
# (background) subshell's place so that $! is the server. The softblk-nbd
# of older builds (for --baseline) takes the same arguments without --export.
serve_softblk() {
  local program=$1 run_dir=$2 socket=$3 how=(--export nbd) queues=()
  [ "$(basename "$program")" != softblk-nbd ] || how=()
  [ "$threads" = 0 ] || queues=(submit_queues="$threads")
  exec "$program" "${how[@]}" --run-dir "$run_dir" -o socket="$socket" -o threads="$threads" \
    "${export_opts[@]}" d0 null memory_backed=1 size=1024 "${queues[@]}"
}

# A capacity of 1 GiB for all three; jobs touch the first $size_mib MiB.
serve_softblk "$driver" "$work" "$work/softblk.sock" >"$work/softblk.log" 2>&1 &
softblk_pid=$!; pids+=("$softblk_pid")
nbdkit --foreground --unix "$work/nbdkit.sock" --exportname d0 memory size=1G >"$work/nbdkit.log" 2>&1 &
nbdkit_pid=$!; pids+=("$nbdkit_pid")
truncate -s 1G "$work/qsd.raw"
qemu-storage-daemon \
  --blockdev driver=file,node-name=file0,filename="$work/qsd.raw",aio=io_uring,cache.direct=off \
  --blockdev driver=raw,node-name=raw0,file=file0 \
  --nbd-server addr.type=unix,addr.path="$work/qsd.sock" \
  --export type=nbd,id=e0,node-name=raw0,name=d0,writable=on >"$work/qsd.log" 2>&1 &
qsd_pid=$!; pids+=("$qsd_pid")
wait_socket "$work/softblk.sock"; wait_socket "$work/nbdkit.sock"; wait_socket "$work/qsd.sock"

declare -A pid_of=([softblk]=$softblk_pid [nbdkit]=$nbdkit_pid [qsd]=$qsd_pid)
servers=(softblk nbdkit qsd)
if [ -n "$baseline" ]; then
  mkdir -p "$work/baseline"
  serve_softblk "$baseline" "$work/baseline" "$work/baseline.sock" >"$work/baseline.log" 2>&1 &
  pid_of[baseline]=$!; pids+=("${pid_of[baseline]}")
  wait_socket "$work/baseline.sock"
  servers+=(baseline)
fi
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

# name rw bs iodepth
jobs=(
  "randread-4k-qd1 randread 4k 1"
  "randread-4k-qd32 randread 4k 32"
  "randwrite-4k-qd1 randwrite 4k 1"
  "randwrite-4k-qd32 randwrite 4k 32"
  "read-64k-qd8 read 64k 8"
  "write-64k-qd8 write 64k 8"
  "read-1m-qd8 read 1m 8"
  "write-1m-qd8 write 1m 8"
)

run_fio() {  # server job rw bs qd -> "iops cpu_ns_per_io fio_cpu_ns_per_io fio_cpu_percent"
  local server=$1 name=$2 rw=$3 bs=$4 qd=$5
  local uri="nbd+unix:///d0?socket=$work/$server.sock"
  local before after
  before=$(cpu_ticks "${pid_of[$server]}")
  fio --name="$name" --ioengine=nbd --uri="$uri" --rw="$rw" --bs="$bs" --iodepth="$qd" \
      --size="${size_mib}M" --time_based --runtime="$runtime" --output-format=json \
      >"$work/$server-$name.json" 2>"$work/$server-$name.err"
  after=$(cpu_ticks "${pid_of[$server]}")
  python3 - "$work/$server-$name.json" "$before" "$after" "$hz" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
j = json.loads(text[text.index("{"):])["jobs"][0]  # fio's nbd engine prints a line first
ios = j["read"]["total_ios"] + j["write"]["total_ios"]
secs = (j["read"]["runtime"] or j["write"]["runtime"]) / 1000.0
cpu_ns = (int(sys.argv[3]) - int(sys.argv[2])) * 1e9 / int(sys.argv[4])
fio_cpu = (j["usr_cpu"] + j["sys_cpu"]) / 100.0  # share of one CPU over the job
print(f"{ios / secs:.0f} {cpu_ns / max(ios, 1):.0f} {fio_cpu * secs * 1e9 / max(ios, 1):.0f} {fio_cpu * 100:.0f}")
PY
}

# Fill the area first so reads return data, not holes, on every server.
for s in "${servers[@]}"; do
  fio --name=fill --ioengine=nbd --uri="nbd+unix:///d0?socket=$work/$s.sock" --rw=write --bs=1m \
      --iodepth=8 --size="${size_mib}M" >/dev/null 2>&1
done

client_rows=()
baseline_rows=()
machine_line
echo
echo "| job | softblk IOPS | nbdkit IOPS | qsd IOPS | softblk CPU ns/IO | nbdkit CPU ns/IO | qsd CPU ns/IO | IOPS vs best peer | CPU/IO vs that peer |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for j in "${jobs[@]}"; do
  read -r name rw bs qd <<<"$j"
  declare -A iops=() cpu=() fcpu=() futil=()
  for s in "${servers[@]}"; do
    read -r iops[$s] cpu[$s] fcpu[$s] futil[$s] < <(run_fio "$s" "$name" "$rw" "$bs" "$qd")
  done
  if [ -n "$baseline" ]; then
    baseline_rows+=("$(python3 -c 'import sys
n, si, bi, sc, bc = sys.argv[1], *map(float, sys.argv[2:])
print(f"| {n} | {si:.0f} | {bi:.0f} | {si / bi:.3f}x | {sc:.0f} | {bc:.0f} | {sc / bc:.3f}x |")' \
      "$name" "${iops[softblk]}" "${iops[baseline]}" "${cpu[softblk]}" "${cpu[baseline]}")")
  fi
  client_rows+=("| $name | ${fcpu[softblk]} (${futil[softblk]}%) | ${fcpu[nbdkit]} (${futil[nbdkit]}%) | ${fcpu[qsd]} (${futil[qsd]}%) |")
  best=nbdkit
  if ((${iops[qsd]} > ${iops[nbdkit]})); then best=qsd; fi
  python3 - "$name" "${iops[softblk]}" "${iops[nbdkit]}" "${iops[qsd]}" "${cpu[softblk]}" "${cpu[nbdkit]}" \
      "${cpu[qsd]}" "$best" <<'PY'
import sys
name, si, ni, qi, sc, nc, qc, best = sys.argv[1:]
si, ni, qi, sc, nc, qc = map(float, (si, ni, qi, sc, nc, qc))
bi, bc = (ni, nc) if best == "nbdkit" else (qi, qc)
print(f"| {name} | {si:.0f} | {ni:.0f} | {qi:.0f} | {sc:.0f} | {nc:.0f} | {qc:.0f} | "
      f"{si / bi:.2f}x ({best}) | {sc / bc if bc else float('nan'):.2f}x |")
PY
done
echo
echo "fio's own CPU time per I/O (ns) and, in brackets, the share of one CPU it used:"
echo
echo "| job | fio vs softblk | fio vs nbdkit | fio vs qsd |"
echo "|---|---:|---:|---:|"
printf '%s\n' "${client_rows[@]}"
if [ -n "$baseline" ]; then
  echo
  echo "softblk ($driver) against the baseline ($baseline), job by job in the same run:"
  echo
  echo "| job | softblk IOPS | baseline IOPS | IOPS ratio | softblk CPU ns/IO | baseline CPU ns/IO | CPU ratio |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  printf '%s\n' "${baseline_rows[@]}"
fi
