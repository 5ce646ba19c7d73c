#!/usr/bin/env bash
# After the daemon dies without cleaning up, its FUSE mount and loop device
# are stale; the next daemon (at start, on `add` of the same name, and on
# `cleanup`) detaches and unmounts them.
set -euo pipefail  # before the library, so that a missing one stops the test
source "$(dirname "$0")/lib_fuse.sh"
require_host losetup
start_daemon

crash() {
    if [ -n "${SOFTBLK_CLI:-}" ]; then
        sb crash
        return
    fi
    echo crash >&7
    wait "$DAEMON_PID" 2>/dev/null || true
    exec 7>&- 8<&-
}

note "crash with two devices exported, restart"
sb_add d0 size=16 memory_backed=1 blocksize=4096 >/dev/null
sb_add d1 size=16 memory_backed=1 blocksize=4096 >/dev/null
crash
[ -n "$(leftovers)" ] || fail "the crash left nothing behind: the test proves nothing"
launch_daemon
sb list
# The CLI's daemon re-exports its devices after a crash (over the cleaned
# mount points); the driver forgets them. Either way, once they are
# deleted nothing of the crashed daemon may remain.
sb_try del d0 || true
sb_try del d1 || true
[ -z "$(leftovers)" ] || fail "left behind after restart: $(leftovers)"

note "crash, restart, add the same name again"
sb_add d0 size=16 memory_backed=1 blocksize=4096 >/dev/null
crash
launch_daemon
sb list
sb_try del d0 || true
loop=$(sb_add d0 size=16 memory_backed=1 blocksize=4096)
dd if=/dev/zero of="$loop" bs=64k count=16 oflag=direct status=none
sb del d0
[ -z "$(leftovers)" ] || fail "left behind: $(leftovers)"

note "a live daemon's cleanup leaves its own exports alone"
loop=$(sb_add d2 size=16 memory_backed=1 blocksize=4096)
sb cleanup
dd if=/dev/zero of="$loop" bs=64k count=16 oflag=direct status=none || fail "cleanup broke a live export"
sb del d2
[ -z "$(leftovers)" ] || fail "left behind: $(leftovers)"
echo PASS
