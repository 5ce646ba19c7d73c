#!/usr/bin/env bash
# Metrics (docs/metrics.md), as root with the FUSE export:
#  1. bad --metrics-* options fail the daemon's start with a message that
#     names the option and what to give; no daemon is left running;
#  2. after I/O through a FUSE export, `softblk metrics` parses with
#     prometheus_client's parser and its counters equal `list --json`'s
#     (device bytes, requests, errors; the export's requests), with
#     counters as counters and current values as gauges;
#  3. the listener (--metrics-listen 127.0.0.1:0) answers GET /metrics with
#     the same counters; another daemon asking for its port is refused;
#  4. the textfile (--metrics-textfile, interval 1 s) appears, is replaced
#     by rename (a new inode) and every read of it is a whole, parsable
#     file, never a part of one;
#  5. shutdown stops the listener and removes the textfile.
# Usage: metrics.sh PATH/TO/softblk        (exit 77: skipped)
softblk=${1:?usage: $0 PATH/TO/softblk}
here=$(cd "$(dirname "$0")" && pwd)
set -euo pipefail  # before the library, so that a missing one stops the test
. "$here/../support/lib_cli.sh"
require_root_fuse dd curl
# Debian's python3-prometheus-client, also where another python3 comes
# first in PATH.
py=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import prometheus_client.parser' 2>/dev/null; then
    py=$p
    break
  fi
done
[ -n "$py" ] || skip "python3-prometheus-client is not installed (scripts/install-deps.sh)"
setup_run_dir metrics

# Refused with exit status $1 and a message matching $2: softblk daemon ARGS...
refused() {
  local want_rc=$1 pattern=$2 rc=0 err
  shift 2
  err=$("$softblk" daemon "$@" 2>&1 >/dev/null) || rc=$?
  [ "$rc" -eq "$want_rc" ] || fail "daemon $* exited $rc, not $want_rc: $err"
  grep -q -- "$pattern" <<<"$err" || fail "daemon $*: the message does not say '$pattern': $err"
  echo "   refused: $err"
  if "$softblk" status >/dev/null 2>&1; then fail "daemon $* left a daemon running"; fi
}

note "bad options fail the start"
refused 1 "give IPV4:PORT" --metrics-listen localhost
refused 1 "not an IPv4 address" --metrics-listen host.invalid:9560
refused 1 "65535" --metrics-listen 127.0.0.1:70000
refused 1 "not one of this machine's" --metrics-listen 192.0.2.1:9560
refused 1 "must end in .prom" --metrics-textfile "$run_dir/softblk.txt"
refused 1 "cannot write in" --metrics-textfile "$run_dir/missing/softblk.prom"
refused 1 "cannot write in" --foreground --metrics-textfile "$run_dir/missing/softblk.prom"
refused 2 "requires --metrics-textfile" --metrics-interval 5

note "a daemon with a textfile (every second) and a listener on an ephemeral port"
prom_dir=$run_dir/textfile
mkdir "$prom_dir"
prom=$prom_dir/softblk.prom
"$softblk" daemon --metrics-textfile "$prom" --metrics-interval 1 --metrics-listen 127.0.0.1:0
remember_daemon
listen=$("$softblk" status --json | jq -r .metrics.listen)
port=${listen##*:}
[[ "$listen" == 127.0.0.1:* ]] && [ "$port" -gt 0 ] || fail "status shows no listener: $listen"
[ "$("$softblk" status --json | jq -r .metrics.textfile)" = "$prom" ] || fail "status shows no textfile"

"$softblk" add null memory_backed=1 size=64 bs=4096 --export fuse --export-opt loop=0 --name m0 >/dev/null
"$softblk" add null zoned=1 size=1024 zone_size=64 --export none --name z0 >/dev/null
file=$(field m0 .export.file)
[ -f "$file" ] || fail "no exported file for m0"
dd if=/dev/urandom of="$file" bs=64k count=40 oflag=direct conv=notrunc status=none
dd if="$file" of=/dev/null bs=4k count=100 iflag=direct status=none
"$softblk" zone open z0 0 >/dev/null || fail "zone open"

# Compares metrics text (file $1) with list --json (file $2): every check
# prints itself, any difference fails.
compare() {
  "$py" - "$1" "$2" <<'EOF'
import json, sys
from prometheus_client.parser import text_string_to_metric_families

text = open(sys.argv[1]).read()
devices = {d["name"]: d for d in json.load(open(sys.argv[2]))}
families = {f.name: f for f in text_string_to_metric_families(text)}
# prometheus_client names a counter's family without "_total".
def sample(name, **labels):
    family = families[name[:-6] if name.endswith("_total") else name]
    found = [s.value for s in family.samples
             if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    if len(found) != 1:
        sys.exit(f"FAIL: {name}{labels}: {len(found)} samples")
    return found[0]
def check(what, got, want):
    if got != want:
        sys.exit(f"FAIL: {what}: metrics {got}, list --json {want}")
    print(f"   {what} = {got}")

for name, kind in [("softblk_device_io_bytes", "counter"), ("softblk_device_up", "gauge"),
                   ("softblk_device_size_bytes", "gauge"), ("softblk_device_queue_depth", "gauge"),
                   ("softblk_device_open_zones", "gauge"), ("softblk_export_requests", "counter"),
                   ("softblk_daemon_memory_used_bytes", "gauge")]:
    if families[name].type != kind:
        sys.exit(f"FAIL: {name} is a {families[name].type}, not a {kind}")
m0 = devices["m0"]
stats = m0["stats"]
if stats["bytes_written"] < 40 * 65536 or stats["bytes_read"] < 100 * 4096:
    sys.exit(f"FAIL: list --json does not show the I/O: {stats}")
check("m0 bytes written", sample("softblk_device_io_bytes_total", device="m0", target="null", op="write"), stats["bytes_written"])
check("m0 bytes read", sample("softblk_device_io_bytes_total", device="m0", op="read"), stats["bytes_read"])
check("m0 completed", sample("softblk_device_requests_completed_total", device="m0"), stats["completed"])
check("m0 submitted", sample("softblk_device_requests_submitted_total", device="m0"), stats["submitted"])
check("m0 errors", sample("softblk_device_errors_total", device="m0"), stats["errors"])
check("m0 size", sample("softblk_device_size_bytes", device="m0"), m0["capacity_bytes"])
check("m0 up", sample("softblk_device_up", device="m0"), 1)
exp = m0["export"]
check("m0 export up", sample("softblk_export_up", device="m0", export="fuse"), 1)
check("m0 export requests", sample("softblk_export_requests_total", device="m0", export="fuse"),
      exp["requests_after_poll"] + exp["requests_after_sleep"])
zones = devices["z0"]["target"]["zones"]
check("z0 open zones", sample("softblk_device_open_zones", device="z0"),
      zones["implicit_open"] + zones["explicit_open"])
check("z0 explicitly open", sample("softblk_device_zones", device="z0", condition="explicit_open"), 1)
check("z0 empty zones", sample("softblk_device_zones", device="z0", condition="empty"), zones["empty"])
EOF
}

note "softblk metrics against list --json"
"$softblk" metrics >"$run_dir/metrics.txt" || fail "softblk metrics failed"
"$softblk" list --json >"$run_dir/list.json"
compare "$run_dir/metrics.txt" "$run_dir/list.json" || fail "softblk metrics differs from list --json"

note "GET /metrics on $listen"
curl -fsS --max-time 10 "http://$listen/metrics" >"$run_dir/scrape.txt" || fail "the listener does not answer"
"$softblk" list --json >"$run_dir/list.json"
compare "$run_dir/scrape.txt" "$run_dir/list.json" || fail "the scrape differs from list --json"

note "another daemon asking for the same port is refused"
other=$(mktemp -d /tmp/softblk-metrics2.XXXXXX)
extra_cleanup+=("SOFTBLK_RUN_DIR=$other '$softblk' shutdown --force >/dev/null 2>&1; rm -rf '$other'")
rc=0
err=$(SOFTBLK_RUN_DIR=$other "$softblk" daemon --metrics-listen "$listen" 2>&1) || rc=$?
[ "$rc" -ne 0 ] && grep -q "in use" <<<"$err" || fail "a second listener on $listen: rc $rc: $err"
echo "   refused: $err"

note "the textfile: whole files, replaced by rename"
for i in $(seq 50); do grep -q 'device="m0"' "$prom" 2>/dev/null && break; sleep 0.1; done
grep -q 'device="m0"' "$prom" || fail "the textfile has no metrics of m0: $(cat "$prom" 2>&1)"
[ "$(stat -c %a "$prom")" = 644 ] || fail "the textfile's mode is $(stat -c %a "$prom"), not 644"
"$py" - "$prom" <<'EOF' || fail "the textfile was not replaced atomically"
import os, sys, time
from prometheus_client.parser import text_string_to_metric_families

path = sys.argv[1]
inodes, reads = set(), 0
end = time.monotonic() + 3.5
while time.monotonic() < end:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        sys.exit("FAIL: the textfile was missing for a moment")
    inodes.add(os.fstat(fd).st_ino)
    text = b""
    while chunk := os.read(fd, 65536):
        text += chunk
    os.close(fd)
    text = text.decode()
    # A whole file: the last family and the end of the text are there.
    if not text.endswith("\n") or 'softblk_export_up{device="m0"' not in text:
        sys.exit(f"FAIL: a partial textfile ({len(text)} bytes)")
    list(text_string_to_metric_families(text))
    reads += 1
if len(inodes) < 2:
    sys.exit(f"FAIL: the textfile was not replaced in 3.5 s (inodes {inodes})")
print(f"   {reads} reads, all whole; {len(inodes)} files renamed in")
EOF
ls "$prom_dir" | grep -qv '^softblk.prom$' && fail "files left beside the textfile: $(ls "$prom_dir")"

note "shutdown stops the listener and removes the textfile"
daemon=$(cat "$run_dir/daemon.pid")
"$softblk" shutdown >/dev/null
wait_gone "$daemon" 30 || fail "the daemon did not stop"
if curl -fsS --max-time 5 "http://$listen/metrics" >/dev/null 2>&1; then
  fail "the listener still answers after shutdown"
fi
[ ! -e "$prom" ] || fail "the textfile stays after shutdown"
note "PASS"
