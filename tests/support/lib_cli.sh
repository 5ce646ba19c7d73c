# Shared helpers of the CLI's host tests (sourced, not run): a private run
# directory per test (SOFTBLK_RUN_DIR), and a trap that, however the test
# ends, kills the daemons it started (by pid), unmounts what is mounted on
# their loop devices, detaches those loop devices, unmounts the FUSE mounts
# below the run directory and removes it.
# The sourcing script sets `softblk` to the executable first.

set -euo pipefail

skip() { echo "SKIP: $*"; exit 77; }
note() { echo "== $*"; }

# Skips unless root with /dev/fuse, /dev/loop-control and the given tools.
require_root_fuse() {
  [ "$(id -u)" -eq 0 ] || skip "needs root (FUSE mounts, loop devices)"
  [ -c /dev/fuse ] || skip "no /dev/fuse"
  [ -e /dev/loop-control ] || skip "no /dev/loop-control"
  local tool
  for tool in jq losetup findmnt "$@"; do
    command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/install-deps.sh)"
  done
}

run_dir=""
pids=()
extra_cleanup=()

remember_daemon() {
  if [ -n "$run_dir" ] && [ -s "$run_dir/daemon.pid" ]; then pids+=("$(cat "$run_dir/daemon.pid")"); fi
}

# Loop devices whose backing file lies in the run directory.
our_loops() {
  losetup --list --raw --noheadings -O NAME,BACK-FILE 2>/dev/null |
    awk -v d="$run_dir/" 'index($2, d) == 1 {print $1}'
}
mounts() { findmnt -rn -o TARGET | grep -c "^$run_dir/" || true; }
loops() { our_loops | wc -l; }

cleanup_cli() {
  local rc=$?
  set +e
  local cmd pid loop m
  for cmd in "${extra_cleanup[@]}"; do eval "$cmd"; done
  remember_daemon
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  sleep 0.5
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  for loop in $(our_loops); do
    for m in $(awk -v l="$loop" '$1 == l {print $2}' /proc/self/mounts); do umount -l "$m"; done
    losetup -d "$loop"
  done
  findmnt -rn -o TARGET | grep "^$run_dir/" | sort -r | while read -r m; do umount -l "$m"; done
  rm -rf "$run_dir"
  exit $rc
}

# Creates the private run directory (mode 0700) and installs the trap.
setup_run_dir() {
  run_dir=$(mktemp -d "/tmp/softblk-${1:-cli}.XXXXXX")
  export SOFTBLK_RUN_DIR=$run_dir
  trap cleanup_cli EXIT
  trap 'exit 130' INT TERM
}

fail() {
  echo "FAIL: $*" >&2
  if [ -n "$run_dir" ] && [ -f "$run_dir/daemon.log" ]; then tail -20 "$run_dir/daemon.log" >&2; fi
  exit 1
}

# A field of device $1 in `list --json` (a jq path, e.g. .export.loop).
field() { "$softblk" list --json | jq -r --arg n "$1" ".[] | select(.name == \$n) | $2"; }

# True while process $1 runs (a zombie counts as gone).
alive() { kill -0 "$1" 2>/dev/null && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }

# Waits up to $2 seconds for process $1 to end; false if it still runs.
wait_gone() {
  local i
  for i in $(seq $(($2 * 10))); do alive "$1" || return 0; sleep 0.1; done
  ! alive "$1"
}

# Milliseconds since the epoch.
now_ms() { date +%s%3N; }
