#!/usr/bin/env bash
# null_blk's configfs workflow on softblk, as root with the FUSE export:
#  1. `softblk nullb mount DIR` serves a tree that behaves like
#     /sys/kernel/config/nullb: nullb_script.sh (the same script the VM lab
#     runs against the kernel's configfs) must print nullb_expected.txt,
#     the kernel's transcript (Linux 6.12);
#  2. `softblk set` / `softblk get` give the same results as the tree:
#     configfs' errors as exit status and message, clamped values read
#     back in `get` and in `list`, a power cycle that keeps the data;
#  3. features lists null_blk's attribute names; the tree shows devices
#     made with `softblk add`, and rmdir of a powered-on device deletes it;
#  4. 64 KiB blocks through the loop device where the kernel takes them,
#     and a larger block refused naming the limit;
#  5. `softblk daemon gb=1 bs=4096 nr_devices=2`: null_blk's module
#     parameters make nullb0 and nullb1 and are the defaults of later
#     devices; state (power) and malformed values are refused.
# Usage: nullb_tree.sh PATH/TO/softblk        (exit 77: skipped)
softblk=${1:?usage: $0 PATH/TO/softblk}
here=$(cd "$(dirname "$0")" && pwd)
set -euo pipefail  # before the library, so that a missing one stops the test
. "$here/../support/lib_cli.sh"
require_root_fuse cmp dd blockdev
setup_run_dir nullb
# The tree's FUSE mount lives below the run directory: the trap unmounts it.
tree=$run_dir/nullb
mkdir "$tree"

note "mount the tree"
"$softblk" nullb mount "$tree" --export fuse >/dev/null || fail "nullb mount failed"
remember_daemon
findmnt -rn -o FSTYPE "$tree" | grep -q fuse || fail "no FUSE mount on $tree"

note "features"
features=$(cat "$tree/features")
for a in badblocks blocksize power size submit_queues memory_backed zone_size; do
  case ",$features," in *",$a,"*) ;; *)
    [ "$a" = zone_size ] && continue  # zoned: the zoned target's
    fail "features lacks $a: $features" ;;
  esac
done

note "the shared configfs script against the tree"
out=$run_dir/transcript.txt
sh "$here/nullb_script.sh" "$tree" t0 >"$out" 2>&1 || true
diff -u "$here/nullb_expected.txt" "$out" || fail "the tree's transcript differs from the kernel's"

note "softblk set/get: the same rules from the command line"
"$softblk" add null power=0 size=8 memory_backed=1 --export fuse --name c0 >/dev/null
[ "$("$softblk" get c0 power)" = 0 ] || fail "add power=0 did not make it powered off"
[ "$(field c0 .state)" = off ] || fail "list does not show c0 off"
"$softblk" set c0 mbps=99999 irqmode=9 submit_queues=0 power=1 >/dev/null || fail "set power=1"
[ "$("$softblk" get c0 mbps)" = 40960 ] || fail "mbps not clamped in get"
[ "$("$softblk" get c0 irqmode)" = 2 ] || fail "irqmode not clamped in get"
[ "$("$softblk" get c0 submit_queues)" = 1 ] || fail "submit_queues=0 not made 1"
field c0 '.options[]' | grep -qx mbps=40960 || fail "list shows no clamped mbps"
loop=$(field c0 .export.loop)
[ -b "$loop" ] || fail "c0 has no loop device"
head -c 65536 /dev/urandom >"$run_dir/pattern"
dd if="$run_dir/pattern" of="$loop" bs=4096 oflag=direct status=none || fail "write to $loop"
if msg=$("$softblk" set c0 size=16 2>&1); then fail "size changed while powered on"; fi
grep -q "powered on" <<<"$msg" || fail "EBUSY message does not say why: $msg"
if "$softblk" set c0 hw_queue_depth=4294967296 2>/dev/null; then fail "ERANGE accepted"; fi
"$softblk" set c0 badblocks=+0-7 >/dev/null || fail "badblocks while powered on"
[ "$("$softblk" get c0 badblocks)" = "0 8" ] || fail "badblocks read: $("$softblk" get c0 badblocks)"
"$softblk" set c0 power=0 badblocks=-0-7 size=16 power=1 >/dev/null || fail "power cycle"
loop=$(field c0 .export.loop)
cmp <(dd if="$loop" bs=4096 count=16 iflag=direct status=none) "$run_dir/pattern" ||
  fail "the data did not survive the power cycle"
[ "$(field c0 .capacity_bytes)" = $((16 << 20)) ] || fail "size change while off not applied"

note "devices made with add appear in the tree; rmdir deletes a powered-on one"
[ "$(cat "$tree/c0/power")" = 1 ] || fail "c0 not in the tree"
[ "$(cat "$tree/c0/device")" = "$loop" ] || fail "c0/device is not $loop"
rmdir "$tree/c0" || fail "rmdir c0"
"$softblk" list --json | jq -e 'map(select(.name == "c0")) | length == 0' >/dev/null ||
  fail "c0 still listed after rmdir"

note "blocks of 64 KiB through the loop device (Linux 6.15+)"
if [ "$(printf '%s\n' "$(uname -r)" 6.15 | sort -V | head -1)" = 6.15 ]; then
  "$softblk" add null size=16 bs=65536 memory_backed=1 --export fuse --name big >/dev/null ||
    fail "bs=65536 refused with the FUSE export"
  [ "$(blockdev --getss "$(field big .export.loop)")" = 65536 ] || fail "the loop device's block is not 64 KiB"
  "$softblk" del big >/dev/null
else
  echo "kernel $(uname -r): the loop device takes the page size at most"
fi
if msg=$("$softblk" add null size=16 bs=131072 --export none 2>&1); then fail "bs=131072 accepted"; fi
grep -q "65536" <<<"$msg" || fail "the block size error does not name the limit: $msg"

note "unmount"
"$softblk" nullb umount "$tree" || fail "nullb umount"
! findmnt -rn "$tree" >/dev/null || fail "still mounted"
"$softblk" del --all >/dev/null
"$softblk" shutdown >/dev/null

note "module parameters and nr_devices"
if "$softblk" daemon power=0 2>/dev/null; then fail "power accepted as a module parameter"; fi
if "$softblk" daemon bs=x 2>/dev/null; then fail "bs=x accepted as a module parameter"; fi
"$softblk" daemon gb=1 bs=4096 nr_devices=2 >/dev/null || fail "daemon with module parameters"
remember_daemon
[ "$("$softblk" list --json | jq -r '[.[].name] | sort | join(",")')" = nullb0,nullb1 ] ||
  fail "nr_devices=2 did not make nullb0 and nullb1: $("$softblk" list)"
[ "$(field nullb1 .capacity_bytes)" = $((1 << 30)) ] || fail "gb=1 not the default size"
[ "$(field nullb1 .logical_block_size)" = 4096 ] || fail "bs=4096 not the default block size"
"$softblk" add null --export none --name later >/dev/null
[ "$("$softblk" get later blocksize)" = 4096 ] || fail "a later device does not get the module's bs"
"$softblk" del --all >/dev/null
"$softblk" shutdown >/dev/null
echo "PASS"
