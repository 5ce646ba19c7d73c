#!/usr/bin/env bash
# Busy polling of /dev/fuse (export option poll_us): at queue depth 1 a
# worker polls for the next request and catches some; once the I/O stops the
# window runs out and the daemon goes idle (no CPU kept spinning); del stops
# a polling export cleanly and leaves no thread behind; by default the
# window is measured (poll_us=auto): under load at queue depth 1 the export
# sweeps the windows, shows the rate of each and why it chose one, and the
# choice follows its own rule (the lowest window within 5% of the best
# rate, by the mean of the sweep's two passes or by one of them).
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib_fuse.sh"
require_host losetup fio
start_daemon

counter() { sed -n "s/.*\"$1\": *\([0-9]*\).*/\1/p" <<<"$REPLY_LINE" | head -1; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$DAEMON_PID/stat"; }
qd1_reads() {
    fio --name=poll --filename="$1" --ioengine=psync --direct=1 --bs=4k --rw=randread \
        --size=64m --time_based --runtime="$2" --output=/dev/null
}

threads_before=$(daemon_threads)
loop=$(sb_add p size=64 memory_backed=1 blocksize=4096 -- poll_us=1000)
dd if=/dev/zero of="$loop" bs=1M count=64 oflag=direct status=none
qd1_reads "$loop" 2
sb list
polled=$(counter requests_after_poll)
slept=$(counter requests_after_sleep)
note "poll_us=1000, queue depth 1: ${polled} requests found by polling, ${slept} after sleeping"
[ -n "$polled" ] && [ -n "$slept" ] || fail "list shows no poll counters: $REPLY_LINE"
[ "$polled" -gt 0 ] || fail "no request was found by polling at queue depth 1"

# Idle: the window (at most 1 ms) has long run out; the workers sleep in
# read(/dev/fuse). A worker that kept polling would use the whole 2 s.
sleep 0.5
before=$(cpu_ticks)
sleep 2
used_ms=$((($(cpu_ticks) - before) * 1000 / $(getconf CLK_TCK)))
note "daemon CPU over 2 s of idle: ${used_ms} ms"
[ "$used_ms" -le 200 ] || fail "the daemon used ${used_ms} ms of CPU in 2 s without I/O: a worker keeps polling"

# del right after I/O stops (workers may be polling) is prompt and clean.
qd1_reads "$loop" 1 &
fio_pid=$!
sleep 0.5
wait "$fio_pid"
start=$(date +%s%N)
sb del p
del_ms=$((($(date +%s%N) - start) / 1000000))
note "del took ${del_ms} ms"
[ "$del_ms" -le 5000 ] || fail "del of a polling export took ${del_ms} ms"
[ -z "$(leftovers)" ] || fail "left behind: $(leftovers)"
[ "$(daemon_threads)" -le "$threads_before" ] || fail "threads: $threads_before before, $(daemon_threads) after del"

# By default the window is measured: after 2 s of reads at queue depth 1
# (a sweep is 14 epochs of 10 ms) list shows the rates and the choice.
loop=$(sb_add q size=64 memory_backed=1 blocksize=4096)
qd1_reads "$loop" 2
sb list
python3 - "$REPLY_LINE" "$(dirname "$0")" <<'PY' || fail "the measured poll window: $REPLY_LINE"
import json, sys
d = json.loads(sys.argv[1])
e = d["exports"]["q"] if isinstance(d, dict) else next(x["export"] for x in d if x["name"] == "q")
p = e["poll"]
print(f"== poll_us=auto after 2 s at queue depth 1: {p['level']} us, {p['why']}")
assert p["mode"] == "auto", p
assert p["sweeps"] >= 1, p
rates = {int(k): v for k, v in p["rates_per_s"].items()}
assert sorted(rates) == [0, 16, 32, 64, 128, 256, 512], rates
# The last sweep's choice is a level within 5% of the most requests, by
# the mean or by one pass alone (the exact rule, cheapest or the one in
# use, is level_chooser_test's: the rates shown are rounded, so the rule
# cannot be re-derived from them exactly); 0 when the device went idle
# since.
sys.path.insert(0, sys.argv[2])
from chooser_rule import within_5_percent_somewhere
if p["phase"] == "idle":
    assert p["level"] == 0, p
elif p["phase"] != "sweep":
    assert within_5_percent_somewhere(p), p
    assert p["why"].startswith(f"{p['level']} us"), p
assert e["poll_us"] == p["level"], e
PY
sb del q
# A value given is kept, never swept.
loop=$(sb_add r size=64 memory_backed=1 blocksize=4096 -- poll_us=0)
qd1_reads "$loop" 1
sb list
grep -q '"mode": *"given"' <<<"$REPLY_LINE" || fail "poll_us=0 is not kept as given: $REPLY_LINE"
grep -q '"poll_us": *0[,}]' <<<"$REPLY_LINE" || fail "poll_us=0 did not stay 0: $REPLY_LINE"
sb_try add s null size=64 -- poll_us=2000 && fail "poll_us=2000 was accepted"
grep -q 'auto, or a window of 0 to 1000 us' <<<"$REPLY_LINE" || fail "poll_us=2000: $REPLY_LINE"
sb del r
echo PASS
