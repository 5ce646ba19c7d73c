#!/usr/bin/env bash
# `softblk add ... --export nbd` through the daemon (SOFTBLK_CLI), in a run
# directory of its own: the URIs it prints work, two devices share the
# socket, and `del` of the last one removes the socket.
set -euo pipefail  # before the library, so that a missing one stops the test
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
# The poll window chosen (poll-us=auto, poll-goal=cpu by default) and why:
# after some requests, the loop's chooser has measured (or is measuring)
# by requests per CPU time, and says so.
"$SOFTBLK_CLI" list --json >"$work/list.json" || fail "list --json"
python3 - "$work/list.json" <<'PY' || fail "list --json: the poll choice: $(cat "$work/list.json")"
import json, sys
for d in json.load(open(sys.argv[1])):
    polls = d["export"]["poll"]
    assert polls, d["export"]
    for p in polls:
        assert p["mode"] == "auto" and p["objective"] == "rate_per_cpu", p
        assert p["why"], p
        if p["sweeps"] > 0:
            assert set(p["cpu_per_event_ns"]) == set(p["rates_per_s"]), p
PY
# Where each loop runs (colocate=auto by default, support/colocation.hpp):
# measured by poll-goal's objective (requests per CPU time by default)
# between anywhere (0) and next to the client (1), and said why.
python3 - "$work/list.json" <<'PY' || fail "list --json: the placement: $(cat "$work/list.json")"
import json, sys
for d in json.load(open(sys.argv[1])):
    places = d["export"]["colocate"]
    assert len(places) == len(d["export"]["poll"]), d["export"]
    for p in places:
        assert p["mode"] == "auto" and p["unit"] == "colocated", p
        assert p["level"] in (0, 1) and p["why"], p
        assert p["objective"] == "rate_per_cpu", p
PY
"$SOFTBLK_CLI" add null size=1 --export nbd --export-opt colocate=1 >"$work/add5" 2>&1 &&
  fail "a second export with colocate=1 on a colocate=auto server was accepted"
grep -qF "colocate=auto" "$work/add5" || fail "the refusal does not name colocate: $(cat "$work/add5")"
"$SOFTBLK_CLI" add null size=1 --export nbd --export-opt colocate=yes >"$work/add5" 2>&1 &&
  fail "colocate=yes was accepted"
grep -qF "auto (measured), 0" "$work/add5" || fail "colocate=yes: $(cat "$work/add5")"
"$SOFTBLK_CLI" add null size=1 --export nbd --export-opt poll-goal=rate >"$work/add4" 2>&1 &&
  fail "a second export with poll-goal=rate on a poll-goal=cpu server was accepted"
grep -qF "poll-goal=cpu" "$work/add4" || fail "the refusal does not name poll-goal: $(cat "$work/add4")"
"$SOFTBLK_CLI" add null size=1 --export nbd --export-opt poll-goal=fast >"$work/add4" 2>&1 &&
  fail "poll-goal=fast was accepted"
grep -qF "cpu or rate" "$work/add4" || fail "poll-goal=fast: $(cat "$work/add4")"
nbdinfo --list "nbd+unix:///?socket=$SOFTBLK_RUN_DIR/nbd.sock" | grep -c '^export=' | grep -qx 2 || fail "list"
"$SOFTBLK_CLI" del --all >/dev/null || fail "del --all"
[ -S "$SOFTBLK_RUN_DIR/nbd.sock" ] && fail "socket left after the last export stopped"
echo "PASS"
