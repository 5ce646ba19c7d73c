#!/usr/bin/env python3
"""Seeds for the virtio fuzzers (fuzz/virtio/run_fuzz.sh):
seeds-vhost_user_fuzzer: the messages a QEMU-like front end sends to set up
a ring, in the fuzzer's input format (descriptor count, queue count,
stream); seeds-chain_fuzzer: one region holding a descriptor table with a
good chain, a looping one and an indirect one, and an available ring that
offers all three, in the chain fuzzer's layout."""
import os
import struct
import sys

out = sys.argv[1]
V = 1
NEED_REPLY = 1 << 3


def msg(req, payload=b"", flags=V):
    return struct.pack("<III", req, flags, len(payload)) + payload


def write(dirname, name, data):
    d = os.path.join(out, dirname)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- vhost-user messages
region = struct.pack("<QQQQ", 0, 1 << 30, 0x7F0000000000, 0)
table = struct.pack("<II", 1, 0) + region
setup = (
    msg(15)  # GET_PROTOCOL_FEATURES
    + msg(16, struct.pack("<Q", (1 << 0) | (1 << 3) | (1 << 9)))
    + msg(1)  # GET_FEATURES
    + msg(3)  # SET_OWNER
    + msg(24, struct.pack("<III", 0, 60, 0) + bytes(60))  # GET_CONFIG
    + msg(2, struct.pack("<Q", (1 << 32) | (1 << 29) | (1 << 28) | (1 << 30)))
)
write("seeds-vhost_user_fuzzer", "setup", bytes([0, 2]) + setup)
write("seeds-vhost_user_fuzzer", "mem_table", bytes([1, 1]) + msg(5, table, V | NEED_REPLY))
vring = (
    msg(8, struct.pack("<II", 0, 128))
    + msg(10, struct.pack("<II", 0, 0))
    + msg(9, struct.pack("<IIQQQQ", 0, 0, 0x7F0000000000, 0x7F0000001000, 0x7F0000000800, 0))
    + msg(18, struct.pack("<II", 0, 1))
)
write("seeds-vhost_user_fuzzer", "vring", bytes([0, 1]) + vring)
write("seeds-vhost_user_fuzzer", "kick", bytes([1, 1]) + msg(12, struct.pack("<Q", 0)))
write("seeds-vhost_user_fuzzer", "inflight",
      bytes([1, 2]) + msg(32, struct.pack("<QQHHxxxx", 8192, 0, 2, 128)))
write("seeds-vhost_user_fuzzer", "add_mem_reg",
      bytes([1, 1]) + msg(37, struct.pack("<Q", 0) + region))

# ---- chains
GPA = 0x10000
SIZE = 16384
mem = bytearray(SIZE)
NEXT, WRITE, INDIRECT = 1, 2, 4


def desc(at, addr, length, flags, nxt):
    struct.pack_into("<QIHH", mem, at, addr, length, flags, nxt)


desc(0, GPA + 1024, 16, NEXT, 1)
desc(16, GPA + 2048, 512, NEXT | WRITE, 2)
desc(32, GPA + 4000, 1, WRITE, 0)
desc(48, GPA + 1024, 16, NEXT, 3)  # 3 -> 3: a loop
desc(64, GPA + 8192, 48, INDIRECT, 0)
desc(8192, GPA + 1024, 16, NEXT, 1)
desc(8192 + 16, GPA + 12288, 4096 - 16, NEXT | WRITE, 2)  # runs into the region's end
desc(8192 + 32, GPA + 4001, 1, WRITE, 0)
num = 8
avail = 16 * num
struct.pack_into("<HHHHH", mem, avail, 0, 3, 0, 3, 4)
header = bytes([0, 3, 1]) + struct.pack("<H", GPA // 4096) + bytes([3, 1])
write("seeds-chain_fuzzer", "three_chains", header + bytes(mem))
