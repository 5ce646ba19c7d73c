#!/usr/bin/env bash
# A stuck export cannot wedge the control plane (docs/reliability.md,
# "Control plane"), as root with the FUSE export: a device whose requests
# never complete (fault injection timeout=1,100,0,-1 with a one-hour
# io_timeout) holds a reader's request, so its export cannot stop. While
# `softblk del` of it waits, list, status and add answer at once; del gives
# up after the daemon's --stop-timeout with an error that says the device
# keeps stopping in the background; list shows it as "stopping"; shutdown
# still ends the daemon within its bound, and the next daemon cleans up
# what the stuck export left (its FUSE mount).
# Usage: stuck_export.sh PATH/TO/softblk        (exit 77: skipped)
softblk=${1:?usage: $0 PATH/TO/softblk}
set -euo pipefail  # before the library, so that a missing one stops the test
. "$(dirname "$0")/../support/lib_cli.sh"
require_root_fuse dd timeout
setup_run_dir clistuck

"$softblk" daemon --stop-timeout 3000
remember_daemon
daemon=$(cat "$run_dir/daemon.pid")
"$softblk" add null memory_backed=1 size=16 bs=4096 timeout=1,100,0,-1 io_timeout=3600000 \
  --export fuse --export-opt loop=0 --name stuck >/dev/null
"$softblk" add null memory_backed=1 size=16 bs=4096 --export none --name other >/dev/null
file=$(field stuck .export.file)

note "a reader whose request never completes"
dd if="$file" of=/dev/null bs=4096 count=1 iflag=direct status=none 2>/dev/null &
reader=$!
extra_cleanup+=("kill -KILL $reader 2>/dev/null")
sleep 0.5
alive "$reader" || fail "the reader finished: the request was not held"

note "del waits for the export; the control plane keeps answering"
start=$(now_ms)
set +e
"$softblk" del stuck >"$run_dir/del.out" 2>&1 &
del=$!
set -e
sleep 0.5
alive "$del" || fail "del returned at once: $(cat "$run_dir/del.out")"
t0=$(now_ms)
timeout 5 "$softblk" list >/dev/null || fail "list did not answer while del waits"
timeout 5 "$softblk" status >/dev/null || fail "status did not answer while del waits"
timeout 5 "$softblk" add null size=8 --export none --name added >/dev/null || fail "add did not answer while del waits"
took=$(($(now_ms) - t0))
echo "list + status + add during the del: $took ms"
[ "$took" -lt 2000 ] || fail "the control plane took $took ms to answer while del waits"
[ "$(field stuck .state)" = stopping ] || fail "list shows stuck as $(field stuck .state), not stopping"

set +e
wait "$del"
rc=$?
set -e
took=$(($(now_ms) - start))
cat "$run_dir/del.out"
echo "del returned after $took ms with status $rc"
[ "$rc" -ne 0 ] || fail "del of a stuck export reported success"
grep -q "background" "$run_dir/del.out" || fail "del's error does not say the device keeps stopping"
[ "$took" -ge 2500 ] && [ "$took" -le 8000 ] || fail "del did not give up after --stop-timeout (3 s): $took ms"
[ "$(field stuck .state)" = stopping ] || fail "stuck is no longer listed as stopping"
[ "$(field other .state)" = running ] || fail "other is not running"
"$softblk" del added >/dev/null || fail "del of a healthy device failed while another is stuck"

note "shutdown ends the daemon within its bound"
t0=$(now_ms)
timeout 30 "$softblk" shutdown || fail "shutdown failed"
wait_gone "$daemon" 10 || fail "the daemon still runs after shutdown"
took=$(($(now_ms) - t0))
echo "shutdown took $took ms"
[ "$took" -le 12000 ] || fail "shutdown took $took ms"
[ ! -e "$run_dir/devices/stuck.json" ] || fail "the deleted device's state file survived"
[ -e "$run_dir/devices/other.json" ] || fail "other's state file was not kept"
wait_gone "$reader" 10 || fail "the reader still hangs after the daemon exited"

note "the next daemon cleans up the stuck export's mount and recovers the rest"
"$softblk" list >/dev/null
remember_daemon
[ "$(mounts)" -eq 0 ] || fail "mounts left: $(findmnt -rn -o TARGET | grep "^$run_dir/")"
names=$("$softblk" list --json | jq -r '.[].name' | tr '\n' ' ')
[ "$names" = "other " ] || fail "the next daemon has: $names"
echo PASS
