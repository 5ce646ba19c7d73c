#!/usr/bin/env bash
# The number of /dev/fuse workers (export option threads): with
# threads=auto it is measured as the poll window is (level_chooser):
# under two jobs of random writes the export tries 1 up to one worker per
# CPU, and `list --json` shows under "workers" the rate of each count, the
# one chosen by its rule (the fewest within 5% of the most requests by
# the sweep's mean or by one of its passes, or the one in use while it
# stays within 5%) and
# why; "threads" is the count in effect. Data written while the count
# changes verifies. On a device that keeps requests in flight one
# asynchronous worker is kept. A number given is kept and never measured;
# a count out of range is an error that says what is accepted.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib_fuse.sh"
require_host losetup fio
start_daemon

loop=$(sb_add w size=64 memory_backed=1 blocksize=4096 -- threads=auto)
# Two jobs, each on its own half, verified with crc32c: the workers park
# and come back meanwhile.
fio --name=workers --filename="$loop" --ioengine=psync --direct=1 --bs=4k --rw=randwrite \
    --numjobs=2 --size=32m --offset_increment=32m --time_based --runtime=2 \
    --verify=crc32c --verify_fatal=1 --output=/dev/null ||
    fail "fio verify through a threads=auto export failed"
sb list
python3 - "$REPLY_LINE" "$(nproc)" "$(dirname "$0")" <<'PY' || fail "the measured worker count: $REPLY_LINE"
import json, sys
d = json.loads(sys.argv[1])
cpus = int(sys.argv[2])
e = d["exports"]["w"] if isinstance(d, dict) else next(x["export"] for x in d if x["name"] == "w")
w = e["workers"]
print(f"== threads=auto after 2 s of 2-job writes: {e['threads']} workers, {w['why']}")
want_max = max(1, min(cpus, 8))
assert w["max"] == want_max, w
if want_max == 1:
    assert w["mode"] == "given" and "one CPU" in w["why"], w
    sys.exit(0)
assert w["mode"] == "auto", w
assert w["unit"] == "workers", w
assert w["sweeps"] >= 1, w
rates = {int(k): v for k, v in w["rates_per_s"].items()}
assert sorted(rates) == list(range(1, want_max + 1)), rates
sys.path.insert(0, sys.argv[3])
from chooser_rule import within_5_percent_somewhere
# The fewest within 5% of the most by the mean of the sweep's two passes,
# or fewer where one pass alone found them within 5% (a costlier count
# must win both), or (a later sweep) the count in use while it is within
# 5% of the mean's best; idle: one.
if w["phase"] == "idle":
    assert w["level"] == 1, w
elif w["phase"] != "sweep":
    assert within_5_percent_somewhere(w), w
assert 1 <= e["threads"] <= want_max, e
assert e["queues"] == "shared", e  # one submit queue, more workers than queues
# Reads and writes skip libfuse's request object (serve_direct).
assert e["requests_direct"] > 0, e
PY
sb del w

# A device that keeps requests in flight (5 ms each): one asynchronous
# worker overlaps 16 of them, where synchronous workers would have one
# each; the count is held at one, and says why.
loop=$(sb_add s size=64 memory_backed=1 blocksize=4096 irqmode=2 completion_nsec=5000000 -- threads=auto)
fio --name=slow --filename="$loop" --ioengine=libaio --direct=1 --bs=4k --rw=randread \
    --iodepth=16 --time_based --runtime=2 --output=/dev/null
sb list
python3 - "$REPLY_LINE" <<'PY' || fail "threads=auto on a slow device: $REPLY_LINE"
import json, sys
d = json.loads(sys.argv[1])
e = d["exports"]["s"] if isinstance(d, dict) else next(x["export"] for x in d if x["name"] == "s")
w = e["workers"]
print(f"== threads=auto at QD 16 on a 5 ms device: {e['threads']} workers, {w['why']}")
assert e["threads"] == 1 and e["async"] is True, e
assert w["level"] == 1 or "held" in w["why"], w
PY
sb del s

# A number given is kept, never measured, and says so.
loop=$(sb_add g size=64 memory_backed=1 blocksize=4096 -- threads=1)
fio --name=given --filename="$loop" --ioengine=psync --direct=1 --bs=4k --rw=randwrite \
    --numjobs=2 --size=64m --time_based --runtime=1 --output=/dev/null
sb list
python3 - "$REPLY_LINE" <<'PY' || fail "threads=1: $REPLY_LINE"
import json, sys
d = json.loads(sys.argv[1])
e = d["exports"]["g"] if isinstance(d, dict) else next(x["export"] for x in d if x["name"] == "g")
w = e["workers"]
assert w["mode"] == "given" and w["why"] == "given" and w["level"] == 1, w
assert "sweeps" not in w and e["threads"] == 1 and e["async"] is True, e
PY
sb del g
sb_try add x null size=64 -- threads=65 && fail "threads=65 was accepted"
grep -q 'auto, or a number of workers' <<<"$REPLY_LINE" || fail "threads=65: $REPLY_LINE"
[ -z "$(leftovers)" ] || fail "left behind: $(leftovers)"
echo PASS
