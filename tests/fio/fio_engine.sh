#!/usr/bin/env bash
# fio drives softblk devices in-process through libsoftblk_fio.so
# (docs/fio.md): fio's own verify workloads must pass on the memory-backed
# null target and on the file target, at queue depth 1 and 32 and several
# block sizes; flush (fsync) and FUA (sync=1) must reach the device; and
# the checks must be able to fail: verifying a null target that keeps no
# data, trimming one without discard, and an unknown target all fail.
#
#   fio_engine.sh ENGINE.so
set -uo pipefail

engine=${1:?usage: fio_engine.sh libsoftblk_fio.so}
if ! command -v fio >/dev/null; then
  echo "SKIP: fio is not installed (scripts/install-deps.sh)"
  exit 77
fi
if [ ! -f "$engine" ]; then
  echo "SKIP: $engine was not built: see the 'softblk: fio engine' line of cmake's output" \
    "(scripts/fetch-fio-source.sh fetches fio's source; sanitizer builds leave it out)"
  exit 77
fi

if ! command -v jq >/dev/null; then
  echo "SKIP: jq is not installed (scripts/install-deps.sh)"
  exit 77
fi

work=$(mktemp -d /tmp/softblk-fio-engine.XXXXXX)
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# run NAME FIO-ARGS...: fio with the engine; output in $work/NAME.out.
run() {
  local name=$1
  shift
  timeout 120 fio --name="$name" --ioengine="external:$engine" --output-format=normal \
    "$@" >"$work/$name.out" 2>&1
}

# expect_pass NAME ARGS...: fio exits 0 with no job error and, for a
# verify workload, read back everything it wrote.
expect_pass() {
  local name=$1
  if ! run "$@"; then
    fail "$name: fio exited non-zero"
    cat "$work/$name.out"
    return 1
  fi
  if ! grep -q "err= 0" "$work/$name.out" || grep -qi "verify: bad\|bad magic\|crc32c: wanted\|md5: wanted" "$work/$name.out"; then
    fail "$name: fio reported an error"
    cat "$work/$name.out"
    return 1
  fi
  echo "ok: $name"
}

null_mem=(--softblk_target=null "--softblk_opts=memory_backed=1 size=256 discard=1")

# Random writes verified with crc32c: queue depth 1 and 32, block sizes from
# one sector to larger than the device's largest request (the core splits).
for depth in 1 32; do
  for bs in 512 4k 64k 1m; do
    expect_pass "randwrite-crc32c-qd$depth-bs$bs" "${null_mem[@]}" --rw=randwrite --bs="$bs" \
      --iodepth="$depth" --size=32m --verify=crc32c --do_verify=1 --verify_fatal=1
  done
done
# Mixed random reads and writes of mixed sizes, verified with md5 (fio
# checks each block it reads that it wrote before).
expect_pass randrw-md5 "${null_mem[@]}" --rw=randrw --bsrange=4k-128k --iodepth=16 \
  --size=64m --verify=md5 --do_verify=1 --verify_fatal=1
# Trim then write, verified: discard reaches the target.
expect_pass trimwrite-crc32c "${null_mem[@]}" --rw=randtrimwrite --bs=8k --iodepth=8 \
  --size=32m --verify=crc32c --do_verify=1 --verify_fatal=1
if ! grep -q "trim: IOPS" "$work/trimwrite-crc32c.out"; then
  fail "trimwrite-crc32c: fio shows no trims"
fi
# Two jobs, in threads and in processes, each on a device of its own (each
# writes its own state file), with a queue as deep as iodepth.
for mode in --thread --thread=0; do
  rm -f "$work"/jobs.json*
  expect_pass "two-jobs$mode" "${null_mem[@]}" "$mode" --numjobs=2 --rw=randwrite --bs=4k \
    --iodepth=128 --size=16m --verify=crc32c --do_verify=1 --verify_fatal=1 \
    "--softblk_describe=$work/jobs.json"
  for n in 0 1; do
    if [ "$(jq .queue_depth "$work/jobs.json.$n" 2>/dev/null)" != 128 ]; then
      fail "two-jobs$mode: job $n's state file is missing or its queue is not 128 deep"
    fi
  done
done
# Another target type: the file target on a sparse image.
expect_pass file-target --softblk_target=file \
  "--softblk_opts=path=$work/image size=64M create=1" --rw=randwrite --bs=16k --iodepth=32 \
  --size=32m --verify=crc32c --do_verify=1 --verify_fatal=1

# Flush and FUA reach the device: with a write-back cache (cache_size),
# plain writes stay unflushed in it, sync=1 (FUA) writes go past it, and
# end_fsync=1 (a flush) writes every page back. The counters come from the
# device's own state (softblk_describe).
cache=(--softblk_target=null "--softblk_opts=memory_backed=1 size=64 cache_size=16" --rw=randwrite
  --bs=4k --size=8m --iodepth=4 --randrepeat=0 --norandommap=0)
cache_state() { jq -c '.target.cache | [.bypassed, .unflushed_pages, .written_back_pages]' "$1"; }
expect_pass cache-plain "${cache[@]}" "--softblk_describe=$work/plain.json"
expect_pass cache-fua "${cache[@]}" --sync=1 "--softblk_describe=$work/fua.json"
expect_pass cache-flush "${cache[@]}" --end_fsync=1 "--softblk_describe=$work/flush.json"
# 8 MiB of 4 KiB writes: 2048 pages.
[ "$(cache_state "$work/plain.json")" = "[0,2048,0]" ] ||
  fail "plain writes: cache [bypassed,unflushed,written back] is $(cache_state "$work/plain.json"), want [0,2048,0]"
[ "$(cache_state "$work/fua.json")" = "[2048,0,0]" ] ||
  fail "sync=1 writes are not FUA: cache is $(cache_state "$work/fua.json"), want [2048,0,0]"
[ "$(cache_state "$work/flush.json")" = "[0,0,2048]" ] ||
  fail "end_fsync=1 did not flush: cache is $(cache_state "$work/flush.json"), want [0,0,2048]"
echo "ok: flush and FUA counters"

# The checks can fail. A null target without memory reads back zeros, so
# fio's verify must fail on it.
if run no-data --softblk_target=null "--softblk_opts=memory_backed=0 size=64" --rw=randwrite \
  --bs=4k --iodepth=8 --size=8m --verify=crc32c --do_verify=1; then
  fail "no-data: fio's verify passed on a device that keeps no data"
elif ! grep -q "verify" "$work/no-data.out"; then
  fail "no-data: fio failed, but not in verify"
  cat "$work/no-data.out"
else
  echo "ok: verify fails on memory_backed=0"
fi
# Trim on a target without discard fails with EOPNOTSUPP.
if run no-discard --softblk_target=null "--softblk_opts=memory_backed=1 size=64" --rw=randtrim \
  --bs=4k --size=8m; then
  fail "no-discard: trim passed on a device without discard"
elif ! grep -q "err=95" "$work/no-discard.out"; then
  fail "no-discard: fio failed, but not with EOPNOTSUPP (95)"
  cat "$work/no-discard.out"
else
  echo "ok: trim without discard fails with EOPNOTSUPP"
fi
# Two files on one device would overwrite each other: refused.
if run two-files "${null_mem[@]}" --nrfiles=2 --rw=randwrite --bs=4k --size=8m ||
  ! grep -q "a job drives one device" "$work/two-files.out"; then
  fail "two-files: nrfiles=2 was not refused"
  cat "$work/two-files.out"
else
  echo "ok: nrfiles=2 refused"
fi
# An unknown target type and a zoned one are refused with the reason.
if run bad-target --softblk_target=nosuch --rw=read --size=1m ||
  ! grep -q "unknown target type" "$work/bad-target.out"; then
  fail "bad-target: not refused with 'unknown target type'"
  cat "$work/bad-target.out"
else
  echo "ok: unknown target refused"
fi
if run zoned --softblk_target=zloop-ram "--softblk_opts=capacity_mb=64 zone_size_mb=4" --rw=read \
  --size=1m || ! grep -q "zoned device" "$work/zoned.out"; then
  fail "zoned: a zoned device was not refused"
  cat "$work/zoned.out"
else
  echo "ok: zoned target refused"
fi

if ((failures)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all fio engine checks passed"
