#!/usr/bin/env bash
# Where a FUSE+loop request's CPU goes, per system, in CPU time per I/O
# (which a loaded machine disturbs far less than IOPS): the client's (fio:
# its system call, the block layer, the loop driver's queueing; from fio's
# usr+sys) and the server process's (user + system of all its threads,
# /proc/PID/stat), for softblk's null target without data, qemu-storage-
# daemon's FUSE export of null-co, and a loop device over a file in
# /dev/shm (no FUSE, no server: the loop path alone), and of the kernel's
# threads (kworkers, where the loop driver submits to the file, and
# ksoftirqd: all of theirs meanwhile, so at most what this I/O took).
# Rounds alternate the systems.
#
# usage: bench/fuse/cpu_split.sh [--driver PATH] [--rw randread|randwrite] [--jobs N]
#                                [--runtime SECONDS] [--rounds N] [--export-opts "K=V ..."]
# Needs root, /dev/fuse, /dev/loop-control, fio, qemu-storage-daemon.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/bench/common/machine.sh"
driver="" rw=randread jobs=1 runtime=3 rounds=3 eopts=""
while [ $# -gt 0 ]; do
    case "$1" in
        --driver) driver=$2; shift 2 ;;
        --rw) rw=$2; shift 2 ;;
        --jobs) jobs=$2; shift 2 ;;
        --runtime) runtime=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --export-opts) eopts=$2; shift 2 ;;
        *) echo "usage: $0 [--driver PATH] [--rw RW] [--jobs N] [--runtime S] [--rounds N] [--export-opts OPTS]" >&2; exit 2 ;;
    esac
done
[ -n "$driver" ] || driver=$(ls -t "$root"/build*/src/driver/softblk-driver 2>/dev/null | head -1 || true)
[ "$(id -u)" -eq 0 ] || { echo "needs root" >&2; exit 1; }
[ -x "$driver" ] || { echo "softblk-driver not found; build it or pass --driver" >&2; exit 1; }
for tool in fio losetup qemu-storage-daemon; do
    command -v "$tool" >/dev/null || { echo "$tool is missing (scripts/install-deps.sh)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/softblk-cpu-split.XXXXXX)
img=/dev/shm/softblk-cpu-split-$$.img
declare -A dev pid
dpid="" qpid=""
cleanup() {
    set +e
    for l in "${dev[@]}"; do losetup -d "$l"; done
    [ -z "$dpid" ] || { echo quit >&7; wait "$dpid"; }
    umount "$work/q" 2>/dev/null || umount -l "$work/q" 2>/dev/null
    [ -z "$qpid" ] || { kill "$qpid"; wait "$qpid"; }
    rm -f "$img"
    rm -rf "$work"
}
trap cleanup EXIT

machine_line
mkfifo "$work/cmd" "$work/reply"
"$driver" --export fuse --commands --run-dir "$work/run" <"$work/cmd" >"$work/reply" 2>"$work/log" &
dpid=$!
exec 7>"$work/cmd" 8<"$work/reply"
read -r answer <&8
[ "$answer" = ready ] || { echo "driver: $answer $(cat "$work/log")" >&2; exit 1; }
echo "add b null size=256 memory_backed=0 blocksize=4096 -- loop=0 $eopts" >&7
read -r answer <&8
case "$answer" in ok*) ;; *) echo "softblk: $answer" >&2; exit 1 ;; esac
touch "$work/q"
qemu-storage-daemon --blockdev driver=null-co,node-name=n0,size=268435456 \
    --export "type=fuse,id=e0,node-name=n0,mountpoint=$work/q,writable=on" 2>"$work/qsd.log" &
qpid=$!
for _ in $(seq 100); do grep -q " $work/q " /proc/self/mounts && break; sleep 0.1; done
truncate -s 256M "$img"
attach() { losetup --direct-io=on --sector-size 4096 --show -f "$1"; }
dev[softblk]=$(attach "$work/run/fuse/b/b"); pid[softblk]=$dpid
dev[qsd]=$(attach "$work/q"); pid[qsd]=$qpid
dev[shm-loop]=$(attach "$img"); pid[shm-loop]=""
ticks() { if [ -n "$1" ]; then awk '{print $14 + $15}' "/proc/$1/stat"; else echo 0; fi; }
# The kernel's own threads (the loop driver's kworkers, ksoftirqd): CPU
# they spend for anyone meanwhile, an upper bound of their work for us.
kernel_ticks() {
    local t=0 f comm
    for f in /proc/[0-9]*/stat; do
        read -r comm < <(cut -d' ' -f2 "$f" 2>/dev/null) || continue
        case "$comm" in "(kworker"*|"(ksoftirqd"*) t=$((t + $(awk '{print $14 + $15}' "$f" 2>/dev/null || echo 0))) ;; esac
    done
    echo $t
}
tick_us=$((1000000 / $(getconf CLK_TCK)))
echo "fio psync 4 KiB $rw, $jobs job(s), ${runtime} s per run; softblk export options: ${eopts:-defaults}"
for round in $(seq "$rounds"); do
    for s in softblk qsd shm-loop; do
        k0=$(kernel_ticks)
        t0=$(ticks "${pid[$s]}")
        out=$(fio --name=split --filename="${dev[$s]}" --ioengine=psync --direct=1 --bs=4k --rw="$rw" \
            --numjobs="$jobs" --size=256m --time_based --runtime="$runtime" --group_reporting \
            --output-format=terse --terse-version=3)
        t1=$(ticks "${pid[$s]}")
        k1=$(kernel_ticks)
        # terse v3: 6/47 KiB read/written, 8/49 IOPS, 88/89 usr/sys CPU %
        # (of one job's runtime, summed over the jobs).
        awk -F';' -v s="$s" -v r="$round" -v t=$((t1 - t0)) -v k=$((k1 - k0)) -v tick="$tick_us" -v secs="$runtime" \
            -v jobs="$jobs" -v load="$(cut -d' ' -f1 /proc/loadavg)" '{
            ios = ($6 + $47) / 4
            printf "round %d %-9s IOPS %7d  client CPU/IO %5.1f us  server CPU/IO %5.1f us  kernel threads CPU/IO <= %5.1f us  load %s\n",
                r, s, $8 + $49, ($88 + $89) / 100 * secs * jobs * 1e6 / ios, t * tick / ios, k * tick / ios, load
        }' <<<"$out"
    done
done
