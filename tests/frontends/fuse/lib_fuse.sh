# Shared helpers of the FUSE host tests (sourced, not run). Each test gets
# its own run directory and its own daemon; on exit, whatever happens, the
# trap deletes the devices, detaches loop devices backed by files in the
# run directory, unmounts what is mounted below it and kills the daemon.
#
# The daemon is the `softblk` CLI's (path in $SOFTBLK_CLI, set by CTest
# when the CLI is built; SOFTBLK_RUN_DIR points it at the test's run
# directory), or else softblk-driver --export fuse ($SOFTBLK_DRIVER, from
# src/driver), which creates devices in-process and exports them with the
# "fuse" export type, taking commands on a FIFO. The helpers below hide the
# difference.

set -euo pipefail

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
note() { echo "== $*"; }

require_host() {
    [ "$(id -u)" -eq 0 ] || skip "needs root (FUSE allow_other, loop devices)"
    [ -c /dev/fuse ] || skip "/dev/fuse is missing"
    [ -c /dev/loop-control ] || skip "/dev/loop-control is missing"
    if [ -n "${SOFTBLK_CLI:-}" ]; then
        [ -x "$SOFTBLK_CLI" ] || skip "SOFTBLK_CLI=$SOFTBLK_CLI is not executable"
    else
        [ -n "${SOFTBLK_DRIVER:-}" ] && [ -x "$SOFTBLK_DRIVER" ] ||
            skip "neither SOFTBLK_CLI nor SOFTBLK_DRIVER names a built daemon"
    fi
    local tool
    for tool in "$@"; do
        command -v "$tool" >/dev/null || skip "$tool is not installed (scripts/install-deps.sh)"
    done
}

RUN_DIR=""
DAEMON_PID=""
REPLY_LINE=""

cleanup_host() {
    local rc=$?
    set +e
    if [ -n "${SOFTBLK_CLI:-}" ] && [ -n "$RUN_DIR" ]; then
        DAEMON_PID=$(cat "$RUN_DIR/daemon.pid" 2>/dev/null || true)
        if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
            timeout 20 "$SOFTBLK_CLI" del --all >/dev/null 2>&1
            timeout 20 "$SOFTBLK_CLI" shutdown >/dev/null 2>&1
            for _ in $(seq 100); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
            kill -9 "$DAEMON_PID" 2>/dev/null
        fi
    elif [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
        echo quit >&7 2>/dev/null
        exec 7>&- 2>/dev/null
        for _ in $(seq 100); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$DAEMON_PID" 2>/dev/null
        wait "$DAEMON_PID" 2>/dev/null
    fi
    if [ -n "$RUN_DIR" ]; then
        # Anything mounted from our loop devices, then the loop devices,
        # then the FUSE mounts.
        local loop m
        for loop in $(losetup -nO NAME,BACK-FILE 2>/dev/null | awk -v d="$RUN_DIR/" 'index($2, d) == 1 {print $1}'); do
            for m in $(awk -v l="$loop" '$1 == l {print $2}' /proc/self/mounts); do umount -l "$m"; done
            losetup -d "$loop"
        done
        for m in $(awk -v d="$RUN_DIR/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r); do
            umount -l "$m"
        done
        rm -rf "$RUN_DIR"
    fi
    exit $rc
}

# fio saves a write job's verify state (local-JOB-N-verify.state) in the
# current directory: run it in the test's run directory, which goes with it.
fio() { (cd "${RUN_DIR:?start_daemon first}" && command fio "$@"); }

# Starts the daemon with a fresh run directory.
start_daemon() {
    RUN_DIR=$(mktemp -d /tmp/softblk-host.XXXXXX)
    trap cleanup_host EXIT
    trap 'exit 130' INT TERM
    launch_daemon
    # A first command starts the CLI's daemon (the driver is up already).
    sb list
}

# Starts a daemon on the existing run directory (after a crash). The CLI
# starts its daemon by itself on the next command.
launch_daemon() {
    if [ -n "${SOFTBLK_CLI:-}" ]; then
        export SOFTBLK_RUN_DIR=$RUN_DIR
        return 0
    fi
    rm -f "$RUN_DIR/cmd" "$RUN_DIR/reply"
    mkfifo "$RUN_DIR/cmd" "$RUN_DIR/reply"
    "$SOFTBLK_DRIVER" --export fuse --run-dir "$RUN_DIR" --commands \
        <"$RUN_DIR/cmd" >"$RUN_DIR/reply" 2>"$RUN_DIR/daemon.log" &
    DAEMON_PID=$!
    exec 7>"$RUN_DIR/cmd"
    exec 8<"$RUN_DIR/reply"
    # The driver says "ready" once it has cleaned up after a dead one.
    local line=""
    read -r -t 60 line <&8 || true
    [ "$line" = ready ] || fail "driver not ready: '$line' (log: $(cat "$RUN_DIR/daemon.log"))"
}

# Sends one command; the answer line (without "ok ") lands in REPLY_LINE.
# Fails the test on "error ..." unless called as `sb_try`.
sb_try() {
    if [ -n "${SOFTBLK_CLI:-}" ]; then
        cli_command "$@"
        return
    fi
    echo "$*" >&7
    if ! read -r -t 60 REPLY_LINE <&8; then
        fail "daemon did not answer '$*' (log: $(cat "$RUN_DIR/daemon.log"))"
    fi
    case "$REPLY_LINE" in
        ok*) REPLY_LINE=${REPLY_LINE#ok}; REPLY_LINE=${REPLY_LINE# }; return 0 ;;
        *) return 1 ;;
    esac
}
sb() { sb_try "$@" || fail "'$*' failed: $REPLY_LINE"; }

# The driver's commands through the CLI. `add` answers with a flat JSON
# object like the driver's, so the tests read it the same way.
cli_command() {
    local out rc=0
    case "$1" in
        add)
            local name=$2 args=() export_args=() after=0 word
            for word in "${@:4}"; do
                if [ "$word" = -- ]; then after=1
                elif [ $after = 1 ]; then export_args+=(--export-opt "$word")
                else args+=("$word"); fi
            done
            out=$("$SOFTBLK_CLI" add "$3" "${args[@]}" --export fuse "${export_args[@]}" --name "$name" 2>&1) || rc=$?
            if [ $rc = 0 ]; then
                REPLY_LINE=$(awk '$1 == "loop:" {l = $2} $1 == "file:" {f = $2}
                    END {printf "{\"file\":\"%s\",\"loop\":\"%s\"}", f, l}' <<<"$out")
            fi ;;
        del) out=$("$SOFTBLK_CLI" del "$2" 2>&1) || rc=$? ;;
        list) out=$("$SOFTBLK_CLI" list --json 2>&1) || rc=$?; REPLY_LINE=$out ;;
        cleanup) out=$("$SOFTBLK_CLI" list 2>&1) || rc=$? ;;
        crash)
            DAEMON_PID=$(cat "$RUN_DIR/daemon.pid")
            kill -9 "$DAEMON_PID"
            for _ in $(seq 100); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.05; done
            return 0 ;;
        *) fail "unknown command $1" ;;
    esac
    [ $rc = 0 ] || REPLY_LINE=$out
    if [ $rc = 0 ] && [ "$1" != add ] && [ "$1" != list ]; then REPLY_LINE=""; fi
    # The daemon starts with the first command.
    DAEMON_PID=$(cat "$RUN_DIR/daemon.pid" 2>/dev/null || true)
    return $rc
}

# sb_add NAME [device options] [-- export options]: prints the loop device.
sb_add() {
    sb add "$1" null "${@:2}"
    json_field loop
}

# A string field of the last answer's JSON object (flat, as the driver
# prints it).
json_field() {
    sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p" <<<"$REPLY_LINE"
}

# Mounts, loop devices and directories the run directory still has.
leftovers() {
    awk -v d="$RUN_DIR/" 'index($2, d) == 1 {print "mount " $2}' /proc/self/mounts
    losetup -nO NAME,BACK-FILE 2>/dev/null | awk -v d="$RUN_DIR/" 'index($2, d) == 1 {print "loop " $1 " " $2}'
    if [ -d "$RUN_DIR/fuse" ]; then
        find "$RUN_DIR/fuse" -mindepth 1 -maxdepth 1 -printf 'dir %p\n'
    fi
}

daemon_threads() { awk '/^Threads:/ {print $2}' "/proc/$DAEMON_PID/status"; }
daemon_rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$DAEMON_PID/status"; }
