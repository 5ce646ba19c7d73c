#!/usr/bin/env bash
# What the command line prints, as README.md and docs/null.md say (no export,
# no root: the daemon's own requests):
#  1. `get NAME KEY...` prints the keys in the order asked;
#  2. `set --json` puts its error once, as JSON on stdout (exit 1, nothing
#     on stderr), as its result would go;
#  3. a zoned null device's clamped zone_nr_conv / zone_max_open come with
#     a note in `add`'s output, as every other clamped value (irqmode);
#  4. `features` aligns its columns however long an option's name, gives
#     zloop-ram's memory_limit no "memory_backed=1", and names the export a
#     zoned device gets when the default cannot carry zones;
#  5. `add` of a zoned device that names no export gets that export (one
#     with a zoned model), not the default that refuses zones.
# Usage: cli_output.sh PATH/TO/softblk        (exit 77: skipped)
softblk=${1:?usage: $0 PATH/TO/softblk}
here=$(cd "$(dirname "$0")" && pwd)
set -euo pipefail  # before the library, so that a missing one stops the test
. "$here/../support/lib_cli.sh"
for tool in jq python3; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/install-deps.sh)"
done
setup_run_dir output

note "get: the order asked"
"$softblk" add null size=64 --export none --name g0 >/dev/null || fail "add g0"
remember_daemon
got=$("$softblk" get g0 size mbps irqmode blocksize | tr '\n' ' ')
[ "$got" = "size=64 mbps=0 irqmode=1 blocksize=512 " ] || fail "get order: $got"

note "set --json: the error once, on stdout"
rc=0
"$softblk" set g0 irqmode=abc --json >"$run_dir/out" 2>"$run_dir/err" || rc=$?
[ "$rc" = 1 ] || fail "set --json of a bad value exited $rc"
[ ! -s "$run_dir/err" ] || fail "set --json wrote to stderr: $(cat "$run_dir/err")"
jq -e '.error.name == "EINVAL" and (.error.message | test("irqmode=abc"))' "$run_dir/out" \
  >/dev/null || fail "set --json error: $(cat "$run_dir/out")"
"$softblk" set g0 irqmode=abc >"$run_dir/out" 2>"$run_dir/err" && fail "set irqmode=abc passed"
[ ! -s "$run_dir/out" ] && grep -q "irqmode=abc" "$run_dir/err" ||
  fail "set without --json: error not on stderr only"

note "zoned null: clamped zone limits come with a note"
out=$("$softblk" add null zoned=1 size=1024 zone_size=64 zone_nr_conv=100 zone_max_open=100 \
  irqmode=3 --export none --name z0) || fail "add z0"
for want in "zone_nr_conv=100 clamped to 15" "zone_max_open=100 clamped to 0" "irqmode=3 clamped"; do
  grep -q "note: $want" <<<"$out" || fail "no note '$want' in: $out"
done
[ "$("$softblk" get z0 zone_nr_conv)" = 15 ] || fail "zone_nr_conv not written back"

note "features: aligned columns"
"$softblk" features --json >"$run_dir/features.json"
"$softblk" features >"$run_dir/features.txt"
python3 - "$run_dir/features.json" "$run_dir/features.txt" <<'EOF' || fail "features table"
import json, sys
features = json.load(open(sys.argv[1]))
lines = open(sys.argv[2]).read().splitlines()
# Each option's help starts in its table's MEANING column.
tables, current = [], None
for line in lines:
    if line.startswith("  OPTION "):
        current = {"meaning": line.index("MEANING"), "rows": []}
        tables.append(current)
    elif current is not None and line.startswith("  ") and not line.startswith("   "):
        current["rows"].append(line)
    else:
        current = None
helps = [o["help"] for t in features["targets"] for o in t["options"]]
helps += [o["help"] for e in features["exports"] for o in e["options"]]
checked = 0
for table in tables:
    for row in table["rows"]:
        for h in helps:
            if h and row.endswith(" " + h):
                if row.index(h) != table["meaning"]:
                    sys.exit(f"misaligned: MEANING at {table['meaning']}, help at "
                             f"{row.index(h)}: {row[:80]}")
                checked += 1
                break
if checked < 50:
    sys.exit(f"only {checked} option rows found")
ram = next(t for t in features["targets"] if t["name"] == "zloop-ram")
limit = next(o for o in ram["options"] if o["name"] == "memory_limit")
if "memory_backed" in limit["help"]:
    sys.exit("zloop-ram's memory_limit mentions memory_backed: " + limit["help"])
exports = {e["name"]: e for e in features["exports"]}
zoned = features["zoned_export"]
if not exports[zoned]["zoned"] or not exports[zoned]["available"]:
    sys.exit(f"zoned_export {zoned} cannot carry a zoned device here")
default = features["default_export"]
header = next(l for l in lines if l.startswith("export types (default: "))
if not exports[default]["zoned"] and f"for a zoned device: {zoned}" not in header:
    sys.exit("features does not say which export a zoned device gets: " + header)
EOF

note "add: a zoned device without --export gets an export that carries zones"
zoned=$(jq -r .zoned_export "$run_dir/features.json")
if [ "$zoned" = none ]; then
  "$softblk" add null zoned=1 size=256 zone_size=64 --name z1 >"$run_dir/out" 2>&1 &&
    fail "add of a zoned device passed with no zoned export here: $(cat "$run_dir/out")"
  grep -q "no default export can carry this zoned device" "$run_dir/out" ||
    fail "add's error does not say why: $(cat "$run_dir/out")"
else
  "$softblk" add null zoned=1 size=256 zone_size=64 --name z1 --json >"$run_dir/out" ||
    fail "add of a zoned device with the default export: $(cat "$run_dir/out")"
  got=$(jq -r .export.type "$run_dir/out")
  [ "$got" = "$zoned" ] || fail "zoned z1 got export $got, features says $zoned"
  "$softblk" list --json | jq -e --arg t "$zoned" \
    '.[] | select(.name == "z1") | .state == "running" and .export.type == $t' >/dev/null ||
    fail "z1 is not listed running with export $zoned: $("$softblk" list)"
  "$softblk" del z1 >/dev/null || fail "del z1"
fi
echo "PASS"
