#!/usr/bin/env python3
"""Seed corpus for fuzz/nbd. make_seeds.py TARGET DIR.
codec: two prefix bytes (TLS mode, piece size), then client byte streams
that reach transmission and send requests. handshake: the same streams
after a prefix that describes two exports, d0 (64 MiB, trim) and ro (1 MiB,
read-only), as handshake_fuzzer.cpp reads it."""
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
target, out = sys.argv[1], sys.argv[2]
if target == "handshake":
    # count, then per export: name length, name, bits (min block index,
    # read-only 4, trim 8), size byte and shift, description length.
    exports = b"\x02" + b"\x02d0" + b"\x09" + b"\x01\x1a" + b"\x03" + b"\x02ro" + b"\x05" + b"\x01\x14" + b"\x00"
    seeds = {name: exports + data for name, data in seeds.items()}
    seeds["one_export_default"] = (b"\x01\x00\x01\x01\x10\x00" + b"\x00\x03" + struct.pack(">I", 3) +
                                   option(3) + go(6, b"", (0, 1, 2, 3)) + go(7, b""))
os.makedirs(out, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
