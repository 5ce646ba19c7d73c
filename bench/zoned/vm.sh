#!/usr/bin/env bash
# VM half of the zoned benchmark: boots Debian's 6.12 kernel (or with
# --kernel backports trixie-backports' 7.3) under QEMU (tests/vm/run-vm,
# software emulation) once and runs vm_guest.sh: the
# workloads of the published zloop-against-ublk comparison with
# fio --zonemode=zbd, on the kernel's null_blk (zoned, memory-backed) and
# softblk's zoned null device over ublk (the same geometry), with 1 and 2
# queues, and softblk's zloop target over ublk on ext4 on a RAM disk. The
# kernel's zloop is not in Debian's kernels: with --kernel backports run-vm
# builds zloop.ko out of tree (--module zloop, tests/vm/zloop-ko.sh) and
# the kernel's zloop on the same ext4 is the zloop target's peer.
# --guest affinity|one|auto|spin runs option_guest.sh instead: softblk's
# zloop with and without an export option (queue_affinity=1, one or auto
# against 0; idle_spin=auto against idle_spin=0) beside the kernel's zloop
# (needs backports); --queues N
# (default 2) sets the queues of its devices. --fs xfs puts the zone files
# of both zloops on XFS instead of ext4.
#
# usage: bench/zoned/vm.sh [--softblk PATH] [--runtime S] [--rounds N] [--cpus N]
#                          [--kernel 6.12|backports] [--guest affinity|one|auto|spin] [--queues N]
#                          [--fs ext4|xfs]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
softblk=""
env=()
cpus=2
guest=vm_guest.sh
kernel=(--kernel 6.12)
while (($#)); do
  case "$1" in
    --softblk) softblk=$2; shift 2 ;;
    --runtime) env+=(--env "RUNTIME=$2"); shift 2 ;;
    --rounds) env+=(--env "ROUNDS=$2"); shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --guest) guest=option_guest.sh
             case "$2" in
               affinity) env+=(--env OPT=queue_affinity=1 --env BASE=queue_affinity=0) ;;
               one) env+=(--env OPT=queue_affinity=one --env BASE=queue_affinity=0) ;;
               auto) env+=(--env OPT=queue_affinity=auto --env BASE=queue_affinity=0) ;;
               spin) env+=(--env OPT=idle_spin=auto --env BASE=idle_spin=0) ;;
               *) echo "--guest: affinity, one, auto or spin" >&2; exit 2 ;;
             esac
             shift 2 ;;
    --queues) env+=(--env "NR_QUEUES=$2"); shift 2 ;;
    --fs) env+=(--env "FS=$2"); shift 2 ;;
    --kernel) kernel=(--kernel "$2"); [ "$2" = backports ] && kernel+=(--module zloop); shift 2 ;;
    *) echo "usage: $0 [--softblk PATH] [--runtime S] [--rounds N] [--cpus N] [--kernel 6.12|backports] [--guest affinity|one|auto|spin] [--queues N] [--fs ext4|xfs]" >&2
       exit 2 ;;
  esac
done
[ -n "$softblk" ] || softblk=$(ls -t "$root"/build*/src/cli/softblk 2>/dev/null | head -1 || true)
[ -x "$softblk" ] || { echo "softblk not found; build it or pass --softblk" >&2; exit 2; }
echo "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
exec "$root/tests/vm/run-vm" "$here/$guest" --bin "$softblk" --mem 3072 --cpus "$cpus" \
  --timeout 2400 "${kernel[@]}" "${env[@]}"
