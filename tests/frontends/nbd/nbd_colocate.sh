#!/usr/bin/env bash
# colocate (docs/nbd.md "Serving next to the client"): with colocate=1 the
# loop thread that serves a client waiting for each reply (QD 1 over the
# unix socket, the client pinned to one CPU) is pinned to that CPU and is
# back under SCHED_OTHER between requests. While a client pipelines (fio at
# QD 32, with crc32c verify) it stays next to it by requests per CPU time
# (poll-goal=cpu, the default) and serves from any CPU by requests per
# second (poll-goal=rate). With colocate=0 it is never pinned. The data
# stays intact either way.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib.sh"
need python3 taskset fio
fio --enghelp 2>/dev/null | grep -qw nbd || skip "this fio has no nbd engine"
cpu=$(python3 -c 'import os; print(max(os.sched_getaffinity(0)))')
[ "$(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')" -ge 2 ] ||
  skip "one CPU: client and server share it anyway"

# Threads of PID allowed on CPU $cpu alone, and threads not under
# SCHED_OTHER (field 41 of their stat).
pinned_threads() {
  local t n=0
  for t in /proc/"$1"/task/*; do
    [ "$(awk '/^Cpus_allowed_list:/ {print $2}' "$t/status")" = "$cpu" ] && n=$((n + 1))
  done
  echo "$n"
}
unusual_policies() {
  local t n=0
  for t in /proc/"$1"/task/*; do
    [ "$(sed 's/.*) //' "$t/stat" | awk '{print $39}')" = 0 ] || n=$((n + 1))
  done
  echo "$n"
}

# qd1_reads SOCKET SECONDS: READs of 4 KiB one at a time, on CPU $cpu.
qd1_reads() {
  taskset -c "$cpu" python3 - "$1" "$2" <<'PY'
import sys, time
from nbd_raw import connect, greet, go, request, recv_exact
s = connect(sys.argv[1])
greet(s)
go(s, structured=False)
n, end = 0, time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    request(s, 0, (n % 1000) * 4096, 4096, cookie=n)
    recv_exact(s, 16 + 4096)
    n += 1
print(n)
PY
}

# MODE: colocate=1 by requests per CPU time, by requests per second, and
# colocate=0.
for mode in 1 1rate 0; do
  goal=cpu
  [ "$mode" != 1rate ] || goal=rate
  start_server "c$mode" -o colocate="${mode%rate}" -o poll-goal="$goal" -o threads=1 \
    d0 null memory_backed=1 size=64
  pid=$SERVER_PID
  sock=$(uri_of "c$mode" d0 | sed 's/.*socket=//')
  qd1_reads "$sock" 2 >"$work/q$mode.out" &
  client=$!
  sleep 1
  during=$(pinned_threads "$pid")
  wait "$client" || fail "colocate=$mode: the QD 1 client failed"
  echo "== colocate=$mode: $(cat "$work/q$mode.out") QD 1 reads in 2 s; threads pinned to CPU $cpu: $during"
  if [ "$mode" != 0 ]; then
    [ "$during" = 1 ] || fail "colocate=$mode: $during threads pinned to the client's CPU $cpu, not 1"
  else
    [ "$during" = 0 ] || fail "colocate=0: $during threads pinned to CPU $cpu"
  fi
  sleep 0.2
  [ "$(unusual_policies "$pid")" = 0 ] || fail "colocate=$mode: a thread is not back under SCHED_OTHER"
  uri=$(uri_of "c$mode" d0)
  taskset -c "$cpu" fio --name=v --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=32 \
    --size=16M --time_based --runtime=2 --verify=crc32c --verify_fatal=1 --verify_backlog=1024 \
    --output-format=json >"$work/v$mode.json" 2>"$work/v$mode.err" &
  client=$!
  sleep 1
  during=$(pinned_threads "$pid")
  wait "$client" || fail "colocate=$mode: QD 32 verify failed: $(tail -3 "$work/v$mode.err")"
  echo "== colocate=$mode: QD 32 randwrite with verify intact; threads pinned meanwhile: $during"
  if [ "$mode" = 1 ]; then
    [ "$during" = 1 ] || fail "colocate=1, poll-goal=cpu: the loop left the pipelining client's CPU"
  else
    [ "$during" = 0 ] || fail "colocate=$mode: the loop stayed pinned while the client pipelined"
  fi
  kill "$pid"
  wait "$pid" || true
done
echo "PASS"
