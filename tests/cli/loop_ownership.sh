#!/usr/bin/env bash
# Ownership before destruction (docs/reliability.md), as root with the FUSE
# export. A stop refused because a program holds the loop device open
# (`set power=0`, `del`, rmdir in the nullb tree) leaves the loop device to
# detach itself on its last close; another user may then attach their own
# image to the same /dev/loopN. Each time:
#   - list (and the tree's `device` file) no longer claims that loop device;
#   - the next stop succeeds and leaves the other user's loop device
#     attached to their image.
# Usage: loop_ownership.sh PATH/TO/softblk        (exit 77: skipped)
softblk=${1:?usage: $0 PATH/TO/softblk}
set -euo pipefail  # before the library, so that a missing one stops the test
. "$(dirname "$0")/../support/lib_cli.sh"
require_root_fuse truncate
setup_run_dir own

# The other user's image lies outside the run directory: the trap's loop
# cleanup (files below the run directory) never sees it, these lines do.
foreign_img=$(mktemp /tmp/softblk-own-foreign.XXXXXX)
foreign_loop=""
holder=""
extra_cleanup+=('[ -z "$holder" ] || kill "$holder"'
  '[ -z "$foreign_loop" ] || losetup -d "$foreign_loop"' 'rm -f "$foreign_img"')
truncate -s 1M "$foreign_img"

backing() { cat "/sys/block/${1#/dev/}/loop/backing_file" 2>/dev/null || true; }

# hold_and_refuse LOOP WHY CMD...: CMD (a stop) must fail while a program
# holds LOOP open, its message matching WHY; then the program ends and
# LOOP must detach itself.
hold_and_refuse() {
  local loop=$1 why=$2 out i
  shift 2
  sleep 600 <"$loop" &
  holder=$!
  for i in $(seq 50); do [ "$(readlink "/proc/$holder/fd/0")" = "$loop" ] && break; sleep 0.1; done
  if out=$("$@" 2>&1); then fail "'$*' succeeded while $loop was held open"; fi
  grep -q "$why" <<<"$out" || fail "'$*' failed, but not for $why: $out"
  kill "$holder"
  wait "$holder" 2>/dev/null || true
  holder=""
  for i in $(seq 100); do [ -z "$(backing "$loop")" ] && break; sleep 0.1; done
  [ -z "$(backing "$loop")" ] || fail "$loop did not detach itself on its last close"
}

# The other user attaches their image to the very loop device softblk had.
attach_foreign() {
  losetup "$1" "$foreign_img" || fail "losetup $1 $foreign_img (taken by another program?)"
  foreign_loop=$1
}

foreign_intact() {
  [ "$(backing "$foreign_loop")" = "$foreign_img" ] ||
    fail "$1 detached $foreign_loop, which another user had attached to $foreign_img"
}

release_foreign() {
  losetup -d "$foreign_loop"
  foreign_loop=""
}

note "set power=0 refused while the loop device is open"
"$softblk" add null size=16 memory_backed=1 --export fuse --name f1 >/dev/null
remember_daemon
loop=$(field f1 .export.loop)
[ -b "$loop" ] || fail "f1 has no loop device"
hold_and_refuse "$loop" "still open" "$softblk" set f1 power=0
[ "$(field f1 .state)" = running ] || fail "f1 is not running after the refused power=0"
[ "$(field f1 .export.loop)" = null ] ||
  fail "list still claims $loop after it detached itself: $("$softblk" list)"
"$softblk" list | grep f1 | grep -q "$loop detached" || fail "list does not say the loop device went"

note "another user's image on $loop survives set power=0"
attach_foreign "$loop"
[ "$(field f1 .export.loop)" = null ] || fail "list claims the other user's $loop"
"$softblk" set f1 power=0 >/dev/null || fail "set power=0 failed"
foreign_intact "set f1 power=0"
"$softblk" set f1 power=1 >/dev/null || fail "set power=1 failed"
loop=$(field f1 .export.loop)
[ -b "$loop" ] && [ "$loop" != "$foreign_loop" ] || fail "no new loop device after power=1: $loop"
release_foreign

note "del refused while the loop device is open; another user's image survives the next del"
hold_and_refuse "$loop" "still open" "$softblk" del f1
[ "$(field f1 .state)" = running ] || fail "f1 is gone after the refused del"
[ "$(field f1 .export.loop)" = null ] || fail "list still claims $loop after the refused del"
attach_foreign "$loop"
"$softblk" del f1 >/dev/null || fail "del f1 failed"
foreign_intact "del f1"
release_foreign
[ "$(loops)" -eq 0 ] || fail "loop devices left: $(our_loops)"

note "rmdir in the nullb tree: the same"
tree=$run_dir/nullb
mkdir "$tree"
"$softblk" nullb mount "$tree" --export fuse >/dev/null || fail "nullb mount failed"
mkdir "$tree/n1"
echo 1 >"$tree/n1/power"
loop=$(cat "$tree/n1/device")
[ -b "$loop" ] || fail "n1/device is not a loop device: $loop"
hold_and_refuse "$loop" "busy" rmdir "$tree/n1"
[ -d "$tree/n1" ] || fail "n1 is gone after the refused rmdir"
[ "$(cat "$tree/n1/device")" != "$loop" ] || fail "n1/device still claims $loop"
attach_foreign "$loop"
rmdir "$tree/n1" || fail "rmdir n1 failed"
foreign_intact "rmdir n1"
release_foreign
"$softblk" nullb umount "$tree" || fail "nullb umount"
[ "$(loops)" -eq 0 ] || fail "loop devices left: $(our_loops)"
"$softblk" shutdown >/dev/null
echo PASS
