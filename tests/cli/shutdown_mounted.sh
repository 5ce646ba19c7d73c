#!/usr/bin/env bash
# Shutdown with a mounted export (docs/reliability.md, "Shutdown with
# mounted exports"), as root: ext4 is mounted on a FUSE export's loop
# device.
#   - `softblk shutdown` refuses, naming the device, its loop device and
#     the mount point; the daemon keeps serving and the file system works.
#   - SIGTERM stops the exports that are not in use and keeps the mounted
#     one serving; once the file system is unmounted the daemon stops by
#     itself, leaving no mount and no loop device; the next daemon brings
#     the devices back (state files kept) and the file system is intact.
#   - `softblk shutdown --force` stops anyway: the file system gets I/O
#     errors (as documented) and its loop device detaches itself when it is
#     unmounted: nothing is left attached.
# Usage: shutdown_mounted.sh PATH/TO/softblk        (exit 77: skipped)
softblk=${1:?usage: $0 PATH/TO/softblk}
set -euo pipefail  # before the library, so that a missing one stops the test
. "$(dirname "$0")/../support/lib_cli.sh"
require_root_fuse mkfs.ext4 fsck.ext4 mount umount
setup_run_dir clishut

mnt=$(mktemp -d /tmp/softblk-clishut-mnt.XXXXXX)
extra_cleanup+=("umount -l '$mnt' 2>/dev/null; rmdir '$mnt'")

add_devices() {
  "$softblk" add null memory_backed=1 size=64 bs=4096 --export fuse --name m0 >/dev/null
  "$softblk" add null memory_backed=1 size=16 bs=4096 --export fuse --name idle >/dev/null
  remember_daemon
}
add_devices
loop=$(field m0 .export.loop)
[ -b "$loop" ] || fail "m0 has no loop device"
mkfs.ext4 -q -F "$loop"
mount "$loop" "$mnt"
echo "before shutdown" >"$mnt/a"
sync
daemon=$(cat "$run_dir/daemon.pid")

note "shutdown refuses while $loop is mounted"
set +e
out=$("$softblk" shutdown 2>&1)
rc=$?
set -e
echo "$out"
[ "$rc" -ne 0 ] || fail "shutdown succeeded with $loop mounted on $mnt"
for word in m0 "$loop" "$mnt" --force; do
  grep -qF -- "$word" <<<"$out" || fail "the refusal does not name $word"
done
alive "$daemon" || fail "the daemon stopped"
[ "$(field m0 .state)" = running ] && [ "$(field idle .state)" = running ] || fail "a device stopped"
echo "after refusal" >>"$mnt/a"
sync || fail "sync failed on the mounted file system"
grep -q "after refusal" "$mnt/a" || fail "the file system lost a write"

note "SIGTERM keeps the mounted export serving, stops the others"
kill -TERM "$daemon"
sleep 2
alive "$daemon" || fail "the daemon exited on SIGTERM with $loop mounted"
echo "after SIGTERM" >>"$mnt/a"
sync || fail "sync failed after SIGTERM"
echo 3 >/proc/sys/vm/drop_caches
grep -q "after SIGTERM" "$mnt/a" || fail "the file system lost a write after SIGTERM"
[ "$(mounts)" -eq 1 ] || fail "expected m0's FUSE mount only, found: $(findmnt -rn -o TARGET | grep "^$run_dir/")"
names=$("$softblk" list --json | jq -r '.[].name' | sort | tr '\n' ' ')
[ "$names" = "m0 " ] || fail "list during the SIGTERM drain shows: $names"

note "unmounting lets the daemon finish"
umount "$mnt"
wait_gone "$daemon" 20 || fail "the daemon still runs 20 s after the unmount"
[ "$(mounts)" -eq 0 ] || fail "mounts left: $(findmnt -rn -o TARGET | grep "^$run_dir/")"
[ "$(loops)" -eq 0 ] || fail "loop devices left: $(our_loops)"
[ -f "$run_dir/devices/m0.json" ] && [ -f "$run_dir/devices/idle.json" ] || fail "state files were not kept"

note "the next daemon brings the devices back; no data: they were memory-backed"
"$softblk" list
remember_daemon
daemon=$(cat "$run_dir/daemon.pid")
[ "$(field m0 .state)" = running ] || fail "m0 not recovered"
loop=$(field m0 .export.loop)
mkfs.ext4 -q -F "$loop"
mount "$loop" "$mnt"
echo "second life" >"$mnt/b"
sync

note "shutdown --force stops anyway; the loop device detaches at the unmount"
"$softblk" shutdown --force
wait_gone "$daemon" 20 || fail "shutdown --force left the daemon running"
if cat "$mnt/b" >/dev/null 2>&1 && echo x >"$mnt/c" 2>/dev/null && sync "$mnt/c" 2>/dev/null; then
  echo "note: the file system still answered from its caches"
fi
umount "$mnt" 2>/dev/null || umount -l "$mnt"
for _ in $(seq 50); do [ "$(loops)" -eq 0 ] && break; sleep 0.1; done
[ "$(loops)" -eq 0 ] || fail "loop device left attached after the unmount: $(our_loops)"
[ "$(mounts)" -eq 0 ] || fail "mounts left: $(findmnt -rn -o TARGET | grep "^$run_dir/")"
echo PASS
