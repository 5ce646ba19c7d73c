#!/usr/bin/env bash
# `softblk add ... --export nbd` through the daemon (SOFTBLK_CLI), in a run
# directory of its own: the URIs it prints work, two devices share the
# socket, and `del` of the last one removes the socket.
source "$(dirname "$0")/lib.sh"
[ -n "${SOFTBLK_CLI:-}" ] && [ -x "$SOFTBLK_CLI" ] || skip "the softblk CLI is not built"
need nbdinfo nbdcopy
export SOFTBLK_RUN_DIR="$work/run"
mkdir -p "$SOFTBLK_RUN_DIR"
stop_daemon() { "$SOFTBLK_CLI" del --all >/dev/null 2>&1 || true; "$SOFTBLK_CLI" shutdown >/dev/null 2>&1 || true; }
trap 'stop_daemon; cleanup' EXIT

"$SOFTBLK_CLI" add null memory_backed=1 size=32 --export nbd >"$work/add1" 2>&1 || fail "add: $(cat "$work/add1")"
uri=$(grep -o 'nbd+unix:///[^ ]*' "$work/add1" | head -1)
[ -n "$uri" ] || fail "add printed no URI: $(cat "$work/add1")"
[ "$(nbdinfo --size "$uri")" = $((32 << 20)) ] || fail "size through $uri"
"$SOFTBLK_CLI" add null memory_backed=1 size=16 --export nbd --export-opt tcp=0 --export-opt insecure=1 >"$work/add2" 2>&1 &&
  fail "a second export with other server settings was accepted: $(cat "$work/add2")"
"$SOFTBLK_CLI" add null size=1 --export nbd --export-opt tls-verify-peer=1 >"$work/add3" 2>&1 &&
  fail "tls-verify-peer=1 without TLS was accepted: $(cat "$work/add3")"
grep -qF "tls-verify-peer=1 given with tls=off" "$work/add3" || fail "add with tls-verify-peer: $(cat "$work/add3")"
"$SOFTBLK_CLI" add null memory_backed=1 size=16 --export nbd >"$work/add2" 2>&1 || fail "add 2: $(cat "$work/add2")"
uri2=$(grep -o 'nbd+unix:///[^ ]*' "$work/add2" | head -1)
head -c $((16 << 20)) /dev/urandom >"$work/a.img"
nbdcopy "$work/a.img" "$uri2"
nbdcopy "$uri2" "$work/b.img"
cmp "$work/a.img" "$work/b.img" || fail "data through the daemon's export"
nbdinfo --list "nbd+unix:///?socket=$SOFTBLK_RUN_DIR/nbd.sock" | grep -c '^export=' | grep -qx 2 || fail "list"
"$SOFTBLK_CLI" del --all >/dev/null || fail "del --all"
[ -S "$SOFTBLK_RUN_DIR/nbd.sock" ] && fail "socket left after the last export stopped"
echo "PASS"
