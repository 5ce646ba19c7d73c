#!/usr/bin/env bash
# The daemon under systemd (softblk.service, docs/install.md), as systemd
# runs it: `softblk daemon --foreground` with $NOTIFY_SOCKET (a datagram
# socket this test reads) and $JOURNAL_STREAM naming its stderr. As root:
#   - READY=1 comes once the control socket accepts (`softblk status`
#     answers at once), STATUS= lines follow the devices served;
#   - log lines on the journal stream carry syslog level prefixes ("<6>"
#     info, "<4>" warning) and no time stamp of their own;
#   - SIGTERM (systemctl stop) sends STOPPING=1; an export whose loop
#     device is mounted keeps serving (STATUS= says so) until unmounted;
#     then the daemon exits 0 leaving no FUSE mount, loop device or process;
#   - without a matching $JOURNAL_STREAM (a shell, 2>file), lines keep their
#     time stamp and no prefix, and no notify socket is needed.
# Usage: service_notify.sh PATH/TO/softblk        (exit 77: skipped)
softblk=${1:?usage: $0 PATH/TO/softblk}
set -euo pipefail  # before the library, so that a missing one stops the test
. "$(dirname "$0")/../support/lib_cli.sh"
require_root_fuse python3 mkfs.ext4 mount umount
setup_run_dir clisvc

aux=$(mktemp -d /tmp/softblk-clisvc-aux.XXXXXX)
mnt=$aux/mnt
mkdir "$mnt"
notify=$aux/notify.log
: >"$notify"
python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
with open(sys.argv[2], "a", buffering=1) as out:
    while True:
        out.write(s.recv(4096).decode().replace("\n", " | ") + "\n")
' "$aux/notify.sock" "$notify" &
listener=$!
extra_cleanup+=("kill $listener 2>/dev/null; umount -l '$mnt' 2>/dev/null; rm -rf '$aux'")
for _ in $(seq 50); do [ -S "$aux/notify.sock" ] && break; sleep 0.1; done
[ -S "$aux/notify.sock" ] || fail "the test's notify socket did not appear"

# wait_notify PATTERN SECONDS: a message matching PATTERN (grep -E) arrived.
wait_notify() {
  local i
  for i in $(seq $(($2 * 10))); do grep -qE -- "$1" "$notify" && return 0; sleep 0.1; done
  echo "notify messages so far:" >&2
  sed 's/^/  /' "$notify" >&2
  return 1
}

note "started as systemd starts it"
err=$aux/stderr
: >"$err"
stream=$(stat -c '%d:%i' "$err")
NOTIFY_SOCKET=$aux/notify.sock JOURNAL_STREAM=$stream "$softblk" daemon --foreground 2>>"$err" &
daemon=$!
pids+=("$daemon")
wait_notify '^READY=1' 20 || fail "no READY=1 within 20 s"
"$softblk" status >/dev/null || fail "READY=1 came but the control socket does not answer"
[ "$(cat "$run_dir/daemon.pid")" = "$daemon" ] || fail "daemon.pid is not the process systemd would track"
wait_notify '^STATUS=serving 0 device' 5 || fail "no STATUS= line for 0 devices"

note "an export whose loop device is mounted, and one that is not"
"$softblk" add null memory_backed=1 size=32 bs=4096 --export fuse --name busy >/dev/null
"$softblk" add null memory_backed=1 size=16 bs=4096 --export fuse --name idle >/dev/null
wait_notify '^STATUS=serving 2 device' 5 || fail "STATUS= does not follow the devices served"
loop=$(field busy .export.loop)
[ -b "$loop" ] || fail "busy has no loop device"
mkfs.ext4 -q -F "$loop"
mount "$loop" "$mnt"
echo kept >"$mnt/a"
sync
[ "$(loops)" -eq 2 ] && [ "$(mounts)" -eq 2 ] || fail "expected 2 loop devices and 2 FUSE mounts"

note "SIGTERM, as systemctl stop sends it"
kill -TERM "$daemon"
wait_notify '^STOPPING=1 \| STATUS=stopping: SIGTERM' 5 || fail "no STOPPING=1 after SIGTERM"
wait_notify "^STATUS=stopping once released.*busy.*$loop" 5 ||
  fail "STATUS= does not say which export waits for its unmount"
alive "$daemon" || fail "the daemon exited with $loop mounted"
grep -q kept "$mnt/a" || fail "the mounted file system lost its file"
umount "$mnt"
wait_gone "$daemon" 20 || fail "the daemon still runs 20 s after the unmount"
rc=0
wait "$daemon" || rc=$?
[ "$rc" -eq 0 ] || fail "the daemon exited with status $rc after SIGTERM (systemd would call that a failure)"
[ "$(mounts)" -eq 0 ] || fail "FUSE mounts left: $(findmnt -rn -o TARGET | grep "^$run_dir/")"
[ "$(loops)" -eq 0 ] || fail "loop devices left: $(our_loops)"

note "the journal stream: level prefixes, no time stamps"
sed 's/^/  /' "$err" | head -20
grep -qE "^<6>daemon $daemon starting in $run_dir" "$err" || fail "no <6> (info) start line on the journal stream"
grep -qE "^<4>SIGTERM: busy .* in use" "$err" || fail "no <4> (warning) line for the export in use"
grep -qE "^<6>daemon $daemon stopped" "$err" || fail "no <6> stop line"
bad=$(grep -vE '^<[0-7]>' "$err" || true)
[ -z "$bad" ] || fail "lines without a level prefix on the journal stream: $bad"
! grep -qE '^<[0-7]>[0-9]{4}-[0-9]{2}-[0-9]{2} ' "$err" || fail "time stamps on the journal stream"
grep -qE '^[0-9]{4}-[0-9]{2}-[0-9]{2} .* \[info\] daemon [0-9]+ starting' "$run_dir/daemon.log" ||
  fail "the log file lost its time stamps"

note "stderr that is not the journal's stream: no prefixes"
err2=$aux/stderr2
JOURNAL_STREAM=$stream "$softblk" daemon --foreground 2>"$err2" &
daemon=$!
pids+=("$daemon")
for _ in $(seq 100); do "$softblk" status >/dev/null 2>&1 && break; sleep 0.1; done
kill -TERM "$daemon"
wait_gone "$daemon" 20 || fail "the second daemon did not stop on SIGTERM"
grep -qE '^[0-9]{4}-[0-9]{2}-[0-9]{2} .* \[info\] daemon [0-9]+ starting' "$err2" ||
  fail "stderr (not the journal) lost its time stamps: $(head -3 "$err2")"
! grep -qE '^<[0-7]>' "$err2" || fail "level prefixes on a stderr that is not the journal's stream"
echo PASS
