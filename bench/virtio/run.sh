#!/usr/bin/env bash
# virtio benchmark: softblk's virtio-blk driver (softblk-bench-virtio, in
# one process) against five vhost-user-blk back ends, in the same run:
#   softblk    the softblk daemon's vhost-user-blk export of a null device
#              (no memory: completes at once, as null-co does; max_sectors=2048
#              so that 128 KiB requests are not split, as null-co does not),
#              with the default options (poll-us=auto: the measured window)
#   softblk-poll  the same with poll-us=50 (each ring polls 50 us before it
#              sleeps, as qemu-storage-daemon's event loop polls)
#   softblk-file  the daemon's export of a file device (target file) on a
#              raw 1 GiB file in /dev/shm
#   qsd-null   qemu-storage-daemon's export of a null-co node
#   qsd-file   qemu-storage-daemon's export of a raw 1 GiB file in /dev/shm
#              (aio=io_uring)
# Jobs: 4 KiB random reads and writes at QD 1 and QD 32,
# 128 KiB sequential reads at QD 8 (bandwidth); one queue. Each job runs
# --repeat times, back ends interleaved; the table shows the median.
#
# CPU per I/O: the client's (user + system of softblk-bench-virtio, from
# getrusage) and the back end's (the CPU time of the back end's process
# over the job, all threads, exited ones included: /proc/PID/stat, read by
# the client before it disconnects; softblk-bench-virtio --backend-pid).
#
#   bench/virtio/run.sh [--build DIR] [--seconds S] [--repeat N]
#
# Takes /tmp/softblk-bench.lock for the whole run (the machine is shared).
# Prints markdown on stdout; progress on stderr.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
source "$repo/bench/common/machine.sh"
build=$repo/build
seconds=5
repeat=3
while (($#)); do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--seconds S] [--repeat N]" >&2; exit 2 ;;
  esac
done
if [ -z "${SOFTBLK_BENCH_LOCKED:-}" ]; then
  export SOFTBLK_BENCH_LOCKED=1
  exec flock /tmp/softblk-bench.lock "$0" --build "$build" --seconds "$seconds" --repeat "$repeat"
fi
softblk=$build/src/cli/softblk
client=$build/bench/virtio/softblk-bench-virtio
for tool in qemu-storage-daemon jq; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed" >&2; exit 77; }
done
[ -x "$softblk" ] && [ -x "$client" ] || { echo "build softblk and softblk-bench-virtio in $build" >&2; exit 2; }

work=$(mktemp -d /dev/shm/softblk-virtio-bench.XXXXXX)
pids=()
cleanup() {
  if [ -s "$work/run/daemon.pid" ]; then kill "$(cat "$work/run/daemon.pid")" 2>/dev/null || true; fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
wait_socket() {
  for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done
  echo "no socket $1" >&2; exit 1
}

export SOFTBLK_RUN_DIR=$work/run
for b in softblk softblk-poll; do
  poll=()
  [ $b = softblk-poll ] && poll=(--export-opt poll-us=50)
  "$softblk" add null size=1024 max_sectors=2048 submit_queues=1 poll_queues=0 --name $b \
    --export vhost-user-blk --export-opt socket="$work/$b.sock" "${poll[@]}" >/dev/null
done
"$softblk" add file path="$work/softblk-disk.raw" size=1G create=1 submit_queues=1 \
  poll_queues=0 --name softblk-file --export vhost-user-blk --export-opt socket="$work/softblk-file.sock" >/dev/null
softblk_pid=$(cat "$work/run/daemon.pid")
qemu-storage-daemon --blockdev driver=null-co,node-name=n0,size=1073741824 \
  --export type=vhost-user-blk,id=e0,node-name=n0,addr.type=unix,addr.path="$work/qsd-null.sock",writable=on,num-queues=1 \
  >"$work/qsd-null.log" 2>&1 &
qnull=$!; pids+=("$qnull")
truncate -s 1G "$work/disk.raw"
qemu-storage-daemon --blockdev driver=file,node-name=f0,filename="$work/disk.raw",aio=io_uring \
  --export type=vhost-user-blk,id=e1,node-name=f0,addr.type=unix,addr.path="$work/qsd-file.sock",writable=on,num-queues=1 \
  >"$work/qsd-file.log" 2>&1 &
qfile=$!; pids+=("$qfile")
wait_socket "$work/softblk.sock"; wait_socket "$work/softblk-poll.sock"; wait_socket "$work/qsd-null.sock"; wait_socket "$work/qsd-file.sock"
# The files are read back, not holes: fill each once.
for b in qsd-file softblk-file; do
  "$client" --path "$work/$b.sock" --rw write --bs 1048576 --qd 4 --seconds 3 --size 1024 >/dev/null
done

backends=(softblk softblk-poll softblk-file qsd-null qsd-file)
declare -A pid_of=([softblk]=$softblk_pid [softblk-poll]=$softblk_pid [softblk-file]=$softblk_pid
  [qsd-null]=$qnull [qsd-file]=$qfile)

# name rw bs qd
jobs=("4k-randread-qd1 randread 4096 1" "4k-randread-qd32 randread 4096 32"
  "4k-randwrite-qd1 randwrite 4096 1" "4k-randwrite-qd32 randwrite 4096 32"
  "128k-read-qd8 read 131072 8")
declare -A iops mibs ccpu bcpu
for job in "${jobs[@]}"; do
  read -r name rw bs qd <<<"$job"
  for r in $(seq "$repeat"); do
    for b in "${backends[@]}"; do
      out=$("$client" --path "$work/$b.sock" --rw "$rw" --bs "$bs" --qd "$qd" --seconds "$seconds" \
        --backend-pid "${pid_of[$b]}")
      iops[$name,$b]+="$(jq -r .iops <<<"$out") "
      mibs[$name,$b]+="$(jq -r .mib_s <<<"$out") "
      ccpu[$name,$b]+="$(jq -r .cpu_us_per_io <<<"$out") "
      bcpu[$name,$b]+="$(jq -r .backend_cpu_us_per_io <<<"$out") "
      echo "$name $b run $r: $(jq -c '{iops, mib_s, cpu_us_per_io, backend_cpu_us_per_io}' <<<"$out")" >&2
    done
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR] = $1} END {printf "%.6g", a[int((NR + 1) / 2)]}'; }

load=$(cut -d' ' -f1-3 /proc/loadavg)
machine_line
echo "virtio: softblk-bench-virtio (softblk's driver, one queue, interrupts) on each back end;"
echo "$repeat runs of $seconds s per job, back ends interleaved, medians; $(nproc) CPUs, load average $load before the report."
echo
echo "| job | back end | IOPS | MiB/s | client CPU us/IO | back-end CPU us/IO |"
echo "|---|---|---:|---:|---:|---:|"
for job in "${jobs[@]}"; do
  read -r name _ <<<"$job"
  for b in "${backends[@]}"; do
    printf "| %s | %s | %s | %s | %s | %s |\n" "$name" "$b" \
      "$(median <<<"${iops[$name,$b]}")" "$(median <<<"${mibs[$name,$b]}")" \
      "$(median <<<"${ccpu[$name,$b]}")" "$(median <<<"${bcpu[$name,$b]}")"
  done
done
echo
# The goal's figure: 4 KiB random reads and writes at QD 1 and 32, each softblk
# back end against qemu-storage-daemon's on the same kind of storage.
ratio() { # job softblk-backend qsd-backend
  local a b c d
  a=$(median <<<"${iops[$1,$2]}"); b=$(median <<<"${iops[$1,$3]}")
  c=$(median <<<"${bcpu[$1,$2]}"); d=$(median <<<"${bcpu[$1,$3]}")
  awk -v j="$1" -v s="$2" -v q="$3" -v a="$a" -v b="$b" -v c="$c" -v d="$d" 'BEGIN {
    printf "%s, %s vs %s: %.2fx the IOPS at %.2fx the back-end CPU per I/O\n", j, s, q, a / b, (d > 0 ? c / d : 0) }'
}
for q in 4k-randread-qd1 4k-randread-qd32 4k-randwrite-qd1 4k-randwrite-qd32; do
  ratio $q softblk qsd-null
  ratio $q softblk-file qsd-file
done
