#!/usr/bin/env bash
# mbps=20 limits a sequential write through the loop device: 40 MiB take
# about 2 s (at least 1.5 s). The unthrottled time is printed for
# comparison only: on a loaded machine it says little.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib_fuse.sh"
require_host losetup
start_daemon

elapsed_ms() {
    local start end
    start=$(date +%s%N)
    dd if=/dev/zero of="$1" bs=1M count=40 oflag=direct status=none
    end=$(date +%s%N)
    echo $(((end - start) / 1000000))
}

loop=$(sb_add fast size=64 memory_backed=1 blocksize=4096)
fast=$(elapsed_ms "$loop")
loop=$(sb_add slow size=64 memory_backed=1 blocksize=4096 mbps=20)
slow=$(elapsed_ms "$loop")
note "40 MiB: unthrottled ${fast} ms, mbps=20 ${slow} ms"
[ "$slow" -ge 1500 ] || fail "mbps=20 wrote 40 MiB in ${slow} ms (expected about 2000)"
[ "$slow" -le 10000 ] || fail "mbps=20 wrote 40 MiB in ${slow} ms: far slower than the limit"

sb del fast
sb del slow
[ -z "$(leftovers)" ] || fail "left behind: $(leftovers)"
echo PASS
