#!/usr/bin/env bash
# Receive coalescing (coalesce-us): with a long window (1 ms) a pipelining
# client's data stays intact (fio nbd QD 32 random writes with crc32c
# verify), a client at queue depth 1 is never held back (it would get at
# most 1000 IOPS if each request waited the window), a client killed while
# its receive is held back leaves the server healthy, and a server stopped
# then exits promptly. The same writes with coalesce-us=0 for comparison.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib.sh"
need fio nbdinfo python3
fio --enghelp 2>/dev/null | grep -qw nbd || skip "this fio has no nbd engine"

start_server c -o coalesce-us=1000 d0 null memory_backed=1 size=64
pid=$SERVER_PID
uri=$(uri_of c d0)

iops() { python3 -c 'import json,sys
t=open(sys.argv[1]).read(); j=json.loads(t[t.index("{"):])["jobs"][0]
print(int(j["read"]["iops"] + j["write"]["iops"]))' "$1"; }

fio --name=v --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=32 --size=16M \
    --verify=crc32c --verify_fatal=1 --output-format=json >"$work/v.json" 2>"$work/v.err" ||
    fail "QD 32 verify with coalesce-us=1000 failed: $(tail -3 "$work/v.err")"
echo "== QD 32 randwrite+verify with coalesce-us=1000: $(iops "$work/v.json") IOPS, verified"

fio --name=q1 --ioengine=nbd --uri="$uri" --rw=randread --bs=4k --iodepth=1 --size=16M \
    --time_based --runtime=2 --output-format=json >"$work/q1.json" 2>/dev/null || fail "QD 1 run failed"
q1=$(iops "$work/q1.json")
echo "== QD 1 randread with coalesce-us=1000: $q1 IOPS"
[ "$q1" -gt 2000 ] || fail "QD 1 got $q1 IOPS: its receives are being held back"

# A client killed while the server may hold its receive back.
fio --name=k --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=32 --size=16M \
    --time_based --runtime=30 >/dev/null 2>&1 &
fio_pid=$!
sleep 1
kill -9 "$fio_pid"; wait "$fio_pid" 2>/dev/null || true
server_alive "$pid" || fail "server died when the client was killed"
size=$(nbdinfo --size "$uri") || fail "server does not answer after the client was killed"
[ "$size" = $((64 << 20)) ] || fail "size $size"

# Stop with a pipelining client connected: prompt exit.
fio --name=s --ioengine=nbd --uri="$uri" --rw=randread --bs=4k --iodepth=32 --size=16M \
    --time_based --runtime=30 >/dev/null 2>&1 &
fio_pid=$!
sleep 1
start=$(date +%s%N)
kill -TERM "$pid"
for _ in $(seq 100); do server_alive "$pid" || break; sleep 0.05; done
server_alive "$pid" && fail "server still running 5 s after SIGTERM with a client connected"
echo "== stopped with a QD 32 client connected in $((($(date +%s%N) - start) / 1000000)) ms"
wait "$fio_pid" 2>/dev/null || true

start_server p -o coalesce-us=0 d0 null memory_backed=1 size=64
fio --name=v --ioengine=nbd --uri="$(uri_of p d0)" --rw=randwrite --bs=4k --iodepth=32 --size=16M \
    --verify=crc32c --verify_fatal=1 --output-format=json >"$work/p.json" 2>/dev/null ||
    fail "QD 32 verify with coalesce-us=0 failed"
echo "== QD 32 randwrite+verify with coalesce-us=0: $(iops "$work/p.json") IOPS"
echo PASS
