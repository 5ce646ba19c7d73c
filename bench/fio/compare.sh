#!/usr/bin/env bash
# The fio engine against the in-process benchmark on the same workload and
# device: random read and random write (4 KiB, or --bs), queue depth 1 and
# 32, one job, on a memory-backed null device (docs/fio.md, "Cost of fio"). fio
# runs libsoftblk_fio.so twice: with its defaults, and lean
# (gtod_reduce=1: no per-I/O clock reads for latency statistics); the
# in-process side is softblk-bench-core --random, the same core path
# driven by a loop that does nothing else. Rounds are interleaved (the
# order of the three rotates each round) and the median of the rounds is
# printed, with the ratio fio / in-process and the machine line; figures
# from one run only are comparable.
#
# usage: bench/fio/compare.sh [--build DIR] [--rounds N] [--seconds S] [--bs BYTES] [--opts "K=V ..."]
#   --build    the build tree (default: build/ of this checkout)
#   --rounds   rounds per case (default 5)
#   --seconds  seconds per measurement (default 3)
#   --bs       bytes per I/O (default 4096): at larger sizes fio's own cost
#              per I/O weighs less against the data's
#   --opts     the null device's options (default "memory_backed=1 size=1024
#              hw_queue_depth=32", the same for both sides)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$root/build
rounds=5
seconds=3
bs=4096
opts="memory_backed=1 size=1024 hw_queue_depth=32"
while (($#)); do
  case $1 in
    --build) build=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --bs) bs=$2; shift 2 ;;
    --opts) opts=$2; shift 2 ;;
    *) sed -n '/^# usage/,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
  esac
done
engine=$build/bench/fio/libsoftblk_fio.so
core=$build/bench/core/softblk-bench-core
for f in "$engine" "$core"; do
  if [ ! -e "$f" ]; then
    echo "compare.sh: $f is missing: build it (ninja -C $build softblk_fio softblk-bench-core;" \
      "the engine needs scripts/fetch-fio-source.sh first)" >&2
    exit 1
  fi
done
if ! command -v fio >/dev/null || ! command -v jq >/dev/null; then
  echo "compare.sh: needs fio and jq (scripts/install-deps.sh)" >&2
  exit 1
fi

# shellcheck source=../common/machine.sh
. "$root/bench/common/machine.sh"
machine_line
echo "fio $(fio --version); device: null $opts; $bs bytes per I/O, 1 job, $seconds s x $rounds rounds, median"

run_core() { # OP DEPTH
  local out
  out=$("$core" --seconds "$seconds" --random "$1" --depth "$2" --bs "$bs" --opts "$opts") || {
    # A request larger than the device takes (max_sectors) fails every
    # time: say so rather than print the rate of failures.
    echo "compare.sh: in-process run failed ($out); for --bs above 127.5 KiB give" \
      "--opts with max_sectors" >&2
    exit 1
  }
  awk '/^iops/ {print $2}' <<<"$out"
}
run_fio() { # OP DEPTH EXTRA...
  local op=$1 depth=$2
  shift 2
  fio --name=compare --ioengine="external:$engine" --softblk_target=null --softblk_opts="$opts" \
    --rw="rand$op" --bs="$bs" --iodepth="$depth" --time_based --runtime="$seconds" \
    --ramp_time=0.2 --norandommap --randrepeat=0 --output-format=json "$@" 2>/dev/null |
    jq '.jobs[0].read.iops + .jobs[0].write.iops | floor'
}
median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

declare -A samples
cases=("read 1" "read 32" "write 1" "write 32")
systems=(core fio fio-lean)
for ((r = 1; r <= rounds; r++)); do
  for c in "${cases[@]}"; do
    read -r op depth <<<"$c"
    for ((k = 0; k < 3; k++)); do
      s=${systems[$(((k + r) % 3))]}
      case $s in
        core) v=$(run_core "$op" "$depth") ;;
        fio) v=$(run_fio "$op" "$depth") ;;
        fio-lean) v=$(run_fio "$op" "$depth" --gtod_reduce=1) ;;
      esac
      samples[$s/$c]+="$v "
    done
    if [ -t 2 ]; then
      printf '\rround %d/%d: %-9s' "$r" "$rounds" "$c" >&2
    fi
  done
done
if [ -t 2 ]; then
  printf '\r%40s\r' '' >&2
fi

printf '%-14s %14s %14s %7s %14s %7s\n' case in-process fio ratio fio-lean ratio
for c in "${cases[@]}"; do
  read -r op depth <<<"$c"
  core_m=$(tr ' ' '\n' <<<"${samples[core/$c]}" | grep . | median)
  fio_m=$(tr ' ' '\n' <<<"${samples[fio/$c]}" | grep . | median)
  lean_m=$(tr ' ' '\n' <<<"${samples[fio-lean/$c]}" | grep . | median)
  awk -v n="rand$op QD$depth" -v c="$core_m" -v f="$fio_m" -v l="$lean_m" 'BEGIN {
    printf "%-14s %10.0f k  %10.0f k  %6.2f %10.0f k  %6.2f\n", n, c / 1e3, f / 1e3, f / c, l / 1e3, l / c }'
done
echo "IOPS; ratio: fio / in-process (1.00: as fast as the in-process loop)"
