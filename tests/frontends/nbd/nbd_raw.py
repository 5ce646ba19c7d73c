"""Raw-socket NBD client helpers shared by the host tests (nbd_robust.sh,
nbd_handshake_timeout.sh, nbd_tls.sh). lib.sh puts this directory on
PYTHONPATH, so a test's inline python says `from nbd_raw import ...`.

Everything blocks with the socket's timeout (10 s from connect) and raises
on anything unexpected: a test fails loudly rather than hangs.
"""
import socket
import struct

MAGIC = 0x4E42444D41474943  # "NBDMAGIC"
OPT = 0x49484156454F5054  # "IHAVEOPT"
REPLY_MAGIC = 0x3E889045565A9
OPT_EXPORT_NAME, OPT_ABORT, OPT_STARTTLS, OPT_GO, OPT_STRUCTURED_REPLY = 1, 2, 5, 7, 8
REP_ACK, REP_INFO = 1, 3


def connect(path, timeout=10):
    """A stream socket connected to the unix socket `path`."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    return s


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError(f"closed after {len(b)} of {n} bytes")
        b += c
    return b


def greet(s):
    """Reads the fixed newstyle greeting and answers FIXED_NEWSTYLE|NO_ZEROES."""
    m, o, f = struct.unpack(">QQH", recv_exact(s, 18))
    assert m == MAGIC and o == OPT and f == 3, (hex(m), hex(o), f)
    s.sendall(struct.pack(">I", 3))


def option(s, opt, data=b""):
    s.sendall(struct.pack(">QII", OPT, opt, len(data)) + data)


def reply(s):
    """One option reply: (option, reply type, data)."""
    magic, opt, typ, ln = struct.unpack(">QIII", recv_exact(s, 20))
    assert magic == REPLY_MAGIC, hex(magic)
    return opt, typ, recv_exact(s, ln)


def go(s, name=b"d0", structured=True):
    """Negotiates (structured replies, then GO on `name`) into transmission."""
    if structured:
        option(s, OPT_STRUCTURED_REPLY)
        assert reply(s)[1] == REP_ACK
    option(s, OPT_GO, struct.pack(">I", len(name)) + name + struct.pack(">H", 0))
    while True:
        _, typ, _ = reply(s)
        if typ == REP_ACK:
            return
        assert typ == REP_INFO, hex(typ)


def closed(s):
    """Reads and drops until the server closes `s`; True then (a timeout raises)."""
    try:
        while s.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True


def closed_within(s, seconds):
    """True when the server closes `s` within `seconds` (reading and dropping what it sends)."""
    s.settimeout(seconds)
    try:
        return closed(s)
    except socket.timeout:
        return False


def request(s, typ, off, ln, flags=0, cookie=1, payload=b""):
    """Sends one transmission request (a payload follows a WRITE)."""
    s.sendall(struct.pack(">IHHQQI", 0x25609513, flags, typ, cookie, off, ln) + payload)


def flood_reads(s, count, length, size, seconds=5):
    """Pipelines up to `count` READs of `length` bytes over a device of `size`
    bytes without reading a reply; stops early when the server stops taking
    requests for 1 s (back-pressure) or after `seconds`. Returns how many
    requests were sent whole."""
    import time
    s.setblocking(False)
    sent = 0
    deadline = time.monotonic() + seconds
    buf = b""
    stalled_since = None
    while sent < count and time.monotonic() < deadline:
        if not buf:
            off = (sent * length) % (size - length + 1)
            buf = struct.pack(">IHHQQI", 0x25609513, 0, 0, sent, off - off % 512, length)
        try:
            n = s.send(buf)
        except BlockingIOError:
            n = 0
        if n == 0:
            stalled_since = stalled_since or time.monotonic()
            if time.monotonic() - stalled_since > 1:
                break
            time.sleep(0.01)
            continue
        stalled_since = None
        buf = buf[n:]
        if not buf:
            sent += 1
    s.setblocking(True)
    return sent
