#!/usr/bin/env bash
# rbd-target benchmark: softblk's `rbd` target over NBD against
# qemu-storage-daemon's rbd driver over NBD, on one single-node Ceph cluster
# that this script starts (tests/targets/rbd/lib_ceph.sh) and stops, in the same
# run, interleaved round by round (median of the rounds reported). Each
# server gets its own image of the same size, filled with random data
# first (`rbd bench --io-type write`, so that reads touch existing objects).
# fio's nbd engine (one connection): 4 KiB random read/write at QD 1 and 32,
# 1 MiB sequential read/write at QD 4. For each job: IOPS, MiB/s, and the
# server's CPU time per I/O (utime + stime of all its threads, librbd's
# included, /proc/PID/stat, over the job, divided by the I/Os fio did).
#
# usage: bench/rbd/run.sh [--softblk PATH] [--size MiB] [--runtime S] [--rounds N]
# Prints markdown tables. Exit 77 when the ceph packages or the peer are
# missing.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
softblk=""
size_mib=256
runtime=5
rounds=3
while (($#)); do
  case "$1" in
    --softblk) softblk=$2; shift 2 ;;
    --size) size_mib=$2; shift 2 ;;
    --runtime) runtime=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "usage: $0 [--softblk PATH] [--size MiB] [--runtime S] [--rounds N]" >&2; exit 2 ;;
  esac
done
[ -n "$softblk" ] || softblk=$(ls -t "$root"/build*/src/cli/softblk 2>/dev/null | head -1 || true)
[ -x "$softblk" ] || { echo "softblk not found; build it or pass --softblk" >&2; exit 2; }
# shellcheck source=../../tests/targets/rbd/lib_ceph.sh
source "$root/tests/targets/rbd/lib_ceph.sh"
if why=$(ceph_missing); then echo "SKIP: $why" >&2; exit 77; fi
for tool in fio qemu-storage-daemon python3; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed" >&2; exit 77; }
done
[ -e /usr/lib/x86_64-linux-gnu/qemu/block-rbd.so ] ||
  { echo "SKIP: qemu-block-extra (qemu's rbd driver) not installed" >&2; exit 77; }

work=$(mktemp -d /tmp/softblk-bench-rbd.XXXXXX)
export SOFTBLK_RUN_DIR=$work/run
qsd_pid=
cleanup() {
  set +e
  timeout 30 "$softblk" del --all >/dev/null 2>&1
  timeout 30 "$softblk" shutdown --force >/dev/null 2>&1
  [ -n "$qsd_pid" ] && { kill "$qsd_pid" 2>/dev/null; wait "$qsd_pid" 2>/dev/null; }
  ceph_stop
  rm -rf "$work"
}
trap cleanup EXIT

ceph_start "$work/ceph" $((size_mib * 2 + 1024)) >"$work/ceph-start.txt" 2>&1 ||
  { cat "$work/ceph-start.txt" >&2; exit 1; }
for img in sb qsd; do
  rbd_cmd create --size "${size_mib}M" "rbd/$img"
  rbd_cmd bench --io-type write --io-size 4M --io-threads 4 --io-total "${size_mib}M" \
    --io-pattern seq "rbd/$img" >/dev/null
done

out=$("$softblk" add rbd image=sb "conf=$CEPH_CONF" --export nbd --name sb 2>&1) ||
  { echo "$out" >&2; exit 1; }
sb_uri=$(awk '$1 == "uri:" {print $2}' <<<"$out")
sb_pid=$(cat "$SOFTBLK_RUN_DIR/daemon.pid")
qsd_sock=$work/qsd.sock
qemu-storage-daemon \
  --blockdev "driver=rbd,node-name=q0,pool=rbd,image=qsd,conf=$CEPH_CONF,user=admin,cache.direct=off" \
  --nbd-server "addr.type=unix,addr.path=$qsd_sock" \
  --export "type=nbd,id=e0,node-name=q0,name=qsd,writable=on" >"$work/qsd.log" 2>&1 &
qsd_pid=$!
for _ in $(seq 100); do [ -S "$qsd_sock" ] && break; sleep 0.1; done
[ -S "$qsd_sock" ] || { cat "$work/qsd.log" >&2; exit 1; }
qsd_uri="nbd+unix:///qsd?socket=$qsd_sock"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

# run_job NAME RW BS DEPTH URI PID -> "iops mibs cpu_ns_per_io"
run_job() {
  local name=$1 rw=$2 bs=$3 depth=$4 uri=$5 pid=$6 c0 c1 json
  c0=$(cpu_ticks "$pid")
  # --output: fio's nbd engine prints "connected to NBD server" on stdout.
  fio --name="$name" --ioengine=nbd --uri="$uri" --rw="$rw" --bs="$bs" \
    --iodepth="$depth" --size="${size_mib}M" --time_based --runtime="$runtime" \
    --output-format=json --output="$work/fio.json" >/dev/null 2>&1
  c1=$(cpu_ticks "$pid")
  json=$(cat "$work/fio.json")
  python3 -c '
import json, sys
j = json.loads(sys.argv[1])["jobs"][0]
ios = j["read"]["total_ios"] + j["write"]["total_ios"]
iops = j["read"]["iops"] + j["write"]["iops"]
mibs = (j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 1048576
cpu_ns = (int(sys.argv[3]) - int(sys.argv[2])) * 1e9 / int(sys.argv[4])
print("%.0f %.1f %.0f" % (iops, mibs, cpu_ns / max(ios, 1)))
' "$json" "$c0" "$c1" "$hz"
}

jobs=(
  "randread-4k-qd1 randread 4k 1"
  "randread-4k-qd32 randread 4k 32"
  "randwrite-4k-qd1 randwrite 4k 1"
  "randwrite-4k-qd32 randwrite 4k 32"
  "read-1m-qd4 read 1m 4"
  "write-1m-qd4 write 1m 4"
)
declare -A res
for round in $(seq "$rounds"); do
  for j in "${jobs[@]}"; do
    read -r name rw bs depth <<<"$j"
    # Alternate who goes first, so neither always runs on a warmer cluster.
    if ((round % 2)); then order="sb qsd"; else order="qsd sb"; fi
    for who in $order; do
      if [ "$who" = sb ]; then
        r=$(run_job "$name" "$rw" "$bs" "$depth" "$sb_uri" "$sb_pid")
      else
        r=$(run_job "$name" "$rw" "$bs" "$depth" "$qsd_uri" "$qsd_pid")
      fi
      res[$name.$who]+="$r;"
    done
  done
  echo "round $round of $rounds done (load $(cut -d' ' -f1 /proc/loadavg))" >&2
done

median() {
  # median of field $2 (1-based) of the ';'-separated triples in $1
  tr ';' '\n' <<<"$1" | awk -v f="$2" 'NF {print $f}' | sort -n |
    awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'
}
echo
echo "| job | softblk IOPS | qsd IOPS | IOPS softblk/qsd | softblk MiB/s | qsd MiB/s | softblk CPU ns/IO | qsd CPU ns/IO | CPU/IO softblk/qsd |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
for j in "${jobs[@]}"; do
  read -r name _ <<<"$j"
  si=$(median "${res[$name.sb]}" 1); qi=$(median "${res[$name.qsd]}" 1)
  sm=$(median "${res[$name.sb]}" 2); qm=$(median "${res[$name.qsd]}" 2)
  sc=$(median "${res[$name.sb]}" 3); qc=$(median "${res[$name.qsd]}" 3)
  python3 -c '
import sys
n, si, qi, sm, qm, sc, qc = sys.argv[1:]
r = lambda a, b: "%.2fx" % (float(a) / float(b)) if float(b) else "-"
print("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (n, si, qi, r(si, qi), sm, qm, sc, qc, r(sc, qc)))
' "$name" "$si" "$qi" "$sm" "$qm" "$sc" "$qc"
done
