#!/usr/bin/env bash
# Bad input and bad clients: malformed handshakes and requests, a client
# killed in the middle of a transfer, 1000 connections opened and dropped,
# the connection limit. The server must stay up and the data intact.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib.sh"
need nbdcopy nbdinfo python3

start_server s -o max-connections=1100 d0 null memory_backed=1 size=64
sock="$work/nbd.sock"
U=$(uri_of s d0)
head -c $((32 << 20)) /dev/urandom >"$work/a.img"
nbdcopy "$work/a.img" "$U"
first32() { nbdcopy "$U" "$work/dump.img" && head -c $((32 << 20)) "$work/dump.img" | md5sum; }
sum_before=$(first32)

python3 - "$sock" <<'PY' || fail "raw protocol abuse (see above)"
import os, random, socket, struct, sys, time
from nbd_raw import OPT, closed, go, greet, option, recv_exact, reply
import nbd_raw
path = sys.argv[1]

def conn():
    return nbd_raw.connect(path)

# 1. Garbage instead of client flags; bad option magic; unknown client flags.
for junk in (b"\xff" * 4, struct.pack(">I", 3) + b"\0" * 16, struct.pack(">I", 0x100)):
    s = conn(); recv_exact(s, 18); s.sendall(junk); assert closed(s); s.close()

# 2. Unknown option, truncated GO, an oversized option: errors, then a working GO.
s = conn(); greet(s)
option(s, 0x12345); assert reply(s)[1] == 0x80000001
option(s, 7, b"\0\0\0\x50d0"); assert reply(s)[1] == 0x80000003
s.sendall(struct.pack(">QII", OPT, 6, 200000) + b"A" * 200000); assert reply(s)[1] == 0x80000009
go(s)
# 3. Requests: bad flags, out of range, a huge length, unknown command: errors, in sync.
def request(s, typ, off, ln, flags=0, cookie=1, payload=b""):
    s.sendall(struct.pack(">IHHQQI", 0x25609513, flags, typ, cookie, off, ln) + payload)
def simple_or_chunk(s):
    magic = struct.unpack(">I", recv_exact(s, 4))[0]
    if magic == 0x67446698:
        err, cookie = struct.unpack(">IQ", recv_exact(s, 12)); return cookie, err, b""
    assert magic == 0x668e33ef, hex(magic)
    flags, typ, cookie, ln = struct.unpack(">HHQI", recv_exact(s, 16))
    body = recv_exact(s, ln)
    err = struct.unpack(">I", body[:4])[0] if typ & 0x8000 else 0
    return cookie, err, body
request(s, 0, 0, 512, flags=0x8000, cookie=10); assert simple_or_chunk(s)[:2] == (10, 22)
request(s, 0, 1 << 40, 512, cookie=11); assert simple_or_chunk(s)[:2] == (11, 22)
request(s, 0, 0, 0xffffffff, cookie=12); assert simple_or_chunk(s)[1] in (22, 75)
request(s, 99, 0, 0, cookie=13); assert simple_or_chunk(s)[:2] == (13, 22)
request(s, 1, (64 << 20) - 512, 1024, cookie=14, payload=b"z" * 1024); assert simple_or_chunk(s)[:2] == (14, 28)
request(s, 7, 0, 4096, cookie=15); assert simple_or_chunk(s)[:2] == (15, 22)   # no meta context
request(s, 0, 0, 512, cookie=16); c, e, body = simple_or_chunk(s); assert (c, e) == (16, 0) and len(body) == 8 + 512
# 4. A write whose payload cannot be taken in, then bad magic: the server hangs up.
request(s, 1, 0, 0x7fffffff, cookie=17); assert closed(s); s.close()
s = conn(); greet(s); go(s); s.sendall(b"\0" * 28); assert closed(s); s.close()

# 5. Fuzz-ish: random bytes after a good handshake, and random handshakes.
rnd = random.Random(4)
for i in range(200):
    s = conn()
    try:
        if i % 2:
            greet(s); go(s)
        else:
            recv_exact(s, 18)
        s.sendall(bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(1, 600))))
        s.shutdown(socket.SHUT_WR)
        closed(s)
    except (OSError, EOFError, AssertionError):
        pass
    s.close()

# 6. 1000 connections opened (some mid-handshake, some mid-transmission with
# requests in flight) and dropped without a word.
socks = []
for i in range(1000):
    s = conn()
    if i % 3 == 1:
        greet(s)
    elif i % 3 == 2:
        greet(s); go(s, structured=False)
        request(s, 0, (i % 64) << 20, 1 << 20, cookie=i)
        request(s, 1, 0, 65536)        # payload never sent
    socks.append(s)
for s in socks:
    s.close()
print("raw abuse done")
PY
server_alive "$SERVER_PID" || fail "server died under bad input"

# A client killed in the middle of a transfer.
for i in 1 2 3; do
  nbdcopy -C 4 "$U" - >/dev/null &
  copier=$!
  sleep 0.2
  kill -9 "$copier" 2>/dev/null || true
  wait "$copier" 2>/dev/null || true
done
# A writer killed mid-way writes to a different area (32..64 MiB).
python3 - "$sock" <<'PY' &
import socket, struct, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
s.recv(18); s.sendall(struct.pack(">I", 3))
s.sendall(struct.pack(">QII", 0x49484156454f5054, 1, 2) + b"d0")  # EXPORT_NAME
s.recv(4096)
while True:
    for k in range(64):
        s.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 1, k, (32 << 20) + k * 65536, 65536) + b"w" * 65536)
PY
writer=$!
sleep 0.5
kill -9 "$writer"; wait "$writer" 2>/dev/null || true
server_alive "$SERVER_PID" || fail "server died after killed clients"

# Healthy: new clients work, the first 32 MiB are as written.
sum_after=$(first32)
[ "$sum_before" = "$sum_after" ] || fail "data changed"
[ "$(nbdinfo --size "$U")" = $((64 << 20)) ] || fail "size after abuse"

# The connection limit: the third connection is closed at once.
start_server lim -o socket="$work/lim.sock" -o max-connections=2 d1 null size=1
python3 - "$work/lim.sock" <<'PY' || fail "max-connections"
import socket, sys
held = []
for i in range(2):
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); assert len(s.recv(18)) == 18; held.append(s)
s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1])
assert s.recv(18) == b"", "a third connection was served"
held[0].close()
import time; time.sleep(0.2)
s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1])
assert len(s.recv(18)) == 18, "no connection after one was freed"
PY
echo "PASS"
