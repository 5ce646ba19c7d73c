#!/usr/bin/env bash
# One FUSE worker keeps many requests in flight on a device that takes
# time: with irqmode=2 completion_nsec=5ms, 16 concurrent requests through
# the loop device complete about 16 at a time (up to 3200 IOPS), not one
# at a time (200 IOPS), for reads and for verified writes. Then the device
# is deleted while fio still has requests in flight: del returns, fio ends
# with errors instead of hanging, and nothing is left behind. (fio runs on
# the FUSE file there: del refuses, by design, to pull a loop device that
# is still open.)
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib_fuse.sh"
require_host losetup fio python3
start_daemon

# fio terse v3: field 8 is the read IOPS, 49 the write IOPS.
read_iops() { awk -F';' '{print int($8)}' <<<"$1"; }
write_iops() { awk -F';' '{print int($49)}' <<<"$1"; }

sb add lat null size=64 memory_backed=1 blocksize=4096 irqmode=2 completion_nsec=5000000
loop=$(json_field loop)
file=$(json_field file)
[ -b "$loop" ] || fail "no loop device in the answer: $REPLY_LINE"
[ -f "$file" ] || fail "no FUSE file in the answer: $REPLY_LINE"

out=$(fio --name=r --filename="$loop" --ioengine=libaio --direct=1 --rw=randread --bs=4k --iodepth=16 \
    --runtime=2 --time_based --output-format=terse --terse-version=3)
r=$(read_iops "$out")
note "randread QD16 at 5 ms per request: $r IOPS (one at a time would be 200)"
[ "$r" -ge 800 ] || fail "randread QD16 got $r IOPS: requests are not overlapping"

out=$(fio --name=w --filename="$loop" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k --iodepth=16 \
    --size=8M --verify=crc32c --verify_fatal=1 --output-format=terse --terse-version=3) ||
    fail "randwrite QD16 with verify failed: $out"
w=$(write_iops "$out")
note "randwrite QD16 with crc32c verify: $w IOPS writing, $(read_iops "$out") verifying"
[ "$w" -ge 800 ] || fail "randwrite QD16 got $w IOPS: requests are not overlapping"

# Mixed sizes up to 256 KiB, reads and writes, verified.
start=$(date +%s)
fio --name=m --filename="$loop" --ioengine=libaio --direct=1 --rw=randrw --bsrange=4k-256k --iodepth=32 \
    --size=16M --verify=crc32c --verify_fatal=1 --output-format=terse >/dev/null ||
    fail "mixed-size randrw QD32 with verify failed"
note "mixed-size randrw QD32 with verify: $(($(date +%s) - start)) s"

# del with requests in flight.
fio --name=k --filename="$file" --ioengine=libaio --direct=1 --rw=randwrite --bs=4k --iodepth=16 \
    --runtime=60 --time_based --output-format=terse >/dev/null 2>&1 &
fio_pid=$!
sleep 1
kill -0 "$fio_pid" 2>/dev/null || fail "fio ended before del"
start=$(date +%s%N)
sb del lat
ms=$((($(date +%s%N) - start) / 1000000))
note "del with requests in flight took $ms ms"
for _ in $(seq 100); do kill -0 "$fio_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$fio_pid" 2>/dev/null; then
    kill -9 "$fio_pid"
    fail "fio still running 10 s after del: requests hang"
fi
wait "$fio_pid" 2>/dev/null || true
for _ in $(seq 50); do [ -z "$(leftovers)" ] && break; sleep 0.1; done
[ -z "$(leftovers)" ] || fail "left behind: $(leftovers)"
kill -0 "$DAEMON_PID" || fail "the daemon died"
echo PASS
