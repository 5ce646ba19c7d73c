#!/usr/bin/env bash
# The attribute table (tests/cli/nullb_limits.tsv: every null_blk configfs
# attribute at and beyond its limits, with the kernel's errno and the value
# read back) through both of softblk's ways in: the daemon's set/get
# requests, and write(2)/read(2) on `softblk nullb mount`'s tree. Devices
# are exported nowhere (--export none): the table is about attributes and
# power on, not about a front end. The VM test vm.nullb_configfs runs the
# same table against the kernel's /sys/kernel/config/nullb.
# Every row goes to the daemon as the add, set, get and del requests that
# `softblk add`/`set`/`get`/`del` send, over one connection (mode call):
# through the commands themselves the table took some 3,000 process starts
# and 185 s (112 CPU s), over one connection about 6 s (2 CPU s). The
# commands pass an option's text to the daemon as it is and print its
# answer, so the rows of power, size and badblocks (every kind of row:
# new, off, on, live; every errno the table expects; writes before the
# row) still go through them (mode set): the commands' part, on rows whose
# results the table knows.
# Usage: nullb_limits_host.sh PATH/TO/softblk        (exit 77: skipped)
softblk=${1:?usage: $0 PATH/TO/softblk}
here=$(cd "$(dirname "$0")" && pwd)
set -euo pipefail  # before the library, so that a missing one stops the test
. "$here/../support/lib_cli.sh"
require_root_fuse dd python3
setup_run_dir limits
tree=$run_dir/nullb
mkdir "$tree"

note "the daemon's set/get requests, every row"
"$softblk" daemon >/dev/null || fail "daemon"
remember_daemon
set_ok=0
sh "$here/nullb_limits.sh" "$here/nullb_limits.tsv" call "$run_dir/control.sock" || set_ok=1

note "softblk set/get, the rows of power, size and badblocks"
sh "$here/nullb_limits.sh" "$here/nullb_limits.tsv" set "$softblk" --only '^(power|size|badblocks)$' || set_ok=1

note "the tree"
"$softblk" nullb mount "$tree" --export none >/dev/null || fail "nullb mount failed"
tree_ok=0
sh "$here/nullb_limits.sh" "$here/nullb_limits.tsv" tree "$tree" || tree_ok=1
"$softblk" nullb umount "$tree" || fail "nullb umount"
[ "$set_ok$tree_ok" = 00 ] || fail "the table's expected results differ (set: $set_ok, tree: $tree_ok)"
echo PASS
