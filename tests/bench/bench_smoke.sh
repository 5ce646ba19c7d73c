#!/usr/bin/env bash
# `softblk bench smoke`: every implemented plan's code path (core, exports,
# file, fat, and rnull and zloop in one VM boot) with tiny sizes and 0.5 s
# runs; the results folder must hold every expected case with status ok
# and plausible figures
# (bench/plans/smoke_check.py), and nothing may stay mounted or attached,
# also after a run interrupted (SIGINT) while its peers are up.
set -euo pipefail
softblk=${1:?usage: bench_smoke.sh SOFTBLK}
here=$(cd "$(dirname "$0")" && pwd)
check=$here/../../bench/plans/smoke_check.py
skip() { echo "SKIP: $*" >&2; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (loop devices, FUSE mounts)"
[ -c /dev/fuse ] && [ -c /dev/loop-control ] || skip "needs /dev/fuse and /dev/loop-control"
for tool in fio losetup qemu-storage-daemon nbdkit nbdfuse mcopy python3; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/install-deps.sh)"
done
grep -qw nbd <<<"$(fio --enghelp 2>/dev/null)" || skip "this fio has no nbd engine"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rc=0
t0=$SECONDS
"$softblk" bench smoke --out "$out" || rc=$?
took=$((SECONDS - t0))
dir=$(ls -d "$out"/smoke-* 2>/dev/null | head -1)
[ -n "$dir" ] || { echo "FAIL: no results folder (exit $rc)" >&2; exit 1; }
python3 "$check" "$dir" || { echo "FAIL: $dir is not complete" >&2; exit 1; }
[ "$rc" = 0 ] || { echo "FAIL: softblk bench smoke exited with $rc" >&2; exit 1; }
# rnull's and zloop's code paths share one VM boot (a boot under TCG is
# most of the run's time): one guest log, or none where the lab skipped.
boots=$(find "$dir" -maxdepth 1 -name 'vm-*.log' | wc -l)
[ "$boots" -le 1 ] || { echo "FAIL: $boots VM boots, not one: $(ls "$dir")" >&2; exit 1; }
# The time is printed, not bounded: on a shared machine it is the load's
# (docs/bench.md, smoke). Where it went: machine.json's timing_s.
echo "bench_smoke: softblk bench smoke took $took s (load average $(cut -d' ' -f1-3 /proc/loadavg));" \
  "ended, in s from the start: $(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("timing_s"))' "$dir/machine.json")"

# Interrupted once its peers run and fio measures: exit 130, cleaned up.
"$softblk" bench exports --quick --runtime 1 --out "$out/int" 2>"$out/int.log" &
pid=$!
for _ in $(seq 600); do
  grep -qs "^fio .*--ioengine=nbd" "$out"/int/exports-*/commands.txt && break
  sleep 0.1
done
kill -INT "$pid"
rc=0; wait "$pid" || rc=$?
[ "$rc" = 130 ] || { echo "FAIL: interrupted run exited with $rc, not 130: $(tail -3 "$out/int.log")" >&2; exit 1; }
grep -q "interrupted; cleaning up" "$out/int.log" || { echo "FAIL: $(tail -3 "$out/int.log")" >&2; exit 1; }
# The driver's work directory is /dev/shm/softblk-bench-*: nothing of it
# stays, and no process started for it (fio's job processes once outlived
# the interrupted fio) is left.
work=$(grep -o -m1 '/dev/shm/softblk-bench-[^/ ]*' "$out"/int/exports-*/commands.txt || true)
if [ -n "$work" ] && left=$(pgrep -a -f -- "$work"); then
  echo "FAIL: left running after the interrupted run: $left" >&2
  pkill -KILL -f -- "$work" || true
  exit 1
fi
if grep -q " /dev/shm/softblk-bench-" /proc/self/mounts; then
  echo "FAIL: left mounted: $(grep " /dev/shm/softblk-bench-" /proc/self/mounts)" >&2; exit 1
fi
if losetup -nO BACK-FILE | grep -q "^/dev/shm/softblk-bench-"; then
  echo "FAIL: left attached: $(losetup -nO NAME,BACK-FILE | grep /dev/shm/softblk-bench-)" >&2; exit 1
fi
echo "bench_smoke: ok ($(wc -l <"$dir/samples.jsonl") samples)"
