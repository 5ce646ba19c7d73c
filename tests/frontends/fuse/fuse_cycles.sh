#!/usr/bin/env bash
# 50 add/del cycles (with I/O on each device) leave no mount, loop device
# or directory behind, and the daemon's thread count and RSS return to
# their level after the first cycle.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib_fuse.sh"
require_host losetup
start_daemon

cycle() {
    local loop
    loop=$(sb_add "c$1" size=16 memory_backed=1 blocksize=4096)
    dd if=/dev/urandom of="$loop" bs=64k count=64 oflag=direct status=none
    dd if="$loop" of=/dev/null bs=64k count=64 iflag=direct status=none
    sb del "c$1"
}

cycle 0
threads0=$(daemon_threads)
rss0=$(daemon_rss_kib)
for i in $(seq 1 50); do
    cycle "$i"
done
threads=$(daemon_threads)
rss=$(daemon_rss_kib)
note "after 50 cycles: threads $threads (baseline $threads0), RSS $rss KiB (baseline $rss0 KiB)"
[ -z "$(leftovers)" ] || fail "left behind: $(leftovers)"
[ "$threads" -eq "$threads0" ] || fail "thread count grew from $threads0 to $threads"
[ "$rss" -le $((rss0 + 8192)) ] || fail "RSS grew from $rss0 KiB to $rss KiB"
echo PASS
