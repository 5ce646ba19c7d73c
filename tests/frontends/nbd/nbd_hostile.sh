#!/usr/bin/env bash
# Hostile clients through the daemon (`softblk add ... --export nbd`): clients
# that pipeline READs and never read a reply (then close, or stay), a slow
# reader, many clients at once, idle clients. The daemon must stay bounded in
# connections and memory, and `softblk del` must return promptly whatever the
# clients do. Every CLI call has a time limit (lib.sh `sb`): a hang fails.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib.sh"
need python3
use_daemon
here=$(cd "$(dirname "$0")" && pwd)
hostile() { timeout 120 python3 "$here/nbd_hostile.py" "$@"; }
sock="$SOFTBLK_RUN_DIR/nbd.sock"

sb add null memory_backed=1 size=64 --name h0 --export nbd >"$work/add" 2>&1 || fail "add: $(cat "$work/add")"
pid=$(daemon_pid)
base=$(daemon_sockets)

# 1. 32 clients in parallel pipeline READs, never read, and close: every
# connection is released.
hostile flood-close "$sock" 32 || fail "never-reading clients that close"
for i in $(seq 100); do [ "$(daemon_sockets)" -le "$base" ] && break; sleep 0.1; done
[ "$(daemon_sockets)" -le "$base" ] ||
  fail "$(($(daemon_sockets) - base)) connections left 10 s after their clients closed"

# 2. 32 clients that stay stuck: memory stays bounded (buffer-total, 512 MiB
# by default, plus the device's 64 MiB and the loop's buffer pool, 128 MiB), and `del`
# returns promptly and closes them.
hostile flood-hold "$sock" 32 "$work/stuck" &
holder=$!
for i in $(seq 300); do [ -s "$work/stuck" ] && break; sleep 0.1; done
[ -s "$work/stuck" ] || fail "stuck clients never got going"
sleep 1
rss=$(daemon_rss_mib)
echo "daemon RSS with 32 stuck clients: $rss MiB"
[ "$rss" -lt 800 ] || fail "32 clients that do not read their replies hold $rss MiB"
t0=$(date +%s%N)
sb del h0 >"$work/del" 2>&1 || fail "del with stuck clients: rc $? $(cat "$work/del")"
ms=$((($(date +%s%N) - t0) / 1000000))
echo "del with 32 stuck clients took $ms ms"
[ "$ms" -lt 5000 ] || fail "del took $ms ms"
wait "$holder" || fail "stuck clients were not closed by del"
sb list >/dev/null || fail "list after del"

# 3. A slow reader does not hold up another client, and gets all its replies.
sb add null memory_backed=1 size=64 --name h1 --export nbd >"$work/add" 2>&1 || fail "add h1: $(cat "$work/add")"
hostile slow-reader "$sock" || fail "slow reader"

# 4. Many clients at once.
hostile many "$sock" 200 || fail "200 concurrent clients"
sb del h1 >/dev/null || fail "del h1"

# 5. idle-timeout: idle and never-reading clients are closed, busy ones are
# not; idle clients that fill max-connections give their slots back.
sb add null memory_backed=1 size=64 --name h2 --export nbd --export-opt socket="$work/idle.sock" \
  --export-opt idle-timeout=2 --export-opt max-connections=8 >"$work/add" 2>&1 ||
  fail "add with idle-timeout: $(cat "$work/add")"
hostile idle "$work/idle.sock" 2 || fail "idle-timeout"
hostile idle-slots "$work/idle.sock" 8 2 || fail "idle clients holding every slot"
sb del h2 >/dev/null || fail "del h2"
# 6. The control thread waits for the data plane only so long: a device
# whose requests take 15 s (irqmode=2) is deleted while one is in it. `del`
# fails after the 10 s bound naming the connection, the device stays, other
# commands answer; once the request completed, `del` succeeds.
sb add null size=16 irqmode=2 completion_nsec=15000000000 --name h3 --export nbd \
  --export-opt socket="$work/slow.sock" >"$work/add" 2>&1 || fail "add h3: $(cat "$work/add")"
hostile read-pending "$work/slow.sock" "$work/pending" &
reader=$!
for i in $(seq 100); do [ -s "$work/pending" ] && break; sleep 0.1; done
sleep 0.5
t0=$(date +%s%N)
sb del h3 >"$work/del" 2>&1 && fail "del returned success with a request still in the device"
ms=$((($(date +%s%N) - t0) / 1000000))
echo "del with a request in the device for 15 s gave up after $ms ms: $(cat "$work/del")"
[ "$ms" -lt 15000 ] || fail "del waited $ms ms"
grep -q "still open" "$work/del" || fail "del's error does not say why: $(cat "$work/del")"
sb list | grep -q '^h3 ' || fail "h3 is gone after a failed del"
wait "$reader" || fail "the connection was not closed"
sb del h3 >"$work/del" 2>&1 || fail "second del of h3: $(cat "$work/del")"
[ -e "$work/slow.sock" ] && fail "slow.sock left after the last export"
kill -0 "$pid" || fail "the daemon died"
[ "$(daemon_pid)" = "$pid" ] || fail "the daemon was restarted"
echo "PASS"
