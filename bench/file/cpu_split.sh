#!/usr/bin/env bash
# What bounds `softblk bench file` (softblk's file target over FUSE+loop
# against the kernel's loop device on the same kind of image): per I/O,
# the CPU of each party and the context switches, which a loaded machine
# disturbs far less than IOPS. Both devices are loop devices with direct I/O
# and 4 KiB sectors; "softblk" is the loop device over softblk's FUSE file
# (default options), whose daemon reads the image in /dev/shm, "loop" is
# a loop device over a copy of the image. Rounds alternate the systems.
# Per system and round:
#   IOPS
#   client CPU/IO    fio's usr+sys: the system call, block layer, loop queueing
#   server CPU/IO    softblk's daemon, all threads (/proc/PID/stat); loop has none
#   kthreads CPU/IO  kworkers and ksoftirqd meanwhile (the loop driver
#                    submits from a kworker): an upper bound, others' too
#   fio cs/IO        fio's context switches per I/O (terse field 90)
#   server cs/IO     the daemon's threads' context switches per I/O
#                    (voluntary + involuntary, /proc/PID/task/*/status)
# With --perf, one more softblk run with the daemon's threads under
# `perf record -g -p`, and its samples by object and symbol.
#
# usage: bench/file/cpu_split.sh [--softblk PATH] [--rw randread|randwrite] [--jobs N]
#                                [--runtime S] [--rounds N] [--size MiB] [--perf]
# Needs root, /dev/fuse, /dev/loop-control, fio.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/bench/common/machine.sh"
softblk="" rw=randread jobs=1 runtime=3 rounds=3 size=256 perf=0
while [ $# -gt 0 ]; do
    case "$1" in
        --softblk) softblk=$2; shift 2 ;;
        --rw) rw=$2; shift 2 ;;
        --jobs) jobs=$2; shift 2 ;;
        --runtime) runtime=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --size) size=$2; shift 2 ;;
        --perf) perf=1; shift ;;
        *) echo "usage: $0 [--softblk PATH] [--rw RW] [--jobs N] [--runtime S] [--rounds N] [--size MiB] [--perf]" >&2; exit 2 ;;
    esac
done
[ -n "$softblk" ] || softblk=$(ls -t "$root"/build*/src/cli/softblk 2>/dev/null | head -1 || true)
[ "$(id -u)" -eq 0 ] || { echo "needs root (loop devices, FUSE)" >&2; exit 1; }
[ -x "$softblk" ] || { echo "softblk not found; build it (ninja softblk) or pass --softblk" >&2; exit 1; }
for tool in fio losetup; do
    command -v "$tool" >/dev/null || { echo "$tool is missing (scripts/install-deps.sh)" >&2; exit 1; }
done
((perf == 0)) || command -v perf >/dev/null || { echo "--perf needs perf (linux-perf)" >&2; exit 1; }

work=$(mktemp -d /dev/shm/softblk-file-split.XXXXXX)
export SOFTBLK_RUN_DIR=$work/run
loopdev=""
cleanup() {
    set +e
    [ -z "$loopdev" ] || losetup -d "$loopdev"
    "$softblk" del --all >/dev/null 2>&1
    "$softblk" shutdown --force >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT

machine_line
head -c $((size << 20)) /dev/urandom >"$work/base.img"
cp "$work/base.img" "$work/softblk.img"
mv "$work/base.img" "$work/loop.img"
out=$("$softblk" add file path="$work/softblk.img" bs=4096 --export fuse --name file0)
declare -A dev
dev[softblk]=$(sed -n 's/^ *loop: //p' <<<"$out")
[ -b "${dev[softblk]}" ] || { echo "softblk's FUSE export shows no loop device: $out" >&2; exit 1; }
dpid=$(cut -d' ' -f1 "$SOFTBLK_RUN_DIR/daemon.pid")
loopdev=$(losetup --direct-io=on --sector-size 4096 --show -f "$work/loop.img")
dev[loop]=$loopdev

ticks() { if [ -n "$1" ]; then awk '{print $14 + $15}' "/proc/$1/stat"; else echo 0; fi; }
switches() {
    if [ -z "$1" ]; then echo 0; return; fi
    cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^(non)?voluntary_ctxt_switches/ {n += $2} END {print n + 0}'
}
kernel_ticks() {
    local t=0 f comm
    for f in /proc/[0-9]*/stat; do
        read -r comm < <(cut -d' ' -f2 "$f" 2>/dev/null) || continue
        case "$comm" in "(kworker"* | "(ksoftirqd"*) t=$((t + $(awk '{print $14 + $15}' "$f" 2>/dev/null || echo 0))) ;; esac
    done
    echo $t
}
tick_us=$((1000000 / $(getconf CLK_TCK)))
fio_run() {
    fio --name=split --filename="$1" --ioengine=psync --direct=1 --bs=4k --rw="$rw" \
        --numjobs="$jobs" --size="${size}m" --time_based --runtime="$runtime" --group_reporting \
        --output-format=terse --terse-version=3
}
echo "fio psync 4 KiB $rw, $jobs job(s), ${runtime} s per run, ${size} MiB images in /dev/shm"
for round in $(seq "$rounds"); do
    for s in softblk loop; do
        p=""
        [ "$s" = loop ] || p=$dpid
        k0=$(kernel_ticks) t0=$(ticks "$p") c0=$(switches "$p")
        res=$(fio_run "${dev[$s]}")
        t1=$(ticks "$p") c1=$(switches "$p") k1=$(kernel_ticks)
        # terse v3: 6/47 KiB read/written, 8/49 IOPS, 88/89 usr/sys CPU %
        # (of one job's runtime, summed over the jobs), 90 context switches.
        awk -F';' -v s="$s" -v r="$round" -v t=$((t1 - t0)) -v k=$((k1 - k0)) -v c=$((c1 - c0)) \
            -v tick="$tick_us" -v secs="$runtime" -v jobs="$jobs" -v load="$(cut -d' ' -f1 /proc/loadavg)" '{
            ios = ($6 + $47) / 4
            printf "round %d %-8s IOPS %7d  client CPU/IO %5.1f us  server CPU/IO %5.1f us  kthreads CPU/IO <= %5.1f us  fio cs/IO %4.2f  server cs/IO %4.2f  load %s\n",
                r, s, $8 + $49, ($88 + $89) / 100 * secs * jobs * 1e6 / ios, t * tick / ios, k * tick / ios,
                $90 / ios, c / ios, load
        }' <<<"$res"
    done
done
if ((perf)); then
    # The daemon's threads only (the machine may be shared): where its
    # CPU per request goes, by program or kernel and by symbol.
    fio_run "${dev[softblk]}" >/dev/null &
    fpid=$!
    sleep 0.5
    perf record -q -g -p "$dpid" -o "$work/perf.data" -- sleep "$(awk -v r="$runtime" 'BEGIN {print (r > 1.5) ? r - 1 : 0.5}')" \
        >/dev/null 2>&1
    wait "$fpid"
    echo "== perf record -g -p DAEMON during a softblk run: its samples by object"
    perf report -q -i "$work/perf.data" --no-children --sort dso --percent-limit 1 -g none 2>/dev/null |
        grep -v '^$' | head -8 || true
    echo "== by symbol (self, over 1.5%)"
    perf report -q -i "$work/perf.data" --no-children --sort dso,symbol --percent-limit 1.5 -g none \
        2>/dev/null | grep -v '^$' | head -25 || true
    echo "== the callers of the top kernel symbols (caller graph, over 5%)"
    perf report -q -i "$work/perf.data" --no-children --sort symbol --percent-limit 5 -g caller,0.5,callee,function,percent \
        2>/dev/null | grep -v '^$' | head -60 || true
fi
