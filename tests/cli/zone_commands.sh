#!/usr/bin/env bash
# `softblk zone report|open|close|finish|reset` through the daemon, on a
# null device with zoned=1 and on a zloop device in a temporary directory
# (no export: the daemon's own requests go through the core):
#  1. report prints blkzone's lines (start, len, cap, wptr, condition,
#     type), --offset/--count select zones, --json gives the same zones;
#  2. open, close, finish and reset of one zone and of ranges, each
#     transition seen through report; reset --all;
#  3. errors: not a zoned device, a sector not at a zone start, beyond the
#     device, the open limit (null_blk: ETOOMANYREFS; zloop: EIO), named
#     with the zone; a range stops at the failing zone;
#     and an exported device takes the same commands (with a driver on
#     the export: tests/cli/zone_export_test.cpp);
#  4. the zloop device's zone files follow (finish extends, reset empties);
#     a zloop-ram device answers as zloop does.
# Usage: zone_commands.sh PATH/TO/softblk        (exit 77: skipped)
softblk=${1:?usage: $0 PATH/TO/softblk}
here=$(cd "$(dirname "$0")" && pwd)
set -euo pipefail  # before the library, so that a missing one stops the test
. "$here/../support/lib_cli.sh"
command -v jq >/dev/null || skip "jq is not installed (scripts/install-deps.sh)"
setup_run_dir zone

# Zone $2 (index) of device $1: "COND WPTR" from `zone report --json`
# (condition code as blkzone prints it after "zcond:", wptr relative).
zone_state() {
  local start=$(($2 * zone_sectors))
  "$softblk" zone report "$1" --offset $start --count 1 |
    sed -nE 's/.*wptr 0x([0-9a-f]+) .*zcond: *[0-9]+\(([a-z]+)\).*/\2 \1/p'
}
expect_state() {  # device zone "cond wptr-hex"
  local got
  got=$(zone_state "$1" "$2")
  [ "$got" = "$3" ] || fail "$1 zone $2: expected '$3', report says '$got'"
}
# Runs softblk and expects it to fail with a message matching $1.
expect_error() {
  local pattern=$1 msg
  shift
  if msg=$("$softblk" "$@" 2>&1); then fail "softblk $* succeeded"; fi
  grep -Eq -e "$pattern" <<<"$msg" || fail "softblk $*: message '$msg' lacks /$pattern/"
}

note "null zoned=1: 8 zones of 8 MiB, 1 conventional, at most 2 open"
"$softblk" add null zoned=1 size=64 zone_size=8 zone_nr_conv=1 zone_max_open=2 memory_backed=1 \
  --export none --name z0 >/dev/null || fail "add null zoned=1"
remember_daemon
zone_sectors=16384
report=$("$softblk" zone report z0)
[ "$(wc -l <<<"$report")" = 8 ] || fail "report gave not 8 lines: $report"
head -1 <<<"$report" | grep -qx '  start: 0x000000000, len 0x004000, cap 0x004000, wptr 0x000000 reset:0 non-seq:0, zcond: 0(nw) \[type: 1(CONVENTIONAL)\]' ||
  fail "conventional zone line: $(head -1 <<<"$report")"
sed -n 2p <<<"$report" | grep -qx '  start: 0x000004000, len 0x004000, cap 0x004000, wptr 0x000000 reset:0 non-seq:0, zcond: 1(em) \[type: 2(SEQ_WRITE_REQUIRED)\]' ||
  fail "sequential zone line: $(sed -n 2p <<<"$report")"
[ "$("$softblk" zone report z0 -o 40000 -c 2 | wc -l)" = 2 ] || fail "--count 2 not 2 lines"
head -1 <<<"$("$softblk" zone report z0 -o 40000 -c 2)" | grep -q 'start: 0x000008000' ||
  fail "--offset inside zone 2 does not start the report at zone 2"
[ "$("$softblk" zone report z0 -o 114688 -c 5 | wc -l)" = 1 ] || fail "--count past the end not clamped"
json=$("$softblk" zone report z0 --json --offset 16384 --count 1)
jq -e '.zones | length == 1 and .[0].start == 16384 and .[0].len == 16384 and .[0].wptr == 16384
  and .[0].cond_name == "empty" and .[0].type_name == "seq-write-required"' <<<"$json" >/dev/null ||
  fail "report --json: $json"

note "transitions through report"
"$softblk" zone open z0 16384 || fail "open zone 1"
expect_state z0 1 "oe 000000"
"$softblk" zone close z0 16384 || fail "close zone 1"
expect_state z0 1 "em 000000"  # null_blk: closing an empty zone makes it empty
"$softblk" zone open z0 --offset 32768 --count 2 || fail "open zones 2-3"
expect_state z0 2 "oe 000000"
expect_state z0 3 "oe 000000"
"$softblk" zone finish z0 32768 || fail "finish zone 2"
expect_state z0 2 "fu 004000"
"$softblk" zone close z0 49152 || fail "close zone 3"
expect_state z0 3 "em 000000"
"$softblk" zone reset z0 32768 || fail "reset zone 2"
expect_state z0 2 "em 000000"
"$softblk" zone finish z0 --offset 65536 --count 3 || fail "finish zones 4-6"
for z in 4 5 6; do expect_state z0 $z "fu 004000"; done
"$softblk" zone reset z0 --offset 65536 --count 2 || fail "reset zones 4-5"
expect_state z0 4 "em 000000"
expect_state z0 6 "fu 004000"
"$softblk" zone reset z0 --all || fail "reset --all"
expect_state z0 6 "em 000000"
"$softblk" zone finish z0 --offset 16384 || fail "finish to the end"
for z in 1 2 3 4 5 6 7; do expect_state z0 $z "fu 004000"; done
"$softblk" zone reset z0 --offset 0 || fail "reset of the whole device (a reset-all)"
for z in 1 7; do expect_state z0 $z "em 000000"; done
jq -e '.all == true' <<<"$("$softblk" zone reset z0 --all --json)" >/dev/null ||
  fail "reset --all --json"

note "errors"
"$softblk" add null size=16 --export none --name plain >/dev/null
expect_error "plain is not a zoned device" zone report plain
expect_error "plain is not a zoned device" zone open plain 0
expect_error "no device named 'nothere'" zone report nothere
expect_error "sector 100 is not the start of a zone .*starts at sector 0" zone open z0 100
expect_error "sector 131072 is beyond the device's end \(131072 sectors" zone reset z0 131072
expect_error "conventional zones take no zone management" zone finish z0 0
"$softblk" zone open z0 16384 && "$softblk" zone open z0 32768 || fail "open two zones"
expect_error "zone open of the zone at sector 49152 \(zone 3, empty\): .*ETOOMANYREFS.*max_open_zones=2" \
  zone open z0 49152
expect_state z0 3 "em 000000"
# Zone 2 is open already (done), zone 3 is refused.
expect_error "zone 3, empty\): .*ETOOMANYREFS.*\(1 zone before it done\)" \
  zone open z0 --offset 32768 --count 2
"$softblk" zone close z0 --offset 16384 --count 2 || fail "close zones 1-2"
expect_state z0 2 "em 000000"
# null_blk refuses to close a zone that is not open.
expect_error "zone close of the zone at sector 49152 \(zone 3, empty\): .*EIO" zone close z0 49152
expect_error "give a zone's start SECTOR" zone open z0
expect_error "--all resets every zone" zone reset z0 --all 16384
expect_error "give SECTOR or --offset" zone open z0 16384 --offset 16384

if "$softblk" features --json | jq -e '.exports | map(.name) | index("vhost-user-blk")' >/dev/null; then
  note "an exported device takes zone commands (no driver connected: the daemon runs them)"
  "$softblk" add null zoned=1 size=64 zone_size=8 --export vhost-user-blk --name v0 >/dev/null ||
    fail "add with vhost-user-blk"
  "$softblk" zone open v0 16384 || fail "open on the exported v0"
  expect_state v0 1 "oe 000000"
  "$softblk" zone reset v0 16384 || fail "reset on the exported v0"
  expect_state v0 1 "em 000000"
  "$softblk" del v0 >/dev/null || fail "del v0"
fi

note "zloop: one file per zone in $run_dir/zloop"
mkdir -p "$run_dir/zloop/0"
"$softblk" add zloop id=0 base_dir="$run_dir/zloop" capacity_mb=64 zone_size_mb=8 conv_zones=1 \
  max_open_zones=1 --export none --name zl >/dev/null || fail "add zloop"
[ "$("$softblk" zone report zl | wc -l)" = 8 ] || fail "zloop report not 8 zones"
"$softblk" zone open zl 16384 || fail "zloop open zone 1"
expect_state zl 1 "oe 000000"
expect_error "zone open of the zone at sector 32768 \(zone 2, empty\): .*EIO.*max_open_zones=1" \
  zone open zl 32768
"$softblk" zone finish zl 16384 || fail "zloop finish zone 1"
# zloop reports no write pointer for full zones: blkzone shows all ones
# minus the start.
expect_state zl 1 "fu ffffffffffffbfff"
jq -e '.zones[0].wptr == null' <<<"$("$softblk" zone report zl --json -o 16384 -c 1)" >/dev/null ||
  fail "a full zloop zone's wptr is not null in JSON"
[ "$(stat -c %s "$run_dir/zloop/0/seq-000001")" = $((8 << 20)) ] ||
  fail "finish did not extend seq-000001 to the zone capacity"
"$softblk" zone reset zl 16384 || fail "zloop reset zone 1"
expect_state zl 1 "em 000000"
[ "$(stat -c %s "$run_dir/zloop/0/seq-000001")" = 0 ] || fail "reset did not empty seq-000001"
"$softblk" zone finish zl --offset 16384 --count 7 || fail "zloop finish zones 1-7"
"$softblk" zone reset zl --all || fail "zloop reset --all"
for z in 1 4 7; do expect_state zl $z "em 000000"; done
expect_error "conventional zones take no zone management" zone reset zl 0

note "zloop-ram: zloop's zones in memory"
"$softblk" add zloop-ram capacity_mb=64 zone_size_mb=8 conv_zones=1 max_open_zones=1 \
  --export none --name zr >/dev/null || fail "add zloop-ram"
"$softblk" zone open zr 16384 || fail "zloop-ram open zone 1"
expect_error "zone open of the zone at sector 32768 \(zone 2, empty\): .*EIO.*max_open_zones=1" \
  zone open zr 32768
"$softblk" zone finish zr 16384 || fail "zloop-ram finish zone 1"
expect_state zr 1 "fu ffffffffffffbfff"
"$softblk" zone reset zr --all || fail "zloop-ram reset --all"
expect_state zr 1 "em 000000"

note "del and shutdown"
"$softblk" del z0 plain zl zr >/dev/null || fail "del"
"$softblk" shutdown >/dev/null || fail "shutdown"
echo "PASS"
