#!/usr/bin/env bash
# How the server takes requests in and sends replies out in batches (see
# "Sends" and "Receive coalescing" in docs/nbd.md), on a raw socket:
#  - many requests in one send (more than a connection takes at once, and
#    more than its 256 KiB receive buffer holds), answered once each, data intact;
#  - requests split at every awkward place (inside the header, inside a
#    write payload), one byte at a time;
#  - a slow reader: replies that do not fit in the socket go out later
#    through the ring, in order and intact, while the loop keeps serving
#    another client;
#  - a 32 MiB read reply (the maximum), far larger than the socket holds;
#  - at queue depth 1 the loop never waits with a timeout (a timed wait
#    arms and cancels a timer per request, the most expensive thing the
#    server did per request in a VM): no io_uring_enter with
#    IORING_ENTER_EXT_ARG while a client reads one block at a time.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib.sh"
need python3

start_server b d0 null memory_backed=1 size=64
pid=$SERVER_PID
sock=$(uri_of b d0 | sed 's/.*socket=//')

python3 - "$sock" <<'PY' || fail "batched requests (see above)"
import socket, struct, sys, threading, time
from nbd_raw import connect, go, greet, recv_exact

path = sys.argv[1]
READ, WRITE = 0, 1
MAGIC_REQ, SIMPLE, STRUCTURED = 0x25609513, 0x67446698, 0x668E33EF
CHUNK_OFFSET_DATA = 1

def req(typ, cookie, off, ln, payload=b""):
    return struct.pack(">IHHQQI", MAGIC_REQ, 0, typ, cookie, off, ln) + payload

def pattern(off, ln, salt):
    # Distinct bytes per 8-byte word: a block written at the wrong place,
    # or another request's data, does not match.
    return b"".join(struct.pack(">Q", (o * 2654435761 + salt) & (2**64 - 1))
                    for o in range(off // 8, (off + ln) // 8))

def replies(s, count):
    """Reads `count` replies: {cookie: (error, data or None)}."""
    got = {}
    for _ in range(count):
        magic, = struct.unpack(">I", recv_exact(s, 4))
        if magic == SIMPLE:
            err, cookie = struct.unpack(">IQ", recv_exact(s, 12))
            data = None
        else:
            assert magic == STRUCTURED, hex(magic)
            flags, typ, cookie, ln = struct.unpack(">HHQI", recv_exact(s, 16))
            assert typ == CHUNK_OFFSET_DATA and flags & 1, (flags, typ)
            recv_exact(s, 8)  # offset
            data, err = recv_exact(s, ln - 8), 0
        assert cookie not in got, f"cookie {cookie} answered twice"
        got[cookie] = (err, data)
    return got

def session():
    s = connect(path, timeout=30)
    greet(s)
    go(s)
    return s

blk = 4096
# Many requests in one send: 400 writes (more than the 128 requests a
# connection takes at once; 1.6 MiB, more than its 256 KiB receive buffer),
# then 400 reads of them in another single send.
s = session()
n = 400
s.sendall(b"".join(req(WRITE, i, i * blk, blk, pattern(i * blk, blk, 1)) for i in range(n)))
got = replies(s, n)
assert sorted(got) == list(range(n)), "not every write answered"
assert all(e == 0 for e, _ in got.values()), "a write failed"
s.sendall(b"".join(req(READ, 1000 + i, i * blk, blk) for i in range(n)))
got = replies(s, n)
for i in range(n):
    err, data = got[1000 + i]
    assert err == 0 and data == pattern(i * blk, blk, 1), f"read {i}: wrong data"
print(f"== {n} writes then {n} reads, each batch in one send: answered once each, data intact")

# Split everywhere: a write whose header and payload arrive a byte at a
# time, then a read likewise.
off = 7 * blk
msg = req(WRITE, 5000, off, 2 * blk, pattern(off, 2 * blk, 2)) + req(READ, 5001, off, 2 * blk)
for i in range(0, len(msg), 1):
    s.send(msg[i:i + 1])
    if i < 64 or i % 997 == 0:
        time.sleep(0.0005)
got = replies(s, 2)
assert got[5000][0] == 0 and got[5001][1] == pattern(off, 2 * blk, 2), "split requests"
print("== a write and a read sent one byte at a time: answered, data intact")

# A slow reader: 64 reads of 256 KiB (16 MiB of replies) sent at once into
# a small receive buffer, nothing read for a second. Meanwhile another
# client is served (the loop does not wait for the stuck replies).
big = 256 << 10
slow = connect(path, timeout=30)
slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
greet(slow)
go(slow)
for i in range(16):  # 4 MiB of known data
    off = i * big
    s.sendall(req(WRITE, 6000 + i, off, big, pattern(off, big, 3)))
    assert replies(s, 1)[6000 + i][0] == 0
slow.sendall(b"".join(req(READ, 7000 + i, (i % 16) * big, big) for i in range(64)))
time.sleep(0.5)
t0 = time.monotonic()
s.sendall(req(READ, 5002, 0, blk))
assert replies(s, 1)[5002][1] == pattern(0, blk, 3), "other client"
other_ms = (time.monotonic() - t0) * 1000
assert other_ms < 500, f"another client waited {other_ms:.0f} ms behind a slow reader"
time.sleep(0.5)
got = replies(slow, 64)
for i in range(64):
    err, data = got[7000 + i]
    assert err == 0 and data == pattern((i % 16) * big, big, 3), f"slow read {i}"
print(f"== slow reader: 64 x 256 KiB replies intact; another client served in {other_ms:.1f} ms")

# The largest reply: 32 MiB (the maximum block size), far past what the
# socket holds.
top = 32 << 20
for i in range(top // big):
    off = i * big
    s.sendall(req(WRITE, 8000 + i, off, big, pattern(off, big, 4)))
got = replies(s, top // big)
assert all(e == 0 for e, _ in got.values())
s.sendall(req(READ, 9000, 0, top))
got = replies(s, 1)
assert got[9000][1] == pattern(0, top, 4), "32 MiB read"
print("== one 32 MiB read reply intact")
PY

# Queue depth 1 never waits with a timeout.
if command -v strace >/dev/null; then
  strace -f -qq -e trace=io_uring_enter -o "$work/enter.trace" -p "$pid" 2>"$work/strace.err" &
  strace_pid=$!
  sleep 1
  python3 - "$sock" <<'PY' || fail "QD 1 reads"
import struct, sys
from nbd_raw import connect, go, greet, recv_exact
s = connect(sys.argv[1])
greet(s)
go(s)
for i in range(500):
    s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, i, (i % 64) * 4096, 4096))
    recv_exact(s, 20 + 4096)
PY
  sleep 0.5
  kill -INT "$strace_pid"; wait "$strace_pid" 2>/dev/null || true
  enters=$(grep -c io_uring_enter "$work/enter.trace" || true)
  timed=$(grep -c IORING_ENTER_EXT_ARG "$work/enter.trace" || true)
  echo "== QD 1, 500 reads: $enters io_uring_enter calls, $timed of them with a timeout"
  [ "$enters" -ge 500 ] || fail "strace saw only $enters io_uring_enter calls: $(head -3 "$work/strace.err")"
  [ "$timed" -le 5 ] || fail "$timed timed waits for 500 requests at QD 1 (a timer per request)"
else
  echo "== strace not installed: the QD 1 timed-wait check is skipped"
fi
server_alive "$pid" || fail "server died"
echo PASS
