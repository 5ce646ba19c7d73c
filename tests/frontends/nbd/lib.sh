# Shared helpers for the NBD host tests (sourced). Each test gets its own
# directory and NBD servers (softblk-driver --export nbd) that are stopped
# on exit, pass or fail.
set -euo pipefail

: "${SOFTBLK_DRIVER:?set SOFTBLK_DRIVER to softblk-driver (src/driver)}"
work=$(mktemp -d /tmp/softblk-nbd-test.XXXXXX)
server_pids=()

cleanup() {
  local p
  for p in "${server_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${server_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# Inline python in the tests imports the raw-socket helpers of nbd_raw.py;
# no __pycache__ is left in the source tree.
PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH PYTHONDONTWRITEBYTECODE=1

skip() { echo "SKIP: $*"; exit 77; }
fail() {
  echo "FAIL: $*" >&2
  # A test that failed with a daemon says whether it still ran and what it
  # logged last (a crash, a refused request): the work directory goes away.
  if [ -n "${SOFTBLK_RUN_DIR:-}" ] && [ -f "$SOFTBLK_RUN_DIR/daemon.log" ]; then
    local pid
    pid=$(cat "$SOFTBLK_RUN_DIR/daemon.pid" 2>/dev/null) || true
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      echo "daemon $pid still runs; the end of its log:" >&2
    else
      echo "daemon ${pid:-?} is gone; the end of its log:" >&2
    fi
    tail -20 "$SOFTBLK_RUN_DIR/daemon.log" | sed 's/^/  | /' >&2
  fi
  exit 1
}
need() { local t; for t in "$@"; do command -v "$t" >/dev/null || skip "$t not installed"; done; }

# fio saves a write job's verify state (local-JOB-N-verify.state) in the
# current directory: run it in this test's directory, which goes with it.
fio() { (cd "$work" && command fio "$@"); }

# nbd_driver ARGS...: softblk-driver serving NBD in this test's directory,
# in the foreground (a start that must fail).
nbd_driver() { "$SOFTBLK_DRIVER" --export nbd --run-dir "$work" "$@"; }

# start_server NAME [driver args...]: runs the driver with its output in
# $work/NAME.out; sets SERVER_PID and waits for "ready". The driver is
# started here, not through nbd_driver: in the background a function runs
# in a subshell, whose pid is not the server's (a signal to it would leave
# the server running).
start_server() {
  local name=$1; shift
  "$SOFTBLK_DRIVER" --export nbd --run-dir "$work" "$@" >"$work/$name.out" 2>"$work/$name.err" &
  SERVER_PID=$!
  server_pids+=("$SERVER_PID")
  local i
  for i in $(seq 200); do
    grep -qx ready "$work/$name.out" 2>/dev/null && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$work/$name.err" >&2; fail "server $name exited"; }
    sleep 0.05
  done
  fail "server $name not ready"
}

# uri_of NAME EXPORT [key]: the URI the driver printed for EXPORT.
uri_of() {
  python3 -c 'import json,sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        j = json.loads(line)
        if j["name"] == sys.argv[2]:
            print(j[sys.argv[3]])' "$work/$1.out" "$2" "${3:-uri}"
}

# server_alive PID: the process still runs (not crashed, not exited).
server_alive() { kill -0 "$1" 2>/dev/null; }

# The softblk daemon (SOFTBLK_CLI) in a run directory of this test's own.
# sb ARGS...: one CLI command with a time limit, so that a hung daemon fails
# the test instead of blocking it (exit 124 on timeout). use_daemon sets up
# the run directory and makes cleanup stop the daemon, by pid, even when it
# no longer answers.
sb() { timeout "${SB_TIMEOUT:-20}" "$SOFTBLK_CLI" "$@"; }
daemon_pid() { cat "$SOFTBLK_RUN_DIR/daemon.pid" 2>/dev/null; }
use_daemon() {
  [ -n "${SOFTBLK_CLI:-}" ] && [ -x "$SOFTBLK_CLI" ] || skip "the softblk CLI is not built"
  export SOFTBLK_RUN_DIR="$work/run"
  mkdir -p "$SOFTBLK_RUN_DIR"
  trap 'stop_daemon; cleanup' EXIT
}
stop_daemon() {
  local pid
  pid=$(daemon_pid) || true
  SB_TIMEOUT=10 sb del --all >/dev/null 2>&1 || true
  SB_TIMEOUT=10 sb shutdown >/dev/null 2>&1 || true
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    sleep 1
    kill -9 "$pid" 2>/dev/null || true
  fi
}
# daemon_sockets: how many sockets the daemon holds open.
daemon_sockets() { ls -l "/proc/$(daemon_pid)/fd" 2>/dev/null | grep -c 'socket:' || true; }
# daemon_rss_mib: the daemon's resident memory in MiB.
daemon_rss_mib() { awk '/^VmRSS/ {print int($2 / 1024)}' "/proc/$(daemon_pid)/status"; }
