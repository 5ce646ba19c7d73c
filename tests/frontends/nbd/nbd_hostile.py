"""Hostile NBD clients for nbd_hostile.sh: each mode connects to the unix
socket `path`, misbehaves in its own way and asserts what the server must
do. Every wait is bounded: a server that hangs fails the test.

  flood-close PATH N         N clients pipeline READs, never read a reply, close
  flood-hold PATH N FLAG     ... and stay connected; FLAG (a file) is written
                             once they are stuck; they must then be closed by
                             the server within 30 s (export removed)
  slow-reader PATH           pipelines 64 MiB of READs and reads them slowly,
                             while another client is served promptly
  many PATH N                N clients at once each write, read back, DISC
  idle PATH TIMEOUT          idle and never-reading clients are closed after
                             about TIMEOUT s; a busy one is not
  idle-slots PATH N TIMEOUT  N idle clients fill max-connections=N; they are
                             timed out and the slots serve new clients
  read-pending PATH FLAG     sends one READ, writes FLAG, and waits (at most
                             60 s) until the server closes the connection
"""
import os
import socket
import struct
import sys
import threading
import time

import nbd_raw
from nbd_raw import closed_within, flood_reads, go, greet, recv_exact, request

MiB = 1 << 20
SIZE = 64 * MiB


def client(path, structured=False):
    # 30 s: while 31 others flood it, the server takes a few seconds to
    # answer a handshake on a loaded 2-CPU machine (2.5 s at load 14); the
    # bound is there to catch a hang, not to time the handshake.
    s = nbd_raw.connect(path, timeout=30)
    greet(s)
    go(s, b"", structured=structured)
    return s


def simple_reply(s, data_len):
    magic, err, cookie = struct.unpack(">IIQ", recv_exact(s, 16))
    assert magic == 0x67446698, hex(magic)
    data = recv_exact(s, data_len) if err == 0 else b""
    return cookie, err, data


def parallel(n, fn):
    errors = []

    def run(i):
        try:
            fn(i)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"client {i}: {e!r}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


def flood_close(path, n):
    sent = []

    def one(i):
        s = client(path)
        sent.append(flood_reads(s, 400, MiB, SIZE, seconds=4))
        s.close()

    parallel(n, one)
    print(f"{n} clients pipelined {sum(sent)} 1 MiB READs and closed")


def flood_hold(path, n, flag):
    socks = [None] * n

    def one(i):
        s = client(path)
        flood_reads(s, 400, MiB, SIZE, seconds=4)
        socks[i] = s

    parallel(n, one)
    with open(flag, "w") as f:
        f.write("stuck\n")
    t0 = time.monotonic()
    # The export is removed now: every connection must be closed.
    for i, s in enumerate(socks):
        left = 30 - (time.monotonic() - t0)
        assert left > 0 and closed_within(s, left), f"client {i} still connected 30 s on"
    print(f"{n} stuck clients closed {time.monotonic() - t0:.1f} s after they were stuck")


def slow_reader(path):
    s = client(path)
    count = 64
    for i in range(count):
        request(s, 0, i * MiB, MiB, cookie=i)
    # Another client is served while the slow one holds its replies back.
    fast = client(path)
    t0 = time.monotonic()
    for i in range(20):
        request(fast, 0, i * 4096, 4096, cookie=1000 + i)
        cookie, err, _ = simple_reply(fast, 4096)
        assert (cookie, err) == (1000 + i, 0), (cookie, err)
    took = time.monotonic() - t0
    assert took < 5, f"a second client waited {took:.1f} s behind a slow reader"
    fast.close()
    # The slow reader gets every reply, whole, at 16 MiB/s.
    seen = set()
    s.settimeout(30)
    for i in range(count):
        cookie, err, data = simple_reply(s, MiB)
        assert err == 0 and len(data) == MiB, (cookie, err)
        seen.add(cookie)
        time.sleep(1 / 16)
    assert seen == set(range(count)), sorted(set(range(count)) - seen)[:5]
    s.close()
    print(f"slow reader got its {count} replies; the other client took {took:.2f} s for 20 reads")


def many(path, n):
    def one(i):
        s = client(path)
        s.settimeout(30)
        off = (i % 1024) * 4096
        data = struct.pack(">I", i) * 1024
        request(s, 1, off, 4096, cookie=i, payload=data)
        cookie, err, _ = simple_reply(s, 0)
        assert (cookie, err) == (i, 0), (cookie, err)
        request(s, 0, off, 4096, cookie=i + 1)
        cookie, err, got = simple_reply(s, 4096)
        assert (cookie, err, got) == (i + 1, 0, data), (cookie, err)
        request(s, 2, 0, 0)  # DISC
        assert closed_within(s, 10)

    parallel(n, one)
    print(f"{n} concurrent clients served")


def idle(path, timeout):
    t0 = time.monotonic()
    quiet = client(path)
    stuck = client(path)
    flood_reads(stuck, 400, MiB, SIZE, seconds=2)
    busy = client(path)
    # The busy client sends a request every timeout/4 s for 2 timeouts.
    while time.monotonic() - t0 < 2 * timeout:
        request(busy, 0, 0, 4096, cookie=7)
        assert simple_reply(busy, 4096)[:2] == (7, 0)
        time.sleep(timeout / 4)
    assert closed_within(quiet, 2 * timeout), "an idle client was not timed out"
    assert closed_within(stuck, 2 * timeout), "a client that never reads was not timed out"
    took = time.monotonic() - t0
    assert took >= timeout * 0.8, f"closed after {took:.1f} s, before idle-timeout={timeout}"
    request(busy, 0, 0, 4096, cookie=8)
    assert simple_reply(busy, 4096)[:2] == (8, 0), "the busy client was dropped"
    print(f"idle and stuck clients closed within {took:.1f} s; the busy one served")


def idle_slots(path, n, timeout):
    held = [client(path) for _ in range(n)]
    extra = nbd_raw.connect(path)
    assert closed_within(extra, 5), "a client beyond max-connections was served"
    for s in held:
        assert closed_within(s, 3 * timeout), "an idle client kept its slot"
    s = client(path)
    request(s, 0, 0, 4096, cookie=3)
    assert simple_reply(s, 4096)[:2] == (3, 0)
    print(f"{n} idle clients timed out; their slots serve new clients")


def read_pending(path, flag):
    s = client(path)
    request(s, 0, 0, 4096, cookie=5)
    with open(flag, "w") as f:
        f.write("sent\n")
    assert closed_within(s, 60), "not closed within 60 s"
    print("the connection with a READ in the device was closed")


def main():
    mode, path = sys.argv[1], sys.argv[2]
    args = sys.argv[3:]
    if mode == "flood-close":
        flood_close(path, int(args[0]))
    elif mode == "flood-hold":
        flood_hold(path, int(args[0]), args[1])
    elif mode == "slow-reader":
        slow_reader(path)
    elif mode == "many":
        many(path, int(args[0]))
    elif mode == "idle":
        idle(path, float(args[0]))
    elif mode == "read-pending":
        read_pending(path, args[0])
    elif mode == "idle-slots":
        idle_slots(path, int(args[0]), float(args[1]))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
