#!/usr/bin/env bash
# handshake-timeout: a client that connects and stalls in the handshake is
# dropped after the timeout, so it cannot hold a connection slot; a client in
# transmission is not; handshake-timeout=0 never drops anyone.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib.sh"
need python3

start_server s -o handshake-timeout=1 -o max-connections=3 d0 null memory_backed=1 size=16
start_server never -o socket="$work/never.sock" -o handshake-timeout=0 d1 null size=1

python3 - "$work/nbd.sock" "$work/never.sock" <<'PY' || fail "handshake timeout (see above)"
import socket, struct, sys, time
from nbd_raw import OPT, closed_within, recv_exact
import nbd_raw
path, never_path = sys.argv[1], sys.argv[2]

def conn(p=path):
    return nbd_raw.connect(p)

t0 = time.monotonic()
# A: reads the greeting, then says nothing.
a = conn(); recv_exact(a, 18)
# B: sends its flags and half an option header, then stalls.
b = conn(); recv_exact(b, 18); b.sendall(struct.pack(">I", 3) + struct.pack(">Q", OPT))
# C: completes the handshake (EXPORT_NAME, no zeroes) and stays in transmission.
c = conn(); recv_exact(c, 18); c.sendall(struct.pack(">I", 3))
c.sendall(struct.pack(">QII", OPT, 1, 2) + b"d0")
recv_exact(c, 10)
# The three slots are taken: a fourth connection is closed at once.
d = conn()
assert closed_within(d, 5), "a fourth connection was served with max-connections=3"

assert closed_within(a, 5), "a client silent after the greeting was not dropped"
ta = time.monotonic() - t0
assert closed_within(b, 5), "a client stalled mid-option was not dropped"
tb = time.monotonic() - t0
assert 0.8 <= ta <= 4 and 0.8 <= tb <= 4, f"dropped after {ta:.2f} s / {tb:.2f} s, timeout is 1 s"

# C, in transmission for longer than the timeout, still works: a 4 KiB read.
time.sleep(max(0.0, 1.5 - (time.monotonic() - t0)))
c.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, 7, 0, 4096))
magic, err, cookie = struct.unpack(">IIQ", recv_exact(c, 16))
assert magic == 0x67446698 and err == 0 and cookie == 7, (hex(magic), err, cookie)
recv_exact(c, 4096)

# The freed slots take new clients.
e = conn(); recv_exact(e, 18)

# handshake-timeout=0: a silent client is still connected after 2 s.
n = conn(never_path); recv_exact(n, 18)
assert not closed_within(n, 2), "handshake-timeout=0 dropped a client"
print(f"dropped after {ta:.2f} s and {tb:.2f} s")
PY
server_alive "$SERVER_PID" || fail "server died"
echo "PASS"
