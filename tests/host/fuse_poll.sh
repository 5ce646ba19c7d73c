#!/usr/bin/env bash
# Busy polling of /dev/fuse (export option poll_us): at queue depth 1 a
# worker polls for the next request and catches some; once the I/O stops the
# window runs out and the daemon goes idle (no CPU kept spinning); del stops
# a polling export cleanly and leaves no thread behind; by default one
# worker polls (poll_us 50) and several do not (poll_us 0).
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

# By default one worker polls for up to 50 us, several do not.
loop=$(sb_add q size=64 memory_backed=1 blocksize=4096)
sb list
grep -q '"poll_us": *50[,}]' <<<"$REPLY_LINE" || fail "poll_us is not 50 by default with one worker: $REPLY_LINE"
sb del q
loop=$(sb_add r size=64 memory_backed=1 blocksize=4096 submit_queues=2)
sb list
grep -q '"poll_us": *0[,}]' <<<"$REPLY_LINE" || fail "poll_us is not 0 by default with two workers: $REPLY_LINE"
sb del r
echo PASS
