#!/usr/bin/env python3
"""Seed corpus for fuzz/nbd: two prefix bytes (TLS mode, piece size), then
client byte streams that reach transmission and send requests."""
import os
import struct
import sys

OPT = 0x49484156454f5054


def option(opt, data=b""):
    return struct.pack(">QII", OPT, opt, len(data)) + data


def go(opt, name, infos=()):
    return option(opt, struct.pack(">I", len(name)) + name + struct.pack(">H", len(infos)) +
                  b"".join(struct.pack(">H", i) for i in infos))


def request(typ, off, ln, flags=0, payload=b""):
    return struct.pack(">IHHQQI", 0x25609513, flags, typ, 7, off, ln) + payload


meta = struct.pack(">I", 2) + b"d0" + struct.pack(">I", 1) + struct.pack(">I", 15) + b"base:allocation"
reqs = (request(0, 0, 4096) + request(1, 4096, 512, 1, b"x" * 512) + request(3, 0, 0) +
        request(4, 0, 4096) + request(6, 0, 4096, 0x12) + request(5, 0, 512) + request(7, 0, 65536, 8) +
        request(2, 0, 0))
seeds = {
    "go": b"\x00\x10" + struct.pack(">I", 3) + option(8) + option(10, meta) + go(7, b"d0", (3, 1, 2)) + reqs,
    "export_name": b"\x00\x05" + struct.pack(">I", 1) + option(3) + option(1, b"ro") + reqs,
    "info_list": b"\x01\x20" + struct.pack(">I", 3) + option(3) + go(6, b"d0", (0, 3)) + option(9, meta) +
                 option(2),
    "tls": b"\x02\x08" + struct.pack(">I", 3) + option(3) + option(5) + option(8) + go(7, b"") + reqs,
}
os.makedirs(sys.argv[1], exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(sys.argv[1], name), "wb") as f:
        f.write(data)
