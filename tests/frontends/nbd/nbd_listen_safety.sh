#!/usr/bin/env bash
# What the NBD listeners do to the file system and who they serve, through
# the daemon: `socket=PATH` never deletes or follows what the daemon did not
# create (a regular file, a symlink, a live socket), only replaces a socket
# nobody listens on; sockets are 0600 whatever the umask, or mode=/group=;
# TCP without TLS is refused unless insecure=1, which `softblk list` shows.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib.sh"
need python3 stat
use_daemon

# The daemon starts under umask 000: the default socket is still 0600.
(umask 000 && sb add null size=1 --name s0 --export nbd >"$work/add" 2>&1) || fail "add: $(cat "$work/add")"
mode=$(stat -c %a "$SOFTBLK_RUN_DIR/nbd.sock")
[ "$mode" = 600 ] || fail "nbd.sock has mode $mode under umask 000"

# mode= and group= on a socket of its own.
grp=$(getent group | awk -F: '$3 != 0 {print $1; exit}')
sb add null size=1 --name s1 --export nbd --export-opt socket="$work/g.sock" --export-opt mode=0660 \
  --export-opt group="$grp" >"$work/add" 2>&1 || fail "add with mode/group: $(cat "$work/add")"
[ "$(stat -c '%a %G' "$work/g.sock")" = "660 $grp" ] || fail "g.sock is $(stat -c '%a %G' "$work/g.sock")"
for bad in mode=0999 mode=rw mode=01777 group=no-such-group-here; do
  sb add null size=1 --export nbd --export-opt socket="$work/bad.sock" --export-opt "$bad" >"$work/out" 2>&1 &&
    fail "$bad was accepted"
  grep -q "${bad%%=*}=" "$work/out" || fail "the error for $bad does not name the option: $(cat "$work/out")"
  [ -e "$work/bad.sock" ] && fail "$bad left a socket behind"
done

# socket=PATH on a regular file: refused, the file untouched.
echo "precious data" >"$work/file"
sb add null size=1 --export nbd --export-opt socket="$work/file" >"$work/out" 2>&1 &&
  fail "an export on a regular file was accepted"
grep -q "not a socket" "$work/out" || fail "error for a regular file: $(cat "$work/out")"
[ "$(cat "$work/file")" = "precious data" ] || fail "the regular file was changed or removed"
# ... on a symlink (to a socket nobody listens on): refused, both untouched.
python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])' "$work/dead.sock"
ln -s "$work/dead.sock" "$work/link"
sb add null size=1 --export nbd --export-opt socket="$work/link" >"$work/out" 2>&1 &&
  fail "an export on a symlink was accepted"
[ -L "$work/link" ] && [ -S "$work/dead.sock" ] || fail "the symlink or its target was removed"
# ... on a socket another server listens on: refused, that server still served.
python3 - "$work/live.sock" "$work/live.ready" <<'PY' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(8)
open(sys.argv[2], "w").close()
s.settimeout(1)
end = time.monotonic() + 20
while time.monotonic() < end:  # answers every connection (the daemon probes too)
    try:
        c, _ = s.accept()
    except socket.timeout:
        continue
    try:
        c.sendall(b"alive")
    except OSError:
        pass
    c.close()
PY
other=$!
for i in $(seq 50); do [ -e "$work/live.ready" ] && break; sleep 0.1; done
sb add null size=1 --export nbd --export-opt socket="$work/live.sock" >"$work/out" 2>&1 &&
  fail "an export on a live socket was accepted"
grep -q "listens" "$work/out" || fail "error for a live socket: $(cat "$work/out")"
python3 -c 'import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); assert s.recv(5) == b"alive"' \
  "$work/live.sock" || fail "the other server's socket was taken"
kill "$other" 2>/dev/null; wait "$other" 2>/dev/null || true
# ... on a stale socket nobody listens on (a crashed server's): replaced.
sb add null size=1 --name s2 --export nbd --export-opt socket="$work/dead.sock" >"$work/out" 2>&1 ||
  fail "a stale socket was not replaced: $(cat "$work/out")"
sb del s2 >/dev/null || fail "del s2"
[ -e "$work/dead.sock" ] && fail "del left the socket it created"
# del of an export whose socket someone replaced meanwhile leaves the new file.
sb add null size=1 --name s3 --export nbd --export-opt socket="$work/swap.sock" >/dev/null || fail "add s3"
rm "$work/swap.sock"; echo "not ours" >"$work/swap.sock"
sb del s3 >/dev/null || fail "del s3"
[ "$(cat "$work/swap.sock")" = "not ours" ] || fail "del removed a file it did not create"

# TCP without TLS: refused, naming both ways out.
for tcp in 0 0.0.0.0:0; do
  sb add null size=1 --export nbd --export-opt socket=none --export-opt tcp=$tcp >"$work/out" 2>&1 &&
    fail "tcp=$tcp without TLS was accepted"
  grep -q "tls=require" "$work/out" && grep -q "insecure=1" "$work/out" ||
    fail "the error for tcp=$tcp does not say how: $(cat "$work/out")"
done
sb add null size=1 --name t0 --export nbd --export-opt socket=none --export-opt tcp=0 \
  --export-opt insecure=1 >"$work/out" 2>&1 || fail "tcp with insecure=1: $(cat "$work/out")"
sb list >"$work/list" || fail "list"
grep t0 "$work/list" | grep -q insecure || fail "list does not say t0 is insecure: $(cat "$work/list")"
sb list --json >"$work/list.json" || fail "list --json"
python3 - "$work/list.json" <<'PY' || fail "list --json"
import json, sys
devs = {d["name"]: d for d in json.load(open(sys.argv[1]))}
assert devs["t0"]["export"].get("insecure") is True, devs["t0"]["export"]
assert "insecure" not in devs["s0"]["export"] or devs["s0"]["export"]["insecure"] is False
PY
sb del t0 >/dev/null || fail "del t0"
if command -v psktool >/dev/null; then
  psktool -p "$work/keys.psk" -u alice >/dev/null 2>&1
  sb add null size=1 --name t1 --export nbd --export-opt socket=none --export-opt tcp=0 \
    --export-opt tls=require --export-opt tls-psk="$work/keys.psk" >"$work/out" 2>&1 ||
    fail "tcp with tls=require: $(cat "$work/out")"
else
  echo "psktool not installed: tcp with tls=require not tried"
fi
sb del --all >/dev/null || fail "del --all"
[ -e "$SOFTBLK_RUN_DIR/nbd.sock" ] && fail "nbd.sock left after the last export"
echo "PASS"
