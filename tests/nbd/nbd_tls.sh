#!/usr/bin/env bash
# TLS with GnuTLS: X.509 certificates (certtool) and a PSK file (psktool)
# made here; clients with and without TLS against tls=require and tls=on.
source "$(dirname "$0")/lib.sh"
need certtool psktool nbdinfo nbdcopy

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

# Bad settings are refused with a reason.
if "$SOFTBLK_NBD" --run-dir "$work" -o socket="$work/x.sock" -o tls=require x null size=1 2>"$work/bad.err"; then
  fail "tls=require without credentials started"
fi
grep -q 'tls-certs' "$work/bad.err" || fail "message: $(cat "$work/bad.err")"
echo "PASS"
