#!/usr/bin/env bash
# FUSE+loop benchmark: the kernel's loop device with direct I/O over a FUSE
# file, served by softblk (null target, memory_backed=1), by
# qemu-storage-daemon's FUSE export of a raw image in tmpfs (aio=threads
# and aio=io_uring), and by nbdfuse over nbdkit's memory plugin, all in the
# same run; with --data null, devices without data: softblk's null target
# (memory_backed=0), qemu-storage-daemon's null-co and nbdkit's null
# plugin. The machine line (CPU, hypervisor, kernel) comes first. fio: psync, direct=1, 4 KiB randread and randwrite, 1 and 2
# jobs, time based, over the same size (every device written in full
# first). Prints the median IOPS per case over the rounds and the ratio of
# softblk to each peer.
#
# usage: bench/fuse/run.sh [--driver PATH] [--runtime SECONDS] [--rounds N] [--size MIB]
#                          [--device-opts "KEY=VALUE ..."] [--variant "EXPORT_OPTS"]...
#   --device-opts  null-target options added to softblk's device (default:
#              none beyond size, memory_backed=1 and blocksize=4096, so one
#              submit queue and one FUSE worker, as `softblk add` gives)
#   --driver   softblk-driver (default: the newest build*/src/driver/ of this tree),
#              or an older build's softblk-fuse-driver
#   --baseline another softblk-driver (or an older build's softblk-fuse-driver)
#              serving the same device, as one more peer in the same run: the
#              old binary against the new, under the same load
#   --variant  also measure softblk with these export options (e.g.
#              "threads=1 poll_us=50", "ring=off"), as one more system in the
#              same run; "softblk" alone is always the default configuration
#   --no-peers softblk's systems only (no qemu-storage-daemon, no nbdfuse)
#   --cases    which cases, "RW JOBS,..." (default: "randread 1,randread 2,
#              randwrite 1,randwrite 2")
#   --data     memory (default) or null: devices that keep data, or none
#   --enable-uring  switch /sys/module/fuse/parameters/enable_uring on while
#              the softblk exports are set up (they keep FUSE over io_uring
#              once they have it) and put back what it was right after: the
#              setting is the administrator's, so only when asked
# Needs root, /dev/fuse, /dev/loop-control, fio, qemu-storage-daemon,
# nbdkit, nbdfuse (the last three not with --no-peers). Leaves nothing
# mounted or attached.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/bench/common/machine.sh"
driver=""
baseline=""
runtime=5
rounds=3
size_mib=1024
variants=()
cases=("randread 1" "randread 2" "randwrite 1" "randwrite 2")
device_opts=""
no_peers=0
data=memory
enable_uring=0
uring_param=/sys/module/fuse/parameters/enable_uring
uring_before=""
while [ $# -gt 0 ]; do
    case "$1" in
        --driver) driver=$2; shift 2 ;;
        --baseline) baseline=$2; shift 2 ;;
        --runtime) runtime=$2; shift 2 ;;
        --size) size_mib=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --variant) variants+=("$2"); shift 2 ;;
        --device-opts) device_opts=$2; shift 2 ;;
        --no-peers) no_peers=1; shift ;;
        --cases) IFS=, read -r -a cases <<<"$2"; shift 2 ;;
        --enable-uring) enable_uring=1; shift ;;
        --data) data=$2; shift 2 ;;
        *) echo "usage: $0 [--driver PATH] [--runtime SECONDS] [--rounds N] [--size MIB] [--device-opts OPTS] [--variant OPTS]... [--no-peers] [--enable-uring] [--cases \"RW JOBS,...\"]" >&2; exit 2 ;;
    esac
done
if [ -z "$driver" ]; then
    driver=$(ls -t "$root"/build*/src/driver/softblk-driver 2>/dev/null | head -1 || true)
fi
[ "$data" = memory ] || [ "$data" = null ] || { echo "--data: memory or null" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "needs root" >&2; exit 1; }
[ -x "$driver" ] || { echo "softblk-driver not found; build it or pass --driver" >&2; exit 1; }
tools=(fio losetup fusermount3)
[ "$no_peers" = 1 ] || tools+=(qemu-storage-daemon nbdkit nbdfuse)
for tool in "${tools[@]}"; do
    command -v "$tool" >/dev/null || { echo "$tool is missing (scripts/install-deps.sh)" >&2; exit 1; }
done
if [ "$enable_uring" = 1 ]; then
    [ -w "$uring_param" ] || { echo "$uring_param: no FUSE over io_uring in this kernel" >&2; exit 1; }
    uring_before=$(cat "$uring_param")
fi

work=$(mktemp -d /tmp/softblk-bench-fuse.XXXXXX)
pids=()
cleanup() {
    set +e
    [ -z "$uring_before" ] || echo "$uring_before" >"$uring_param"
    for l in $(losetup -nO NAME,BACK-FILE | awk -v d="$work/" 'index($2, d) == 1 {print $1}'); do
        losetup -d "$l"
    done
    [ -e "$work/cmd" ] && { echo quit >&7; exec 7>&-; } 2>/dev/null
    [ -e "$work/base-cmd" ] && { echo quit >&5; exec 5>&-; } 2>/dev/null
    for m in $(awk -v d="$work/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r); do
        umount "$m" 2>/dev/null || umount -l "$m"
    done
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    [ -f "$work/nbdkit.pid" ] && kill "$(cat "$work/nbdkit.pid")" 2>/dev/null
    rm -f /dev/shm/softblk-bench-qsd-*.img
    rm -rf "$work"
}
trap cleanup EXIT

size=$((size_mib << 20))
attach() {  # attach FILE: prints the loop device, checks direct I/O
    local l
    l=$(losetup --direct-io=on --sector-size 4096 --show -f "$1")
    [ "$(cat "/sys/block/${l#/dev/}/loop/dio")" = 1 ] || { echo "$l: no direct I/O" >&2; exit 1; }
    # The same data on every device: a written device, not a sparse one.
    dd if=/dev/zero of="$l" bs=1M count="$size_mib" oflag=direct status=none
    echo "$l"
}

declare -A device
# The server processes of each system: their CPU time per I/O (user +
# system, all threads; the loop driver's kernel work is the same for all and
# not counted) says how much each spends on a request, whatever the load.
declare -A server
cpu_ticks() { local t=0 p; for p in $1; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }

# Every export is set up first; then each case runs on every system in
# turn, `rounds` times, and the median per system is reported. On a shared
# machine the load drifts: interleaving keeps the comparison fair.
# start_driver PATH NAME IN OUT: runs a driver on fifos NAME-cmd/NAME-reply
# with the command stream on descriptor IN and its answers on OUT (set up
# by the caller), sets DRIVER_PID, adds the bench device. The
# softblk-fuse-driver of builds before softblk-driver replaced it takes
# commands without being asked and says no "ready".
start_driver() {
    local path=$1 name=$2 in=$3 out=$4 answer how=(--export fuse --commands)
    [ "$(basename "$path")" != softblk-fuse-driver ] || how=()
    "$path" "${how[@]}" --run-dir "$work/$name" <"$work/$name-cmd" >"$work/$name-reply" \
        2>"$work/$name.log" &
    DRIVER_PID=$!
    pids+=($!)
    eval "exec $in>\"\$work/\$name-cmd\" $out<\"\$work/\$name-reply\""
    if [ ${#how[@]} -gt 0 ]; then
        read -r answer <&"$out"
        [ "$answer" = ready ] || { echo "$path: $answer $(cat "$work/$name.log")" >&2; exit 1; }
    fi
    echo "add bench null size=$size_mib $backed blocksize=4096 $device_opts -- loop=0" >&"$in"
    read -r answer <&"$out"
    case "$answer" in ok*) ;; *) echo "$path: $answer" >&2; exit 1 ;; esac
}

machine_line
backed=$([ "$data" = memory ] && echo memory_backed=1 || echo memory_backed=0)
[ "$enable_uring" = 0 ] || echo Y >"$uring_param"
echo "== softblk (null $backed $device_opts)" >&2
mkfifo "$work/softblk-cmd" "$work/softblk-reply"
ln -s softblk-cmd "$work/cmd"
start_driver "$driver" softblk 7 8
server[softblk]=$DRIVER_PID
device[softblk]=$(attach "$work/softblk/fuse/bench/bench")
if [ -n "$baseline" ]; then
    echo "== baseline: $baseline" >&2
    mkfifo "$work/base-cmd" "$work/base-reply"
    start_driver "$baseline" base 5 6
    server[baseline]=$DRIVER_PID
    device[baseline]=$(attach "$work/base/fuse/bench/bench")
fi
softblk_systems=(softblk)
for i in "${!variants[@]}"; do
    # Same driver process, one more device with other export options.
    echo "add bench$i null size=$size_mib $backed blocksize=4096 $device_opts -- loop=0 ${variants[$i]}" >&7
    read -r answer <&8
    case "$answer" in ok*) ;; *) echo "softblk variant '${variants[$i]}': $answer" >&2; exit 1 ;; esac
    name="softblk[$(tr ' ' ',' <<<"${variants[$i]}")]"
    device[$name]=$(attach "$work/softblk/fuse/bench$i/bench$i")
    server[$name]=${server[softblk]}
    softblk_systems+=("$name")
done

if [ -n "$uring_before" ]; then
    echo "$uring_before" >"$uring_param"
    uring_before=""
fi

qsd_export() {  # qsd_export NAME BLOCKDEV: a FUSE export of qemu-storage-daemon
    local name=$1 blockdev=$2
    echo "== qemu-storage-daemon ($blockdev, FUSE export)" >&2
    touch "$work/$name"
    qemu-storage-daemon --blockdev "$blockdev" \
        --export "type=fuse,id=e0,node-name=n0,mountpoint=$work/$name,writable=on" 2>"$work/$name.log" &
    pids+=($!)
    server[$name]=$!
    for _ in $(seq 100); do grep -q " $work/$name " /proc/self/mounts && break; sleep 0.1; done
    device[$name]=$(attach "$work/$name")
}
peers=()
if [ "$no_peers" = 0 ] && [ "$data" = memory ]; then
    for aio in threads io_uring; do
        img=/dev/shm/softblk-bench-qsd-$aio.img
        truncate -s "$size" "$img"
        qsd_export "qsd-$aio" "driver=file,node-name=n0,filename=$img,aio=$aio"
    done
    peers=(qsd-threads qsd-io_uring)
elif [ "$no_peers" = 0 ]; then
    qsd_export qsd-null "driver=null-co,node-name=n0,size=$size"
    peers=(qsd-null)
fi

if [ "$no_peers" = 0 ]; then
    plugin=$([ "$data" = memory ] && echo memory || echo null)
    echo "== nbdfuse over nbdkit $plugin" >&2
    mkdir "$work/nbd"
    nbdkit -U "$work/nbdkit.sock" --pidfile "$work/nbdkit.pid" "$plugin" size="$size"
    for _ in $(seq 100); do [ -S "$work/nbdkit.sock" ] && break; sleep 0.1; done
    nbdfuse "$work/nbd/disk" --unix "$work/nbdkit.sock" &
    pids+=($!)
    server[nbdfuse]="$! $(cat "$work/nbdkit.pid")"
    for _ in $(seq 100); do [ -e "$work/nbd/disk" ] && break; sleep 0.1; done
    device[nbdfuse]=$(attach "$work/nbd/disk")
    peers+=(nbdfuse)
fi

[ -z "$baseline" ] || peers=(baseline "${peers[@]}")
systems=("${softblk_systems[@]}" "${peers[@]}")
declare -A samples cpu_samples
tick_us=$((1000000 / $(getconf CLK_TCK)))
for round in $(seq "$rounds"); do
    for c in "${cases[@]}"; do
        read -r rw jobs <<<"$c"
        for sys in "${systems[@]}"; do
            before=$(cpu_ticks "${server[$sys]}")
            read -r v ios < <(fio --name=bench --filename="${device[$sys]}" --ioengine=psync --direct=1 --bs=4k \
                --rw="$rw" --numjobs="$jobs" --size="$size" --time_based --runtime="$runtime" \
                --group_reporting --output-format=terse --terse-version=3 |
                awk -F';' '{printf "%d %d\n", $8 + $49, ($6 + $47) / 4}')
            after=$(cpu_ticks "${server[$sys]}")
            cpu=$(awk -v t=$((after - before)) -v us="$tick_us" -v n="$ios" 'BEGIN {printf "%.1f", (n > 0) ? t * us / n : 0}')
            samples["$sys $rw $jobs"]+="$v "
            cpu_samples["$sys $rw $jobs"]+="$cpu "
            echo "  round $round $sys $rw numjobs=$jobs: $v IOPS, server CPU $cpu us/IO" >&2
        done
    done
done
median() { tr ' ' '\n' <<<"$1" | grep . | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
declare -A iops cpu_us
for k in "${!samples[@]}"; do
    iops[$k]=$(median "${samples[$k]}")
    cpu_us[$k]=$(median "${cpu_samples[$k]}")
done

declare -A width
for sys in "${systems[@]}"; do width[$sys]=$((${#sys} > 14 ? ${#sys} : 14)); done
printf '\nIOPS (median)\n%-10s %-5s' case jobs
for sys in "${systems[@]}"; do printf ' %*s' "${width[$sys]}" "$sys"; done
printf '\n'
for c in "${cases[@]}"; do
    read -r rw jobs <<<"$c"
    printf '%-10s %-5s' "$rw" "$jobs"
    for sys in "${systems[@]}"; do printf ' %*d' "${width[$sys]}" "${iops["$sys $rw $jobs"]}"; done
    printf '\n'
done
for s in "${softblk_systems[@]}"; do
    printf '\nratio %s / peer\n%-10s %-5s' "$s" case jobs
    for p in "${peers[@]}"; do printf ' %14s' "x/$p"; done
    printf '\n'
    for c in "${cases[@]}"; do
        read -r rw jobs <<<"$c"
        printf '%-10s %-5s' "$rw" "$jobs"
        for p in "${peers[@]}"; do
            awk -v s="${iops["$s $rw $jobs"]}" -v p="${iops["$p $rw $jobs"]}" 'BEGIN {printf " %14.2f", (p > 0) ? s / p : 0}'
        done
        printf '\n'
    done
done
printf '\nserver CPU per I/O (us, median)\n%-10s %-5s' case jobs
for sys in "${systems[@]}"; do printf ' %*s' "${width[$sys]}" "$sys"; done
printf '\n'
for c in "${cases[@]}"; do
    read -r rw jobs <<<"$c"
    printf '%-10s %-5s' "$rw" "$jobs"
    for sys in "${systems[@]}"; do printf ' %*s' "${width[$sys]}" "${cpu_us["$sys $rw $jobs"]}"; done
    printf '\n'
done
# What softblk's exports chose (ring, poll window, worker count) and why.
echo list >&7
read -r answer <&8
printf '\nsoftblk exports at the end\n'
python3 - "${answer#ok }" <<'PY'
import json, sys
for name, e in sorted(json.loads(sys.argv[1])["exports"].items()):
    p = e.get("poll", {})
    w = e.get("workers", {})
    print(f"  {name}: ring {e.get('ring', '?')}; poll_us {e.get('poll_us')} ({p.get('mode')}: {p.get('why')}); "
          f"threads {e.get('threads')} ({w.get('mode')}: {w.get('why')})")
PY
printf '\nload average at the end: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
