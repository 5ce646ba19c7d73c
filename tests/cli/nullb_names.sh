#!/usr/bin/env bash
# The nullb tree and device names, as root (docs/null.md, "The configfs
# tree"):
#   - ls and os.listdir show the tree's entries (real inode numbers in
#     readdir, the same as stat's);
#   - `softblk nullb mount` refuses a non-empty directory and a directory
#     with a tree (or anything) mounted on it already;
#   - the name `features` is refused (add: EEXIST, as the kernel's mkdir in
#     /sys/kernel/config/nullb), and so is a name starting with '-';
#   - devices of those names left by older versions' state files come back
#     and can be deleted (`softblk del -- -x`).
# Usage: nullb_names.sh PATH/TO/softblk        (exit 77: skipped)
softblk=${1:?usage: $0 PATH/TO/softblk}
set -euo pipefail  # before the library, so that a missing one stops the test
. "$(dirname "$0")/../support/lib_cli.sh"
require_root_fuse python3 stat
setup_run_dir nbnames
tree=$run_dir/nullb
mkdir "$tree"

note "a non-empty directory is refused"
touch "$tree/mine"
if out=$("$softblk" nullb mount "$tree" --export none 2>&1); then fail "mounted over a non-empty directory"; fi
remember_daemon
grep -q "not empty" <<<"$out" || fail "the refusal does not say why: $out"
! findmnt -rn "$tree" >/dev/null || fail "mounted over $tree/mine"
rm "$tree/mine"

note "mount, and refuse a second mount on the same directory"
"$softblk" nullb mount "$tree" --export none >/dev/null || fail "nullb mount failed"
remember_daemon
if out=$("$softblk" nullb mount "$tree" --export none 2>&1); then fail "mounted a second tree on $tree"; fi
grep -q "mounted there already" <<<"$out" || fail "the refusal does not say why: $out"
[ "$(findmnt -rn -o TARGET | grep -cx "$tree")" -eq 1 ] || fail "more than one mount on $tree"

note "ls and os.listdir see the entries, with stat's inode numbers"
mkdir "$tree/n1"
[ "$(ls "$tree" | sort | tr '\n' ' ')" = "features n1 " ] || fail "ls $tree shows: $(ls -a "$tree")"
python3 - "$tree" <<'EOF' || fail "os.listdir/scandir disagree with stat"
import os, sys
tree = sys.argv[1]
assert sorted(os.listdir(tree)) == ["features", "n1"], os.listdir(tree)
for d in (tree, os.path.join(tree, "n1"), os.path.join(tree, "n1", "timeout_inject")):
    entries = list(os.scandir(d))
    assert entries, f"{d}: empty listing"
    for e in entries:
        ino = os.stat(e.path, follow_symlinks=False).st_ino
        assert e.inode() != 0 and e.inode() == ino, f"{e.path}: readdir {e.inode()}, stat {ino}"
names = os.listdir(os.path.join(tree, "n1"))
for a in ("power", "size", "device", "timeout_inject"):
    assert a in names, f"n1 lacks {a}: {names}"
EOF

note "the name features is refused, in the tree and by add"
if out=$(mkdir "$tree/features" 2>&1); then fail "mkdir features succeeded"; fi
grep -q "File exists" <<<"$out" || fail "mkdir features: not EEXIST: $out"
if out=$("$softblk" add null --export none --name features 2>&1); then fail "add --name features succeeded"; fi
grep -q "configfs" <<<"$out" || fail "the refusal does not say why: $out"

note "a name starting with '-' is refused"
if out=$("$softblk" add null --export none --name=-x 2>&1); then fail "add --name=-x succeeded"; fi
grep -q "option" <<<"$out" || fail "the refusal does not say why: $out"
rmdir "$tree/n1"
"$softblk" nullb umount "$tree" || fail "nullb umount"
"$softblk" shutdown >/dev/null

note "devices named -x and features from an older version's state files"
"$softblk" add null --export none --name old >/dev/null
remember_daemon
"$softblk" shutdown >/dev/null
for name in -x features; do
  jq --arg n "$name" '.name = $n' "$run_dir/devices/old.json" >"$run_dir/devices/$name.json"
done
rm "$run_dir/devices/old.json"
names=$("$softblk" list --json | jq -r '[.[].name] | sort | join(",")')
remember_daemon
[ "$names" = "-x,features" ] || fail "the old devices did not come back: $names"
"$softblk" nullb mount "$tree" --export none >/dev/null || fail "nullb mount failed"
[ "$(ls "$tree" | sort | tr '\n' ' ')" = "-x features " ] || fail "ls $tree shows: $(ls -a "$tree")"
[ -f "$tree/features" ] || fail "the features file is hidden by the device"
"$softblk" nullb umount "$tree" || fail "nullb umount"
"$softblk" del -- -x >/dev/null || fail "softblk del -- -x failed"
"$softblk" del features >/dev/null || fail "softblk del features failed"
[ "$("$softblk" list --json | jq length)" = 0 ] || fail "devices left: $("$softblk" list)"
"$softblk" shutdown >/dev/null
echo PASS
