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
#                    [--threads N] [--export-opt KEY=VALUE]... [--rounds N]
#                    [--jobs NAME,NAME...] [--variant NAME:KEY=VALUE[,KEY=VALUE]]...
#
# --threads N gives the device N submit queues and the server N loop
# threads. --baseline PATH also serves the same device with another build
# (its softblk-driver, or the softblk-nbd of builds before softblk-driver
# replaced it), run job by job beside the others, and adds a table of
# softblk against it: a change's cost measured under the same load.
# --variant NAME:OPTS serves the device once more with the same driver and
# these export options on top of --export-opt (e.g. poll0:poll-us=0), also
# job by job beside the others, in the baseline table.
#
# --rounds N (default 1) runs every job N times, each round going through
# all servers job by job (interleaved, so a load that changes during the
# run hits all alike); the tables give each figure's median and, with
# N > 1, the spread (min-max) of the ratios. --jobs picks jobs by name
# (default: all; e.g. --jobs randread-4k-qd1,randwrite-4k-qd32).
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
rounds=1
job_filter=""
export_opts=()
variants=()
while (($#)); do
  case "$1" in
    --driver) driver=$2; shift 2 ;;
    --baseline) baseline=$2; shift 2 ;;
    --runtime) runtime=$2; shift 2 ;;
    --size) size_mib=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --export-opt) export_opts+=(-o "$2"); shift 2 ;;  # e.g. coalesce-us=20, passed to the server
    --rounds) rounds=$2; shift 2 ;;
    --jobs) job_filter=$2; shift 2 ;;
    --variant) variants+=("$2"); shift 2 ;;
    *) echo "usage: $0 [--driver PATH] [--baseline PATH] [--runtime S] [--size MiB] [--threads N]" \
            "[--export-opt K=V]... [--rounds N] [--jobs NAME,...] [--variant NAME:K=V[,K=V]]..." >&2
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
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "--rounds $rounds: a count of 1 or more" >&2; exit 2; }
for v in "${variants[@]}"; do
  [[ "$v" =~ ^[a-z0-9_-]+:[a-z0-9_-]+=[^,]*(,[a-z0-9_-]+=[^,]*)*$ ]] ||
    { echo "--variant $v: NAME:KEY=VALUE[,KEY=VALUE] (NAME in a-z0-9_-)" >&2; exit 2; }
done

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

# serve_softblk PROGRAM RUN_DIR SOCKET [-o K=V]...: the device d0 over NBD, in
# this (background) subshell's place so that $! is the server. The softblk-nbd
# of older builds (for --baseline) takes the same arguments without --export.
serve_softblk() {
  local program=$1 run_dir=$2 socket=$3 how=(--export nbd) queues=()
  shift 3
  [ "$(basename "$program")" != softblk-nbd ] || how=()
  [ "$threads" = 0 ] || queues=(submit_queues="$threads")
  exec "$program" "${how[@]}" --run-dir "$run_dir" -o socket="$socket" -o threads="$threads" \
    "${export_opts[@]}" "$@" d0 null memory_backed=1 size=1024 "${queues[@]}"
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
compared=()  # servers in the baseline table: the baseline, the variants
[ -z "$baseline" ] || compared+=(baseline)
for v in "${variants[@]}"; do
  name=${v%%:*} opts=()
  IFS=, read -r -a kvs <<<"${v#*:}"
  for kv in "${kvs[@]}"; do opts+=(-o "$kv"); done
  mkdir -p "$work/$name"
  serve_softblk "$driver" "$work/$name" "$work/$name.sock" "${opts[@]}" >"$work/$name.log" 2>&1 &
  pid_of[$name]=$!; pids+=("${pid_of[$name]}")
  wait_socket "$work/$name.sock"
  servers+=("$name")
  compared+=("$name")
done
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

results="$work/results.tsv"  # round job server iops cpu_ns fio_cpu_ns fio_percent
: >"$results"
for ((round = 1; round <= rounds; round++)); do
  for j in "${jobs[@]}"; do
    read -r name rw bs qd <<<"$j"
    if [ -n "$job_filter" ] && [[ ",$job_filter," != *",$name,"* ]]; then continue; fi
    for s in "${servers[@]}"; do
      printf '%s\t%s\t%s\t%s\n' "$round" "$name" "$s" \
        "$(run_fio "$s" "$name" "$rw" "$bs" "$qd" | tr ' ' '\t')" >>"$results"
    done
  done
done

machine_line
echo
echo "$rounds round(s) of ${runtime} s per job and server, interleaved; medians, and with several rounds the spread (min-max) of the per-round ratios."
python3 - "$results" "$rounds" "$driver" "$baseline" "${compared[@]}" <<'PY'
import statistics, sys
from collections import defaultdict
path, rounds, driver, baseline, *compared = sys.argv[1:]
rounds = int(rounds)
rows = defaultdict(dict)  # (job) -> {(server, round): (iops, cpu, fcpu, fpct)}
order = []
for line in open(path):
    r, job, server, iops, cpu, fcpu, fpct = line.split("\t")
    if job not in order:
        order.append(job)
    rows[job][(server, int(r))] = tuple(map(float, (iops, cpu, fcpu, fpct)))

def med(job, server, k):
    return statistics.median(v[k] for (s, _), v in rows[job].items() if s == server)

def spread(job, a, b, k):
    ratios = [rows[job][(a, r)][k] / rows[job][(b, r)][k] for r in range(1, rounds + 1)
              if (a, r) in rows[job] and (b, r) in rows[job] and rows[job][(b, r)][k]]
    return f" ({min(ratios):.2f}-{max(ratios):.2f})" if rounds > 1 and ratios else ""

print()
print("| job | softblk IOPS | nbdkit IOPS | qsd IOPS | softblk CPU ns/IO | nbdkit CPU ns/IO | qsd CPU ns/IO | IOPS vs best peer | CPU/IO vs that peer |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for job in order:
    si, ni, qi = (med(job, s, 0) for s in ("softblk", "nbdkit", "qsd"))
    sc, nc, qc = (med(job, s, 1) for s in ("softblk", "nbdkit", "qsd"))
    best = "qsd" if qi > ni else "nbdkit"
    bi, bc = (ni, nc) if best == "nbdkit" else (qi, qc)
    print(f"| {job} | {si:.0f} | {ni:.0f} | {qi:.0f} | {sc:.0f} | {nc:.0f} | {qc:.0f} | "
          f"{si / bi:.2f}x ({best}){spread(job, 'softblk', best, 0)} | "
          f"{sc / bc if bc else float('nan'):.2f}x{spread(job, 'softblk', best, 1)} |")
print()
print("fio's own CPU time per I/O (ns) and, in brackets, the share of one CPU it used:")
print()
print("| job | fio vs softblk | fio vs nbdkit | fio vs qsd |")
print("|---|---:|---:|---:|")
for job in order:
    cells = [f"{med(job, s, 2):.0f} ({med(job, s, 3):.0f}%)" for s in ("softblk", "nbdkit", "qsd")]
    print(f"| {job} | " + " | ".join(cells) + " |")
for other in compared:
    what = f"the baseline ({baseline})" if other == "baseline" else f"the variant {other}"
    print()
    print(f"softblk ({driver}) against {what}, job by job in the same run:")
    print()
    print(f"| job | softblk IOPS | {other} IOPS | IOPS ratio | softblk CPU ns/IO | {other} CPU ns/IO | CPU ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for job in order:
        si, oi = med(job, "softblk", 0), med(job, other, 0)
        sc, oc = med(job, "softblk", 1), med(job, other, 1)
        print(f"| {job} | {si:.0f} | {oi:.0f} | {si / oi:.3f}x{spread(job, 'softblk', other, 0)} | "
              f"{sc:.0f} | {oc:.0f} | {sc / oc:.3f}x{spread(job, 'softblk', other, 1)} |")
PY
echo
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
