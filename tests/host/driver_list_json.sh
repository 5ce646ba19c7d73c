#!/usr/bin/env bash
# The daemon (`softblk list --json`) and softblk-driver (`devices`) list the
# same device alike: both come from the host library's device table
# (src/host). One null device with the same options, exported over NBD on a
# unix socket (no root needed), in each; their JSON is compared field by
# field, ignoring what differs by process: times, the run directory's paths
# and the process's memory budget (the daemon's --memory-limit).
set -euo pipefail
cli=${SOFTBLK_CLI:?the softblk executable}
driver=${SOFTBLK_DRIVER:?the softblk-driver executable}
command -v python3 >/dev/null || { echo "SKIP: python3 missing"; exit 77; }

dir=$(mktemp -d /tmp/softblk-driver-list.XXXXXX)
daemon_dir=$dir/daemon
driver_dir=$dir/driver
mkdir -m 0700 "$daemon_dir" "$driver_dir"
driver_pid=""
cleanup() {
    local rc=$?
    if [ -n "$driver_pid" ]; then
        kill "$driver_pid" 2>/dev/null || true
        wait "$driver_pid" 2>/dev/null || true
    fi
    if [ -f "$daemon_dir/daemon.pid" ]; then
        local pid
        pid=$(cat "$daemon_dir/daemon.pid")
        SOFTBLK_RUN_DIR=$daemon_dir "$cli" shutdown >/dev/null 2>&1 || kill "$pid" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -rf "$dir"
    exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fail() { echo "FAIL: $*" >&2; exit 1; }

options=(size=64 blocksize=4096 submit_queues=2 hw_queue_depth=32 memory_backed=1)

SOFTBLK_RUN_DIR=$daemon_dir "$cli" add null "${options[@]}" --name d0 --export nbd >/dev/null ||
    fail "softblk add"
SOFTBLK_RUN_DIR=$daemon_dir "$cli" list --json >"$dir/daemon.json" || fail "softblk list --json"

mkfifo "$dir/cmd" "$dir/reply"
"$driver" --export nbd --run-dir "$driver_dir" --commands <"$dir/cmd" >"$dir/reply" \
    2>"$dir/driver.log" &
driver_pid=$!
exec 7>"$dir/cmd" 8<"$dir/reply"
ask() {
    echo "$*" >&7
    read -r -t 60 REPLY_LINE <&8 || fail "driver did not answer '$*' ($(cat "$dir/driver.log"))"
    [[ $REPLY_LINE == ok* ]] || fail "driver: '$*': $REPLY_LINE"
    REPLY_LINE=${REPLY_LINE#ok}
    REPLY_LINE=${REPLY_LINE# }
}
read -r -t 60 line <&8 || true
[ "$line" = ready ] || fail "driver not ready: '$line' ($(cat "$dir/driver.log"))"
ask add d0 null "${options[@]}"
ask devices
printf '%s\n' "$REPLY_LINE" >"$dir/driver.json"
ask quit

python3 - "$dir/daemon.json" "$daemon_dir" "$dir/driver.json" "$driver_dir" <<'PY'
import json, sys

# Times and the process's own memory budget differ by process.
IGNORED = {"busy_ms", "stopping_ms", "daemon_limit_bytes"}

def normal(value, run_dir):
    if isinstance(value, dict):
        return {k: normal(v, run_dir) for k, v in value.items() if k not in IGNORED}
    if isinstance(value, list):
        return [normal(v, run_dir) for v in value]
    if isinstance(value, str):
        return value.replace(run_dir, "RUN_DIR")
    return value

def fields(value, path=""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from fields(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from fields(v, f"{path}[{i}]")
    else:
        yield path, value

daemon = normal(json.load(open(sys.argv[1])), sys.argv[2])
driver = normal(json.load(open(sys.argv[3])), sys.argv[4])
if len(daemon) != 1 or len(driver) != 1:
    sys.exit(f"FAIL: expected one device each: daemon {daemon}, driver {driver}")
a, b = dict(fields(daemon[0])), dict(fields(driver[0]))
diff = [f"{k}: daemon {a.get(k, '(absent)')!r}, driver {b.get(k, '(absent)')!r}"
        for k in sorted(set(a) | set(b)) if a.get(k, None) != b.get(k, None) or (k in a) != (k in b)]
if diff:
    sys.exit("FAIL: the daemon's and the driver's JSON differ:\n  " + "\n  ".join(diff))
if len(a) < 20:
    sys.exit(f"FAIL: only {len(a)} fields compared: {a}")
print(f"{len(a)} fields alike")
PY
echo PASS
