#!/usr/bin/env bash
# VM half of the file-target benchmark: boots Debian's 6.12 kernel under
# QEMU (tests/vm/run-vm, software emulation) once and runs vm_guest.sh:
# softblk's file target over ublk against the kernel's loop device with
# direct I/O on the same image, 4 KiB random read/write at QD 1 and 32 and
# 128 KiB sequential read/write at QD 32, median of ROUNDS rounds.
#
# usage: bench/file/vm.sh [--softblk PATH] [--runtime S] [--rounds N] [--size MiB]
#                         [--queues N] [--depth N] [--cpus N]
# The guest has --cpus CPUs (default 2: this machine's count) and 3 GiB.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
softblk=""
env=()
cpus=2
while (($#)); do
  case "$1" in
    --softblk) softblk=$2; shift 2 ;;
    --runtime) env+=(--env "RUNTIME=$2"); shift 2 ;;
    --rounds) env+=(--env "ROUNDS=$2"); shift 2 ;;
    --size) env+=(--env "SIZE_MIB=$2"); shift 2 ;;
    --queues) env+=(--env "QUEUES=$2"); shift 2 ;;
    --depth) env+=(--env "DEPTH=$2"); shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    *) echo "usage: $0 [--softblk PATH] [--runtime S] [--rounds N] [--size MiB] [--queues N] [--depth N] [--cpus N]" >&2
       exit 2 ;;
  esac
done
[ -n "$softblk" ] || softblk=$(ls -t "$root"/build*/src/cli/softblk 2>/dev/null | head -1 || true)
[ -x "$softblk" ] || { echo "softblk not found; build it or pass --softblk" >&2; exit 2; }
echo "host: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)"
exec "$root/tests/vm/run-vm" "$here/vm_guest.sh" --bin "$softblk" --mem 3072 --cpus "$cpus" --timeout 1200 "${env[@]}"
