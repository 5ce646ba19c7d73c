#!/usr/bin/env bash
# Every NBD command and flag through nbdsh (libnbd's Python shell), with
# strict mode off so that out-of-range, misaligned and oversized requests
# reach the server and must come back as the protocol's errors; then a
# read-only export and a plain (non-structured) connection.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib.sh"
need nbdsh python3

start_server s d0 null memory_backed=1 size=16 discard=1 , ro null memory_backed=1 size=1 , \
  d4k null memory_backed=1 size=4 bs=4096 max_sectors=16
start_server r -o socket="$work/ro.sock" -o readonly=1 rx null memory_backed=1 size=1
sock="$work/nbd.sock"

# nbdsh runs "python3" from PATH: use the system one, which has the nbd module.
PATH=/usr/bin:$PATH nbdsh -c - <<PY || fail "nbdsh script (see above)"
import errno, nbd as libnbd
h = libnbd.NBD()
h.add_meta_context("base:allocation")
h.connect_uri("nbd+unix:///d0?socket=$sock")
assert h.get_structured_replies_negotiated()
assert h.can_meta_context("base:allocation")
assert h.can_flush() and h.can_fua() and h.can_trim() and h.can_zero() and h.can_fast_zero()
assert h.can_cache() and h.can_df() and h.can_multi_conn() and not h.is_read_only()
size = h.get_size()
assert size == 16 << 20

def expect(errnum, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except libnbd.Error as e:
        assert e.errnum == errnum, (fn.__name__, args, e.errnum, e.string)
        return
    raise AssertionError(f"{fn.__name__}{args} succeeded")

# READ / WRITE with FUA, DF, several sizes including ones the device splits
for n, off in ((512, 0), (4096, 8192), (1 << 20, 1 << 20), (4 << 20, 8 << 20)):
    data = bytes((i * 7 + n) & 0xff for i in range(n))
    h.pwrite(data, off, libnbd.CMD_FLAG_FUA)
    assert h.pread(n, off) == data
    chunks = []
    def chunk(sub, offset, status, err):
        chunks.append((offset, status, len(sub)))
        return 0
    assert h.pread_structured(n, off, chunk, libnbd.CMD_FLAG_DF) == data
    assert chunks == [(off, libnbd.READ_DATA, n)], chunks  # one chunk: not fragmented
h.flush()

# TRIM, WRITE_ZEROES (NO_HOLE, FAST_ZERO), CACHE
h.pwrite(b"\xab" * 65536, 0)
h.trim(4096, 0, libnbd.CMD_FLAG_FUA)
h.zero(4096, 4096)
h.zero(4096, 8192, libnbd.CMD_FLAG_NO_HOLE | libnbd.CMD_FLAG_FUA)
assert h.pread(12288, 0) == bytes(12288)
assert h.pread(4096, 12288) == b"\xab" * 4096
# null has no write-zeroes of its own: zeroing means writing zeros, not fast
expect(errno.ENOTSUP, h.zero, 4096, 0, libnbd.CMD_FLAG_FAST_ZERO)
h.cache(1 << 20, 0)

# BLOCK_STATUS, with and without REQ_ONE
seen = []
def cb(meta, offset, entries, err):
    assert meta == "base:allocation"
    seen.append((offset, list(entries)))
h.block_status(size, 0, cb)
ext = seen[-1][1]
assert sum(ext[0::2]) == size, ext
h.block_status(size, 0, cb, libnbd.CMD_FLAG_REQ_ONE)
assert len(seen[-1][1]) == 2, seen[-1]
h.block_status(size - (15 << 20), 15 << 20, cb)
assert seen[-1][1][1] & 1, seen[-1]  # never written: a hole

# Bad requests must come back as errors, not hang or kill the connection
h.set_strict_mode(0)
expect(errno.EINVAL, h.pread, 512, size)               # past the end
expect(errno.EINVAL, h.pread, 1024, size - 512)        # straddles the end
expect(errno.EINVAL, h.pread, 512, 100)                # misaligned
expect(errno.EINVAL, h.pread, 0, 0)                    # empty
expect(errno.ENOSPC, h.pwrite, b"x" * 1024, size - 512)
expect(errno.EINVAL, h.pwrite, b"x" * 100, 0)          # misaligned length
expect(errno.EINVAL, h.pread, 512, 0, libnbd.CMD_FLAG_NO_HOLE)   # flag not for READ
expect(errno.EINVAL, h.trim, 512, size)
expect(errno.EINVAL, h.cache, 512, size)
expect(errno.EINVAL, h.block_status, 512, size, cb)
expect(errno.EOVERFLOW, h.pread, 64 << 20, 0)          # above the maximum block size
assert h.pread(512, 0) == h.pread(512, 0)              # still in sync
h.shutdown()                                           # NBD_CMD_DISC
del h

# Concurrent requests on one connection complete out of order
h = libnbd.NBD()
h.connect_uri("nbd+unix:///d4k?socket=$sock")
bufs = []
for i in range(64):
    b = libnbd.Buffer.from_bytearray(bytearray([i]) * 65536)
    h.aio_pwrite(b, i * 65536)
    bufs.append(b)
while h.aio_in_flight() > 0:
    h.poll(-1)
for i in range(64):
    assert h.pread(65536, i * 65536) == bytes([i]) * 65536, i
h.shutdown()

# Old clients: NBD_OPT_EXPORT_NAME and simple replies
h = libnbd.NBD()
h.set_opt_mode(False)
h.set_request_structured_replies(False)
h.set_request_block_size(False)
h.set_handshake_flags(libnbd.HANDSHAKE_FLAG_FIXED_NEWSTYLE)
h.connect_uri("nbd+unix:///ro?socket=$sock")
assert not h.get_structured_replies_negotiated()
h.pwrite(b"\x01" * 512, 0)
assert h.pread(512, 0) == b"\x01" * 512
h.set_strict_mode(0)
expect(errno.EINVAL, h.pread, 512, 1 << 20)
h.shutdown()

# Unknown export
h = libnbd.NBD()
try:
    h.connect_uri("nbd+unix:///nope?socket=$sock")
    raise AssertionError("connected to an unknown export")
except libnbd.Error:
    pass

# Read-only export
h = libnbd.NBD()
h.connect_uri("nbd+unix:///rx?socket=$work/ro.sock")
assert h.is_read_only() and not h.can_trim() and not h.can_zero()
h.set_strict_mode(0)
expect(errno.EPERM, h.pwrite, b"x" * 512, 0)
expect(errno.EPERM, h.zero, 512, 0)
assert h.pread(512, 0) == bytes(512)
h.shutdown()
print("nbdsh: all commands checked")
PY
server_alive "$SERVER_PID" || fail "server died"
echo "PASS"
