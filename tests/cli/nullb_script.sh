#!/bin/sh
# A null_blk configfs session as scripts (blktests among them) write it,
# run against a configfs-shaped directory: the kernel's
# /sys/kernel/config/nullb or softblk's `softblk nullb mount` tree. It
# prints a transcript (each write's result as the errno text the shell
# reports, each read's value, the data checks) that the callers compare:
# tests/cli/nullb_tree.sh with nullb_expected.txt, the VM test
# tests/vm/tests/nullb_configfs.sh with the kernel's own transcript.
#
# Usage: nullb_script.sh ROOT NAME [--no-faults]
#   ROOT   the nullb directory; NAME a device directory to make there.
#   --no-faults  leave out the fault-injection directories (a kernel
#          built without CONFIG_BLK_DEV_NULL_BLK_FAULT_INJECTION).
# The block device of a powered-on device is DIR/device where the tree has
# one (softblk), else /dev/NAME (the kernel). POSIX sh (the VM's is
# busybox); needs dd with iflag=direct and cmp.
set -u
root=${1:?usage: $0 ROOT NAME [--no-faults]}
name=${2:?usage: $0 ROOT NAME [--no-faults]}
faults=1
[ "${3:-}" = --no-faults ] && faults=0
dir=$root/$name
work=$(mktemp -d /tmp/nullb_script.XXXXXX)
trap 'rm -rf "$work"' EXIT
# The kernel clamps submit_queues to nr_cpu_ids: the transcript says CPUS.
cpus=$(($(sed 's/.*[-,]//' /sys/devices/system/cpu/possible) + 1))

# w ATTR VALUE: one write(2) of "VALUE\n", as `echo VALUE > ATTR`, through
# dd, whose message ends in the errno's text (dash's echo says "I/O error"
# whatever the errno).
w() {
  err=$(printf '%s\n' "$2" | dd of="$dir/$1" bs=4096 conv=notrunc status=none 2>&1)
  if [ -z "$err" ]; then
    echo "write $1=$2: ok"
  else
    echo "write $1=$2: $(echo "$err" | sed 's/.*: //')"
  fi
}

# r ATTR...: the value as `cat` shows it, several lines joined with |.
r() {
  for a in "$@"; do
    v=$(cat "$dir/$a" 2>&1 | tr '\n' '|' | sed 's/|$//')
    [ "$a" = submit_queues ] && [ "$v" = "$cpus" ] && v=CPUS
    echo "read $a: $v"
  done
}

blockdev() {
  if [ -e "$dir/device" ]; then
    cat "$dir/device"
  else
    echo "/dev/$name"  # null_blk names the disk after its configfs directory
  fi
}

# io read|write BLOCK COUNT: 4 KiB direct I/O at block BLOCK of the device.
io() {
  dev=$(blockdev)
  if [ "$1" = write ]; then
    dd if="$work/pattern" of="$dev" bs=4096 seek="$2" skip="$2" count="$3" oflag=direct \
      conv=notrunc 2>/dev/null && res=ok || res=error
  else
    dd if="$dev" of="$work/back" bs=4096 skip="$2" count="$3" iflag=direct 2>/dev/null && res=ok ||
      res=error
  fi
  echo "$1 blocks $2+$3: $res"
}

# same BLOCK COUNT: what io read brought back equals the pattern there.
same() {
  dd if="$work/pattern" of="$work/want" bs=4096 skip="$1" count="$2" 2>/dev/null
  cmp -s "$work/want" "$work/back" && echo "data $1+$2: same" || echo "data $1+$2: DIFFERENT"
}

dd if=/dev/urandom of="$work/pattern" bs=4096 count=64 2>/dev/null

echo "== mkdir: a powered-off device with the defaults"
mkdir "$dir" && echo "mkdir: ok" || echo "mkdir: failed"
r power size blocksize memory_backed submit_queues poll_queues hw_queue_depth irqmode \
  completion_nsec queue_mode discard mbps cache_size home_node badblocks blocking

echo "== writes while powered off: parsed as the kernel parses them"
w size 16
w blocksize 0x1000
w hw_queue_depth 010
w memory_backed y
w discard on
w irqmode 5
w mbps 99999
w submit_queues 999
w poll_queues 9
w queue_mode 0
w blocksize x
w hw_queue_depth 4294967296
w hw_queue_depth -1
w power maybe
w nonexistent 1
r size blocksize hw_queue_depth memory_backed discard irqmode mbps submit_queues poll_queues \
  queue_mode

echo "== power on: clamps written back"
w power 1
r power irqmode mbps submit_queues poll_queues queue_mode discard blocking

echo "== while powered on: EBUSY for the attributes without an apply function"
w size 32
w blocksize 512
w memory_backed 0
w irqmode 0
w submit_queues 0
w poll_queues 5
w power 1
r size blocksize submit_queues

echo "== data, and bad blocks changed while powered on"
io write 0 16
io read 0 16
same 0 16
w badblocks +16-23
w badblocks 16-23
r badblocks
io read 2 1
io read 3 1

echo "== power off, new bad blocks, power on: the data stays"
w power 0
r power
w badblocks -16-23
w badblocks " +64-71 "
w size 32
w power 1
r power size badblocks
io read 0 8
same 0 8
io read 8 1
io read 9 7
same 9 7

if [ "$faults" = 1 ]; then
  echo "== fault injection: one file per field"
  for f in probability interval times space verbose task-filter; do r "timeout_inject/$f"; done
  w timeout_inject/probability 1000
  w timeout_inject/times -1
  w timeout_inject/times 4294967296
  w timeout_inject/interval x
  r timeout_inject/probability timeout_inject/times
  for g in requeue_inject init_hctx_fault_inject; do r "$g/probability" "$g/times"; done
fi

echo "== power off and rmdir"
w power 0
rmdir "$dir" && echo "rmdir: ok" || echo "rmdir: failed"
[ -e "$dir" ] && echo "still there" || echo "gone"

echo "== refused power ons: the clamps are written back all the same"
dir=$root/${name}b
mkdir "$dir" && echo "mkdir: ok" || echo "mkdir: failed"
w submit_queues 0
w irqmode 7
w cache_size 16
w mbps 99999
w blocksize 1536
w power 1
r power submit_queues irqmode cache_size mbps
w blocksize 4096
w queue_mode 1
w power 1
w queue_mode 2
w hw_queue_depth 0
w power 1
r power queue_mode hw_queue_depth
w hw_queue_depth 64
w completion_nsec 0x10
w home_node 999
w index 7
w power 1
r power hw_queue_depth completion_nsec home_node index
w power 0
rmdir "$dir" && echo "rmdir: ok" || echo "rmdir: failed"
