#!/usr/bin/env bash
# A virtio back end that does not complete a request cannot make its
# reader unkillable (docs/reliability.md, "virtio back ends"), as root with
# the FUSE export. One daemon hosts "back", a null device whose first
# request never completes (fault injection timeout=1,100,0,1; its own
# io_timeout of 8 s lets its export go of it then), exported over
# vhost-user-blk, and "front", a virtio device on that socket
# (io_timeout=1500, connect_timeout=10000) exported over FUSE.
#   - A reader of front's file (dd iflag=direct) is sent SIGKILL 0.3 s in:
#     it is gone within io_timeout + 1.5 s (it used to stay in D state until
#     the back end's socket closed).
#   - The daemon answers meanwhile; front connects to back again, which
#     serves it once its own request ended; a reader during that gets an
#     error within io_timeout + 1.5 s; then reads work again.
#   - list shows front's timeouts, given-up request and reconnection; both
#     devices delete.
# Usage: stuck_backend.sh PATH/TO/softblk        (exit 77: skipped)
softblk=${1:?usage: $0 PATH/TO/softblk}
set -euo pipefail  # before the library, so that a missing one stops the test
. "$(dirname "$0")/../support/lib_cli.sh"
require_root_fuse dd timeout
setup_run_dir virtiostuck

"$softblk" daemon
remember_daemon
daemon=$(cat "$run_dir/daemon.pid")
"$softblk" add null memory_backed=1 size=16 bs=4096 submit_queues=1 poll_queues=0 \
  timeout=1,100,0,1 io_timeout=8000 --export vhost-user-blk --name back >/dev/null
socket=$(field back .export.socket)
[ -S "$socket" ] || fail "no vhost-user-blk socket at '$socket'"
"$softblk" add virtio "path=$socket" poll_queues=0 io_timeout=1500 connect_timeout=10000 \
  --export fuse --export-opt loop=0 --name front >/dev/null
file=$(field front .export.file)

note "a reader whose request the back end never completes, killed"
start=$(now_ms)
dd if="$file" of=/dev/null bs=4096 count=1 iflag=direct status=none 2>/dev/null &
reader=$!
extra_cleanup+=("kill -KILL $reader 2>/dev/null")
sleep 0.3
alive "$reader" || fail "the reader finished: the request was not held"
kill -KILL "$reader"
wait_gone "$reader" 4 || fail "the killed reader still runs $(($(now_ms) - start)) ms after it started"
took=$(($(now_ms) - start))
echo "the killed reader was gone after $took ms"
[ "$took" -le 3000 ] || fail "the killed reader took $took ms to go (io_timeout=1500)"

note "the daemon answers; a reader while front reconnects gets an error in time"
timeout 5 "$softblk" list >/dev/null || fail "list did not answer"
t0=$(now_ms)
set +e
dd if="$file" of=/dev/null bs=4096 count=1 iflag=direct status=none 2>"$run_dir/dd.err"
rc=$?
set -e
took=$(($(now_ms) - t0))
echo "the second reader ended after $took ms with status $rc: $(cat "$run_dir/dd.err")"
[ "$rc" -ne 0 ] || fail "a read succeeded while the back end held the first request"
grep -Eq "timed out|Input/output error" "$run_dir/dd.err" || fail "the reader's error: $(cat "$run_dir/dd.err")"
[ "$took" -le 3000 ] || fail "the second reader took $took ms (io_timeout=1500)"

note "once back lets go of its request, front is connected again and reads work"
ok=0
for _ in $(seq 60); do
  if dd if="$file" of=/dev/null bs=4096 count=1 iflag=direct status=none 2>/dev/null; then ok=1; break; fi
  sleep 0.5
done
[ "$ok" -eq 1 ] || fail "front never read again: $("$softblk" list --json | jq -c '.[] | select(.name == "front") | .target')"
alive "$daemon" || fail "the daemon died"
timeouts=$(field front .stats.timeouts)
reconnects=$(field front .target.reconnects)
given_up=$(field front .target.given_up)
echo "front: timeouts $timeouts, given up $given_up, reconnects $reconnects"
[ "$timeouts" -ge 2 ] || fail "list shows $timeouts timeouts for front, not 2"
[ "$given_up" -eq 1 ] || fail "list shows $given_up requests given up, not 1"
[ "$reconnects" -eq 1 ] || fail "list shows $reconnects reconnections, not 1"
[ "$(field front .target.connected)" = true ] || fail "front is not connected"

note "both devices delete"
timeout 20 "$softblk" del front >/dev/null || fail "del front failed"
timeout 20 "$softblk" del back >/dev/null || fail "del back failed"
echo PASS
