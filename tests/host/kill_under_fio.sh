#!/usr/bin/env bash
# Kill -9 of the daemon under fio, for every persistent target: in each
# round fio writes random 4 KiB blocks with crc32c verification headers
# through the device's FUSE + loop export (libaio, QD 16, O_DIRECT) and
# saves its verify state; the daemon is killed with SIGKILL at a random
# moment; the next `softblk` command starts a daemon that recovers the
# device from its state file; fio then verifies every write it saw
# completed (--verify_only --verify_state_load). fio counts the writes that failed when the daemon died as
# done; the test takes those out (they were never acknowledged) and fails
# on any other block that does not verify. Before the rounds, the test shows it can fail: a block fio
# wrote is overwritten behind its back, and the verification must notice.
#
# Targets: the persistent ones this build has (`softblk features` lists
# them); today the file target. A zoned persistent target (zloop) cannot
# be exported through FUSE and has its own crash test in the VM lab.
#
# Usage: kill_under_fio.sh PATH/TO/softblk [ROUNDS]   (exit 77: skipped)
set -euo pipefail

softblk=${1:?usage: $0 PATH/TO/softblk [ROUNDS]}
rounds=${2:-${KILL_ROUNDS:-8}}
skip() { echo "SKIP: $*"; exit 77; }
sb() { timeout 60 "$softblk" "$@"; }
[ "$(id -u)" -eq 0 ] || skip "needs root (FUSE mount and loop device)"
[ -c /dev/fuse ] || skip "no /dev/fuse"
[ -e /dev/loop-control ] || skip "no /dev/loop-control"
command -v fio >/dev/null || skip "fio is not installed (scripts/install-deps.sh)"

run_dir=$(mktemp -d /tmp/softblk-kill.XXXXXX)
export SOFTBLK_RUN_DIR=$run_dir
work=$run_dir/work
mkdir -p "$work"
fio_pid=
source "$(dirname "$0")/../support/lib_run_dir.sh"
cleanup() {
  set +e
  [ -n "$fio_pid" ] && kill -9 "$fio_pid" 2>/dev/null
  clear_run_dir "$run_dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; [ -f "$run_dir/daemon.log" ] && tail -20 "$run_dir/daemon.log" >&2; exit 1; }
note() { echo "== $*"; }

# The loop device of device NAME, from `softblk list --json`.
loop_of() {
  sb list --json | /usr/bin/python3 -c '
import json, sys
for d in json.load(sys.stdin):
    if d.get("name") == sys.argv[1]:
        print((d.get("export") or {}).get("loop", ""))' "$1"
}

# fio's job: the same offsets and seed in the writing and the verifying run.
size=128M
fio_job() {
  fio --name=w --filename="$1" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k \
    --iodepth=16 --size=$size --randseed=20261201 --verify=crc32c --verify_state_save=1 \
    --output-format=terse "${@:2}"
}

run_target() {  # NAME ADD-ARGS...
  local name=$1
  shift
  note "$name: add $*"
  sb add "$@" --name "$name" --export fuse >/dev/null || fail "$name: add failed"
  local loop
  loop=$(loop_of "$name")
  [ -b "$loop" ] || fail "$name: no loop device ($(sb list))"

  # The test can fail: a block that fio wrote and then finds changed.
  (cd "$work" && fio_job "$loop" --do_verify=0 --number_ios=64 >/dev/null) || fail "$name: first fio run"
  local image=${2#path=}
  sb del "$name" >/dev/null || fail "$name: del"
  # Every block fio wrote carries its header; zero one of the first 64.
  local victim
  victim=$(/usr/bin/python3 - "$image" <<'EOF'
import sys
with open(sys.argv[1], "rb") as f:
    block = 0
    while True:
        data = f.read(4096)
        if not data:
            break
        if any(data):
            print(block)
            break
        block += 1
EOF
  )
  [ -n "$victim" ] || fail "$name: fio wrote nothing to $image"
  dd if=/dev/zero of="$image" bs=4096 seek="$victim" count=1 conv=notrunc status=none
  sb add "$@" --name "$name" --export fuse >/dev/null || fail "$name: re-add failed"
  loop=$(loop_of "$name")
  if (cd "$work" && fio_job "$loop" --verify_only --verify_state_load=1 >/dev/null 2>&1); then
    fail "$name: fio's verification did not notice a block zeroed behind its back"
  fi
  echo "ok: the verification notices a lost write (block $victim)"
  rm -f "$work"/*.state

  local round killed_at checked=0 verified lost
  for round in $(seq "$rounds"); do
    loop=$(loop_of "$name")
    [ -b "$loop" ] || fail "$name round $round: no loop device ($(sb list))"
    local pid stat writes_before
    pid=$(cat "$run_dir/daemon.pid")
    stat=/sys/block/$(basename "$loop")/stat
    writes_before=$(awk '{print $5}' "$stat")
    (cd "$work" && fio_job "$loop" --do_verify=0 >"$work/fio.$round" 2>&1) &
    fio_pid=$!
    # Kill once fio's writes are under way, at a random moment of the next
    # two seconds.
    for _ in $(seq 200); do
      [ "$(awk '{print $5}' "$stat")" -gt "$writes_before" ] && break
      sleep 0.05
    done
    killed_at=$(awk -v r=$RANDOM 'BEGIN {printf "%.2f", 0.2 + (r % 180) / 100}')
    sleep "$killed_at"
    kill -9 "$pid"
    wait "$fio_pid" || true
    fio_pid=
    ls "$work"/*verify.state >/dev/null 2>&1 || fail "$name round $round: fio saved no verify state"
    # Any command starts a daemon, which recovers the device first.
    sb list >/dev/null || fail "$name round $round: no daemon after the kill"
    loop=$(loop_of "$name")
    [ -b "$loop" ] || fail "$name round $round: not recovered ($(sb list))"
    # fio counts the writes that failed with EIO when the daemon died as
    # done in its saved state; they were never acknowledged, so their
    # blocks may hold old data. Any other block that does not verify is a
    # lost write.
    verified=$(cd "$work" && fio_job "$loop" --verify_only --verify_state_load=1 2>&1) || true
    { grep -o 'write offset=[0-9]*' "$work/fio.$round" || true; } | sed 's/.*=//' | sort -u >"$work/failed"
    { grep -o 'verify: .* offset [0-9]*' <<<"$verified" || true; } | sed 's/.* //' | sort -u >"$work/bad"
    lost=$(comm -23 "$work/bad" "$work/failed" | wc -l)
    [ "$lost" -eq 0 ] ||
      fail "$name round $round: after the kill at ${killed_at}s, $lost acknowledged writes are lost: $(comm -23 "$work/bad" "$work/failed" | head -3 | tr '\n' ' ')"
    checked=$((checked + 1))
    rm -f "$work"/*.state
    echo "ok: round $round: killed at ${killed_at}s, every acknowledged write verified" \
      "($(wc -l <"$work/failed") unacknowledged)"
  done
  sb del "$name" >/dev/null || fail "$name: final del"
  echo "ok: $name: $checked rounds"
}

# Every persistent target this build has.
tested=0
if "$softblk" features file >/dev/null 2>&1; then
  run_target kf file "path=$work/file.img" size=$size create=1
  tested=$((tested + 1))
fi
[ "$tested" -gt 0 ] || skip "no persistent target in this build"
kill -0 "$(cat "$run_dir/daemon.pid")" || fail "the daemon died"
echo PASS
