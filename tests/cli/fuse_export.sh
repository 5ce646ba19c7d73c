#!/usr/bin/env bash
# The softblk CLI end to end with the FUSE export, as root: devices are
# exported as a file and a loop device, carry data, come and go without
# disturbing each other; after kill -9 of the daemon the next command
# cleans up the stale mount and loop device and re-exports the devices;
# del and shutdown leave no mount, loop device or process behind.
# Usage: fuse_export.sh PATH/TO/softblk        (exit 77: skipped)
softblk=${1:?usage: $0 PATH/TO/softblk}
set -euo pipefail  # before the library, so that a missing one stops the test
. "$(dirname "$0")/../support/lib_cli.sh"
require_root_fuse
setup_run_dir clifuse

echo "== add two FUSE-exported devices"
out=$("$softblk" add null memory_backed=1 size=64 bs=4096 --export fuse --name f0)
echo "$out"
[ "$(head -1 <<<"$out")" = f0 ] || fail "add did not print the name first"
loop=$(awk '$1 == "loop:" {print $2}' <<<"$out")
file=$(awk '$1 == "file:" {print $2}' <<<"$out")
[ -b "$loop" ] || fail "no loop device in: $out"
[ -f "$file" ] || fail "no file in: $out"
remember_daemon
"$softblk" add null memory_backed=1 size=32 bs=4096 --export fuse --export-opt loop=0 --name f1 >/dev/null
file1=$(field f1 .export.file)
[ -f "$file1" ] || fail "f1 has no file"
[ "$(field f1 '.export.loop // "none"')" = none ] || fail "loop=0 still attached a loop device"

echo "== data through the loop device, read back through the file"
pattern=$(mktemp -p "$run_dir" pattern.XXXXXX)
head -c $((4 << 20)) /dev/urandom >"$pattern"
dd if="$pattern" of="$loop" bs=1M oflag=direct conv=fsync status=none
cmp <(head -c $((4 << 20)) "$file") "$pattern" || fail "data written to $loop did not read back from $file"
dd if="$pattern" of="$file1" bs=1M conv=fsync,notrunc status=none
cmp <(head -c $((4 << 20)) "$file1") "$pattern" || fail "f1 did not keep its data"
[ "$(field f0 .stats.bytes_written)" -ge $((4 << 20)) ] || fail "f0's counters did not count the writes"

echo "== del f1 leaves f0 serving"
"$softblk" del f1 >/dev/null
[ ! -e "$file1" ] || fail "f1's file is still there"
cmp <(dd if="$loop" bs=1M count=4 iflag=direct status=none) "$pattern" || fail "f0 lost its data when f1 went"
[ "$(mounts)" -eq 1 ] || fail "expected 1 mount, found $(mounts)"

echo "== kill -9 the daemon: the next command recovers f0"
old=$(cat "$run_dir/daemon.pid")
kill -KILL "$old"
for _ in $(seq 50); do kill -0 "$old" 2>/dev/null || break; sleep 0.1; done
"$softblk" list
remember_daemon
new=$(cat "$run_dir/daemon.pid")
[ "$new" != "$old" ] || fail "no new daemon"
[ "$(field f0 .state)" = running ] || fail "f0 not recovered"
loop=$(field f0 .export.loop)
[ -b "$loop" ] || fail "f0 has no loop device after recovery"
[ "$(mounts)" -eq 1 ] || fail "stale mount left: $(findmnt -rn -o TARGET,SOURCE | grep "$run_dir")"
[ "$(loops)" -eq 1 ] || fail "stale loop device left: $(losetup -a | grep "$run_dir")"
dd if="$pattern" of="$loop" bs=1M oflag=direct status=none
cmp <(head -c $((4 << 20)) "$(field f0 .export.file)") "$pattern" || fail "recovered f0 does not carry data"

echo "== del and shutdown leave nothing behind"
"$softblk" del --all
[ "$(mounts)" -eq 0 ] || fail "mount left after del"
[ "$(loops)" -eq 0 ] || fail "loop device left after del"
"$softblk" shutdown
for _ in $(seq 50); do kill -0 "$new" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$new" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$new/stat" 2>/dev/null)" != Z ]; then
  fail "daemon $new still runs after shutdown"
fi
[ ! -e "$run_dir/control.sock" ] || fail "socket left after shutdown"
echo "PASS"
