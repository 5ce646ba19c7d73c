#!/usr/bin/env bash
# TLS with GnuTLS: X.509 certificates (certtool) and a PSK file (psktool)
# made here; clients with and without TLS against tls=require and tls=on;
# client certificates with tls-verify-peer=1 (signed by the CA, none,
# self-signed, from another CA of the same name, revoked); clients that
# stall inside the TLS handshake and are dropped by handshake-timeout.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib.sh"
need certtool psktool nbdinfo nbdcopy python3

pki="$work/pki"
mkdir -p "$pki"
certtool --generate-privkey --outfile "$pki/ca-key.pem" 2>/dev/null
printf 'cn = softblk test CA\nca\ncert_signing_key\nexpiration_days = 2\n' >"$work/ca.info"
certtool --generate-self-signed --load-privkey "$pki/ca-key.pem" --template "$work/ca.info" \
  --outfile "$pki/ca-cert.pem" 2>/dev/null
certtool --generate-privkey --outfile "$pki/server-key.pem" 2>/dev/null
printf 'cn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\ntls_www_server\nencryption_key\nsigning_key\nexpiration_days = 2\n' \
  >"$work/server.info"
certtool --generate-certificate --load-ca-certificate "$pki/ca-cert.pem" --load-ca-privkey "$pki/ca-key.pem" \
  --load-privkey "$pki/server-key.pem" --template "$work/server.info" --outfile "$pki/server-cert.pem" 2>/dev/null
psktool -p "$work/keys.psk" -u alice >/dev/null
psktool -p "$work/wrong.psk" -u alice >/dev/null

start_server req -o tls=require -o tls-certs="$pki" -o tls-psk="$work/keys.psk" -o tcp=0 \
  d0 null memory_backed=1 size=16
port=$(uri_of req d0 tcp_port)
[ "$(uri_of req d0)" = "nbds+unix:///d0?socket=$work/nbd.sock" ] || fail "URI under tls=require: $(uri_of req d0)"
psk_uri="nbds+unix://alice@/d0?socket=$work/nbd.sock&tls-psk-file=$work/keys.psk"
x509_uri="nbds://localhost:$port/d0?tls-certificates=$pki"

# Without TLS: refused.
if nbdinfo --size "nbd+unix:///d0?socket=$work/nbd.sock" 2>"$work/plain.err"; then
  fail "a client without TLS got in under tls=require"
fi
grep -qi 'tls' "$work/plain.err" || fail "plain client error: $(cat "$work/plain.err")"
nbdinfo --list "nbd+unix:///?socket=$work/nbd.sock" 2>/dev/null && fail "listing without TLS"
# Wrong key: refused.
nbdinfo --size "nbds+unix://alice@/d0?socket=$work/nbd.sock&tls-psk-file=$work/wrong.psk" 2>/dev/null &&
  fail "a wrong PSK got in"
# PSK and X.509 (verified against the CA, over TCP): data both ways.
[ "$(nbdinfo --size "$psk_uri")" = $((16 << 20)) ] || fail "size over PSK"
[ "$(nbdinfo --size "$x509_uri")" = $((16 << 20)) ] || fail "size over X.509"
nbdinfo --list "nbds+unix://alice@/?socket=$work/nbd.sock&tls-psk-file=$work/keys.psk" | grep -q 'export="d0"' ||
  fail "list over TLS"
head -c $((16 << 20)) /dev/urandom >"$work/a.img"
nbdcopy -C 2 "$work/a.img" "$psk_uri"
nbdcopy "$x509_uri" "$work/b.img"
cmp "$work/a.img" "$work/b.img" || fail "data through TLS"
nbdinfo --map "$psk_uri" >/dev/null || fail "block status over TLS"
if command -v qemu-img >/dev/null; then
  qemu-img compare --image-opts "driver=raw,file.driver=file,file.filename=$work/a.img" \
    --object tls-creds-x509,id=tls0,endpoint=client,dir="$pki" \
    --image-opts "driver=nbd,server.type=inet,server.host=localhost,server.port=$port,export=d0,tls-creds=tls0" \
    >/dev/null || fail "qemu-img over TLS"
fi

# tls=on: both kinds of clients.
start_server on -o socket="$work/on.sock" -o tls=on -o tls-psk="$work/keys.psk" d1 null memory_backed=1 size=8
[ "$(nbdinfo --size "nbd+unix:///d1?socket=$work/on.sock")" = $((8 << 20)) ] || fail "plain under tls=on"
[ "$(nbdinfo --size "nbds+unix://alice@/d1?socket=$work/on.sock&tls-psk-file=$work/keys.psk")" = $((8 << 20)) ] ||
  fail "PSK under tls=on"

# ---- Client certificates (tls-verify-peer=1).
# client_cert NAME CN [CA_DIR [TEMPLATE]]: $work/NAME/ as libnbd's
# tls-certificates= directory: ca-cert.pem (to check the server),
# client-cert.pem signed by CA_DIR's ca-cert.pem/ca-key.pem (self-signed
# when CA_DIR is empty), made from certtool TEMPLATE lines after the cn.
client_cert() {
  local dir="$work/$1" ca=${3:-}
  local template=${4:-'tls_www_client\nencryption_key\nsigning_key\nexpiration_days = 2'}
  mkdir -p "$dir"
  cp "$pki/ca-cert.pem" "$dir/"
  printf "cn = %s\n$template\n" "$2" >"$work/$1.info"
  certtool --generate-privkey --outfile "$dir/client-key.pem" 2>/dev/null
  if [ -n "$ca" ]; then
    certtool --generate-certificate --load-ca-certificate "$ca/ca-cert.pem" --load-ca-privkey "$ca/ca-key.pem" \
      --load-privkey "$dir/client-key.pem" --template "$work/$1.info" --outfile "$dir/client-cert.pem" 2>/dev/null
  else
    certtool --generate-self-signed --load-privkey "$dir/client-key.pem" --template "$work/$1.info" \
      --outfile "$dir/client-cert.pem" 2>/dev/null
  fi
}
# Another CA with the very name of ours: a GnuTLS client offers its
# certificate (the issuer name matches what the server asks for), and only
# the signature tells it apart.
other="$work/other-ca"
mkdir -p "$other"
certtool --generate-privkey --outfile "$other/ca-key.pem" 2>/dev/null
certtool --generate-self-signed --load-privkey "$other/ca-key.pem" --template "$work/ca.info" \
  --outfile "$other/ca-cert.pem" 2>/dev/null
client_cert good "good client" "$pki"
client_cert revoked "revoked client" "$pki"
client_cert selfsigned "self-signed client"
client_cert impostor "impostor client" "$other"
client_cert server-only "server-purpose client" "$pki" 'tls_www_server\nsigning_key\nexpiration_days = 2'
client_cert expired "expired client" "$pki" \
  'tls_www_client\nsigning_key\nactivation_date = "2020-01-01 00:00:00 UTC"\nexpiration_date = "2020-02-01 00:00:00 UTC"'
mkdir -p "$work/nocert"; cp "$pki/ca-cert.pem" "$work/nocert/"
# A second certs directory with a CRL that revokes one client.
crl_pki="$work/pki-crl"
mkdir -p "$crl_pki"; cp "$pki"/*.pem "$crl_pki/"
printf 'crl_next_update = 2\ncrl_number = 1\n' >"$work/crl.info"
certtool --generate-crl --load-ca-privkey "$pki/ca-key.pem" --load-ca-certificate "$pki/ca-cert.pem" \
  --load-certificate "$work/revoked/client-cert.pem" --template "$work/crl.info" \
  --outfile "$crl_pki/ca-crl.pem" >/dev/null 2>&1

start_server vp -o socket="$work/vp.sock" -o tls=require -o tls-certs="$pki" -o tls-verify-peer=1 \
  -o tls-psk="$work/keys.psk" -o tcp=0 d2 null memory_backed=1 size=8
vport=$(uri_of vp d2 tcp_port)
vp_uri() { echo "nbds://localhost:$vport/d2?tls-certificates=$work/$1"; }
# log_has NAME TEXT: the server's log (stderr) has a line with TEXT.
log_has() { grep -qF -- "$2" "$work/$1.err" || fail "no log line with '$2' in $1's log: $(cat "$work/$1.err")"; }

# The good certificate: size, data written and read back (nbdcopy), a read
# through nbdsh with nbd_set_tls_certificates.
[ "$(nbdinfo --size "$(vp_uri good)")" = $((8 << 20)) ] || fail "size with a good client certificate"
head -c $((8 << 20)) /dev/urandom >"$work/c.img"
nbdcopy "$work/c.img" "$(vp_uri good)" || fail "write with a good client certificate"
nbdcopy "$(vp_uri good)" "$work/d.img" || fail "read with a good client certificate"
cmp "$work/c.img" "$work/d.img" || fail "data with a client certificate"
if PATH=/usr/bin:$PATH python3 -c 'import nbd' 2>/dev/null; then
  PATH=/usr/bin:$PATH nbdsh -c - <<PY || fail "nbdsh with a client certificate"
h.set_tls(nbd.TLS_REQUIRE)
h.set_tls_certificates("$work/good")
h.set_export_name("d2")
h.connect_tcp("localhost", "$vport")
want = open("$work/c.img", "rb").read()
assert h.pread(65536, 1 << 20) == want[1 << 20:(1 << 20) + 65536], "nbdsh read differs"
h.shutdown()
PY
else
  echo "note: python3-libnbd missing, nbdsh part not run (nbdinfo/nbdcopy above cover the same path)"
fi

# No certificate, a self-signed one, one from the other CA, one for TLS
# servers only, an expired one: refused, each with a log line that says why.
for who in nocert selfsigned impostor server-only expired; do
  if nbdinfo --size "$(vp_uri $who)" >/dev/null 2>"$work/$who.client.err"; then
    fail "a client with certificate '$who' got in under tls-verify-peer=1"
  fi
done
log_has vp "sent no client certificate"
log_has vp "CN=impostor client is refused: The certificate is NOT trusted"
log_has vp "CN=server-purpose client is refused: The certificate is NOT trusted. The certificate chain does not match the intended purpose"
log_has vp "CN=expired client is refused: The certificate is NOT trusted. The certificate chain uses expired certificate"
# PSK clients are not asked for a certificate.
[ "$(nbdinfo --size "nbds+unix://alice@/d2?socket=$work/vp.sock&tls-psk-file=$work/keys.psk")" = $((8 << 20)) ] ||
  fail "PSK under tls-verify-peer=1"

# OpenSSL (Python's ssl) offers its certificate whatever CA it is from: the
# self-signed one must fail verification; the good one gets through to GO.
python3 - "$work" <<'PY' || fail "python ssl clients under tls-verify-peer=1 (see above)"
import ssl, struct, sys
from nbd_raw import OPT_STARTTLS, REP_ACK, connect, go, greet, option, recv_exact, reply
work = sys.argv[1]

def starttls(cert_dir):
    s = connect(f"{work}/vp.sock")
    greet(s)
    option(s, OPT_STARTTLS)
    assert reply(s)[:2] == (OPT_STARTTLS, REP_ACK)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(f"{work}/pki/ca-cert.pem")
    ctx.load_cert_chain(f"{cert_dir}/client-cert.pem", f"{cert_dir}/client-key.pem")
    return ctx.wrap_socket(s, server_hostname="localhost")

def refused(cert_dir):
    try:
        t = starttls(cert_dir)
        go(t, b"d2")  # TLS 1.3: the server's verdict comes after the client's Finished
    except (ssl.SSLError, EOFError, ConnectionResetError, BrokenPipeError):
        return True
    return False

t = starttls(f"{work}/good")
go(t, b"d2")
t.sendall(struct.pack(">IHHQQI", 0x25609513, 0, 0, 9, 0, 4096))
magic = struct.unpack(">I", recv_exact(t, 4))[0]
assert magic in (0x67446698, 0x668E33EF), hex(magic)
t.close()
assert refused(f"{work}/selfsigned"), "a self-signed client certificate got in"
print("python ssl: good certificate served, self-signed refused")
PY
log_has vp "CN=self-signed client is refused"

# After all that, the good client is still served.
[ "$(nbdinfo --size "$(vp_uri good)")" = $((8 << 20)) ] || fail "good client after refused ones"
server_alive "$SERVER_PID" || fail "server died refusing clients"

# ca-crl.pem: a revoked certificate is refused, the others still served.
start_server crl -o socket="$work/crl.sock" -o tls=require -o tls-certs="$crl_pki" -o tls-verify-peer=1 \
  -o tcp=0 d3 null size=4
cport=$(uri_of crl d3 tcp_port)
nbdinfo --size "nbds://localhost:$cport/d3?tls-certificates=$work/revoked" >/dev/null 2>&1 &&
  fail "a revoked client certificate got in"
log_has crl "CN=revoked client is refused: The certificate is NOT trusted. The certificate chain is revoked"
[ "$(nbdinfo --size "nbds://localhost:$cport/d3?tls-certificates=$work/good")" = $((4 << 20)) ] ||
  fail "good client with a CRL loaded"

# ---- Stalls inside the TLS handshake: dropped after handshake-timeout=2,
# while other clients are served.
start_server stall -o socket="$work/stall.sock" -o tls=require -o tls-certs="$pki" -o tls-psk="$work/keys.psk" \
  -o handshake-timeout=2 d4 null size=4
python3 - "$work" <<'PY' || fail "stalls in the TLS handshake (see above)"
import socket, ssl, struct, subprocess, sys, time
from nbd_raw import OPT_STARTTLS, REP_ACK, closed_within, connect, greet, option, reply
work = sys.argv[1]
path = f"{work}/stall.sock"

def upgraded():
    """A client that got STARTTLS's ACK (the TLS handshake may begin)."""
    s = connect(path)
    greet(s)
    option(s, OPT_STARTTLS)
    assert reply(s)[:2] == (OPT_STARTTLS, REP_ACK)
    return s

t0 = time.monotonic()
# A: silent after the ACK.
a = upgraded()
# B: the first 45 bytes of a ClientHello record that says it has 512.
b = upgraded()
b.sendall(bytes([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03]) + bytes(34))
# C: completes the TLS handshake, then says nothing inside it (the timeout
# covers the whole negotiation, not only its clear-text part).
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.load_verify_locations(f"{work}/pki/ca-cert.pem")
c = ctx.wrap_socket(upgraded(), server_hostname="localhost")

# Meanwhile a PSK client is served.
uri = f"nbds+unix://alice@/d4?socket={path}&tls-psk-file={work}/keys.psk"
out = subprocess.run(["nbdinfo", "--size", uri], capture_output=True, text=True, timeout=30)
served_at = time.monotonic() - t0
assert out.returncode == 0 and out.stdout.strip() == str(4 << 20), (out.returncode, out.stdout, out.stderr)
if served_at < 1.8:
    # ... while the stalled ones were still connected.
    assert not closed_within(a, 0.05) and not closed_within(b, 0.05), "a stalled client was dropped early"
else:
    print(f"note: the PSK client took until {served_at:.2f} s (loaded machine)")

def dropped(s, what):
    try:
        ok = closed_within(s, 6)
    except ssl.SSLError:
        ok = True  # the session ended: the server hung up
    dt = time.monotonic() - t0
    assert ok, f"{what} was not dropped"
    assert 1.8 <= dt <= 6, f"{what} dropped after {dt:.2f} s, the timeout is 2 s"
    return dt

times = [dropped(a, "a client silent after STARTTLS"),
         dropped(b, "a client stalled in its ClientHello"),
         dropped(c, "a client silent after the TLS handshake")]
print("dropped after " + ", ".join(f"{t:.2f} s" for t in times))
# The server still serves.
out = subprocess.run(["nbdinfo", "--size", uri], capture_output=True, text=True, timeout=30)
assert out.returncode == 0, out.stderr
PY
log_has stall "dropped: still in the TLS handshake 2000 ms after it connected"
log_has stall "dropped: still in the NBD handshake 2000 ms after it connected"
server_alive "$SERVER_PID" || fail "server died with stalled TLS clients"

# Bad settings are refused with a reason.
if nbd_driver -o socket="$work/x.sock" -o tls=require x null size=1 2>"$work/bad.err"; then
  fail "tls=require without credentials started"
fi
grep -q 'tls-certs' "$work/bad.err" || fail "message: $(cat "$work/bad.err")"
# refused OUT_NAME TEXT -o ...: the driver refuses these options and says TEXT.
refused() {
  local name=$1 text=$2; shift 2
  if nbd_driver "$@" x null size=1 >/dev/null 2>"$work/$name.err"; then
    fail "$name: started"
  fi
  grep -qF -- "$text" "$work/$name.err" || fail "$name: message: $(cat "$work/$name.err")"
}
refused vp-off "tls-verify-peer=1 given with tls=off" -o socket="$work/y.sock" -o tls-verify-peer=1
refused vp-psk "tls-verify-peer=1 needs tls-certs=DIR" -o socket="$work/y.sock" -o tls=require \
  -o tls-psk="$work/keys.psk" -o tls-verify-peer=1
mkdir -p "$work/noca"; cp "$pki/server-cert.pem" "$pki/server-key.pem" "$work/noca/"
refused vp-noca "$work/noca/ca-cert.pem is missing" -o socket="$work/y.sock" -o tls=require \
  -o tls-certs="$work/noca" -o tls-verify-peer=1
echo "PASS"
