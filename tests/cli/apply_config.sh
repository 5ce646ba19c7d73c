#!/usr/bin/env bash
# Devices declared in files (docs/config.md): `softblk apply` and `softblk
# save` with a private run directory and configuration directory.
#  1. apply creates a null (memory_backed=1), a file and a zloop device from
#     their files; list (text and --json) says the memory-backed one comes
#     back empty after a restart; a second apply says unchanged for all;
#  2. a changed live attribute (io_timeout) is applied and shown; a changed
#     option that cannot change live (blocksize) is reported, not changed,
#     and the exit status is non-zero;
#  3. --dry-run prints the plan and changes nothing (list --json equal);
#  4. malformed files (unknown key, bad value, no type) are errors naming
#     FILE:LINE and the key, and the other files still apply;
#  5. --prune deletes only the devices without a file; without it none;
#  6. save --all to a fresh directory, a fresh daemon (shutdown, the run
#     directory's state files deleted: a reboot) and apply give the same
#     options; the file device's data (written through its FUSE export,
#     when root with /dev/fuse) and the zloop device's write pointers
#     survive; save refuses to overwrite a different file without --force.
# Usage: apply_config.sh PATH/TO/softblk        (exit 77: skipped)
softblk=${1:?usage: $0 PATH/TO/softblk}
here=$(cd "$(dirname "$0")" && pwd)
set -euo pipefail  # before the library, so that a missing one stops the test
. "$here/../support/lib_cli.sh"
command -v jq >/dev/null || skip "jq is not installed (scripts/install-deps.sh)"
setup_run_dir apply
conf=$run_dir/conf
export SOFTBLK_CONFIG_DIR=$conf
mkdir -p "$conf" "$run_dir/images/zloop/0"

fuse=none
if [ "$(id -u)" -eq 0 ] && [ -c /dev/fuse ]; then
  fuse=fuse
else
  echo "note: not root with /dev/fuse: the file device's data is not written (export none)"
fi

# The options of every device, as apply and save must keep them.
options_json() {
  "$softblk" list --json |
    jq -S '[.[] | {name, type, state, options, export: .export.type,
                   export_options: (.export.options // [])}] | sort_by(.name)'
}
# Runs apply with $@; sets `out` and `rc`.
apply() {
  rc=0
  out=$("$softblk" apply "$@" 2>&1) || rc=$?
  echo "$out"
}
expect_line() {  # action name [pattern]
  grep -Eq "^$1 +$2( |$).*${3:-}" <<<"$out" || fail "apply: no '$1 $2 ${3:-}' line in: $out"
}

note "1. apply creates null, file and zloop devices from their files"
cat >"$conf/m0.conf" <<EOF
# a memory-backed null device
type=null
export=none
memory_backed=1
size=64
blocksize=512
io_timeout=5000
EOF
cat >"$conf/f0.conf" <<EOF
type=file
export=$fuse
path=$run_dir/images/f0.img
size=16M
create=1
EOF
cat >"$conf/z0.conf" <<EOF
type=zloop
export=none
id=0
base_dir=$run_dir/images/zloop
capacity_mb=64
zone_size_mb=8
conv_zones=1
EOF
apply
[ "$rc" -eq 0 ] || fail "apply exited $rc"
for d in f0 m0 z0; do expect_line create $d; done
[ "$(field m0 '.options | index("memory_backed=1") != null')" = true ] || fail "m0 not memory_backed=1"
[ "$(field m0 .config)" = "$conf/m0.conf" ] || fail "m0 does not name its file"
[ "$(field m0 .data)" = "empty after restart (memory-backed)" ] || fail "list --json: m0's data"
[ "$(field f0 '.data // "kept"')" = kept ] || fail "list --json: the file device is said to lose its data"
"$softblk" list | grep -q "data: empty after restart (memory-backed)" || fail "list: m0's data"
[ "$(field z0 .type)" = zloop ] || fail "z0 is not a zloop device"

note "   a second apply: unchanged for all"
apply
[ "$rc" -eq 0 ] || fail "second apply exited $rc"
for d in f0 m0 z0; do expect_line unchanged $d; done

note "2. a live attribute changes; one that cannot change live is reported"
sed -i 's/^io_timeout=.*/io_timeout=7000/' "$conf/m0.conf"
apply
[ "$rc" -eq 0 ] || fail "apply of a live change exited $rc"
expect_line update m0 "io_timeout: 5000 -> 7000"
[ "$("$softblk" get m0 io_timeout)" = 7000 ] || fail "io_timeout not applied"
apply
expect_line unchanged m0
sed -i 's/^blocksize=.*/blocksize=4096/' "$conf/m0.conf"
apply
[ "$rc" -ne 0 ] || fail "apply with a non-live difference exited 0"
expect_line differs m0 "blocksize: running 512, file 4096.*softblk del m0"
[ "$("$softblk" get m0 blocksize)" = 512 ] || fail "blocksize changed"
sed -i 's/^blocksize=.*/blocksize=512/' "$conf/m0.conf"

note "3. --dry-run changes nothing"
sed -i 's/^io_timeout=.*/io_timeout=9000/' "$conf/m0.conf"
printf 'type=null\nexport=none\n' >"$conf/n1.conf"
before=$(options_json)
apply --dry-run
[ "$rc" -eq 0 ] || fail "dry run exited $rc"
expect_line update m0 "io_timeout: 7000 -> 9000"
expect_line create n1
[ "$(options_json)" = "$before" ] || fail "--dry-run changed the devices"
"$softblk" apply --dry-run --json | jq -e '.dry_run and (.plan | length) == 4' >/dev/null ||
  fail "apply --dry-run --json"
sed -i 's/^io_timeout=.*/io_timeout=7000/' "$conf/m0.conf"
rm "$conf/n1.conf"

note "4. malformed files: FILE:LINE and the key; the others still apply"
printf 'type=null\nexport=none\nfrobnicate=1\n' >"$conf/bad1.conf"
printf '# bad value\ntype=null\nsize=lots\n' >"$conf/bad2.conf"
printf 'export=none\nsize=64\n' >"$conf/bad3.conf"
printf 'type=null\nexport=none\nsize=32\n' >"$conf/n2.conf"
apply
[ "$rc" -ne 0 ] || fail "apply with bad files exited 0"
expect_line error bad1 "bad1.conf:3: .*frobnicate"
expect_line error bad2 "bad2.conf:3: .*size"
expect_line error bad3 "bad3.conf:2: no type="
expect_line create n2
[ "$(field n2 .state)" = running ] || fail "n2 was not created beside the bad files"
for b in bad1 bad2 bad3; do
  [ -z "$(field $b .name)" ] || fail "$b was created"
done
rm "$conf"/bad?.conf

note "5. --prune deletes only the devices without a file"
"$softblk" add null --name extra --export none >/dev/null
rm "$conf/n2.conf"
apply
[ "$rc" -eq 0 ] || fail "apply exited $rc"
[ "$(field extra .name)" = extra ] || fail "apply without --prune deleted extra"
[ "$(field n2 .name)" = n2 ] || fail "apply without --prune deleted n2"
apply --prune
[ "$rc" -eq 0 ] || fail "apply --prune exited $rc"
expect_line prune extra
expect_line prune n2
[ -z "$(field extra .name)" ] && [ -z "$(field n2 .name)" ] || fail "--prune left extra or n2"
[ "$("$softblk" list --json | jq -r '[.[].name] | sort | join(" ")')" = "f0 m0 z0" ] ||
  fail "--prune touched the declared devices"

note "6. save --all, a fresh daemon (as after a reboot), apply: same options and data"
pattern=$run_dir/pattern
head -c $((1 << 20)) /dev/urandom >"$pattern"
if [ "$fuse" = fuse ]; then
  dd if="$pattern" of="$(field f0 .export.file)" bs=1M conv=fsync,notrunc status=none
fi
# zone 1 (the first sequential one) full: its file at the zone's size
zone1=$((8 << 11))
"$softblk" zone finish z0 $zone1
"$softblk" zone report z0 --offset $zone1 --count 1 | grep -q 'zcond:14(fu)' ||
  fail "zone 1 of z0 not full: $("$softblk" zone report z0 --offset $zone1 --count 1)"
saved=$run_dir/saved
"$softblk" save --all --config-dir "$saved" || fail "save --all"
for d in f0 m0 z0; do [ -f "$saved/$d.conf" ] || fail "save wrote no $d.conf"; done
"$softblk" save m0 --config-dir "$saved" | grep -q '^unchanged m0' || fail "save again rewrote m0"
sed -i 's/^io_timeout=.*/io_timeout=8000/' "$saved/m0.conf"
if "$softblk" save m0 --config-dir "$saved" 2>/dev/null; then fail "save overwrote a different file"; fi
grep -q '^io_timeout=8000' "$saved/m0.conf" || fail "the refused save changed the file"
"$softblk" save m0 --force --config-dir "$saved" >/dev/null || fail "save --force"
grep -q '^io_timeout=7000' "$saved/m0.conf" || fail "save --force did not write the file"
before=$(options_json)
remember_daemon
"$softblk" shutdown >/dev/null
for pid in "${pids[@]}"; do wait_gone "$pid" 30 || fail "daemon $pid still runs after shutdown"; done
rm -f "$run_dir"/devices/*.json
apply --config-dir "$saved"
[ "$rc" -eq 0 ] || fail "apply after the restart exited $rc"
for d in f0 m0 z0; do expect_line create $d; done
[ "$(options_json)" = "$before" ] || fail "options differ after save and apply: $(diff <(echo "$before") <(options_json))"
if [ "$fuse" = fuse ]; then
  cmp <(head -c $((1 << 20)) "$(field f0 .export.file)") "$pattern" || fail "f0 lost its data"
fi
"$softblk" zone report z0 --offset $zone1 --count 1 | grep -q 'zcond:14(fu)' || fail "z0 lost zone 1's write pointer"
[ "$(field m0 .data)" = "empty after restart (memory-backed)" ] || fail "list --json: m0's data after the restart"
echo "PASS"
