# Helpers for VM tests; a test sources it with
#   . /softblk-vm/lib.sh
# It works in busybox sh and in bash. Exit statuses follow liburing and
# automake: 0 pass, 77 skip, anything else fail.

vm_step() { echo "== [$(cut -d" " -f1 /proc/uptime) s] $*"; }
vm_skip() { echo "SKIP: $*"; exit 77; }
vm_fail() { echo "FAIL: $*"; exit 1; }

# vm_require_tool NAME...: skips unless every program is in the image.
vm_require_tool() {
  for _t in "$@"; do
    command -v "$_t" >/dev/null 2>&1 || vm_skip "$_t is not in the VM image"
  done
}

# vm_require_module NAME [PARAM=VALUE...]: loads a module or skips.
vm_require_module() {
  _out=$(modprobe "$@" 2>&1) || vm_skip "cannot load module $1: $_out"
}

# vm_expect_eq WHAT ACTUAL EXPECTED: fails with a message when they differ.
vm_expect_eq() {
  if [ "$2" != "$3" ]; then vm_fail "$1: got '$2', expected '$3'"; fi
  echo "ok: $1 = $2"
}

# vm_wait_for PATH [SECONDS]: waits until PATH exists (device nodes appear
# through devtmpfs; there is no udev). Fails after SECONDS (default 10).
vm_wait_for() {
  _n=$(( ${2:-10} * 10 ))
  while [ ! -e "$1" ]; do
    _n=$((_n - 1))
    [ "$_n" -gt 0 ] || vm_fail "$1 did not appear"
    sleep 0.1
  done
}

# vm_null_blk_create NAME ATTR=VALUE...: makes a null_blk device through
# configfs (null_blk's own attribute names and units: size in MiB,
# blocksize, memory_backed, irqmode, hw_queue_depth, zoned, zone_size ...),
# powers it on and waits for /dev/NAME. Loads null_blk with nr_devices=0
# first so that no default device appears.
vm_null_blk_create() {
  _name=$1; shift
  if [ ! -d /sys/kernel/config/nullb ]; then
    vm_require_module null_blk nr_devices=0
  fi
  _dir=/sys/kernel/config/nullb/$_name
  mkdir "$_dir" || vm_fail "cannot create $_dir"
  for _kv in "$@"; do
    echo "${_kv#*=}" >"$_dir/${_kv%%=*}" || vm_fail "null_blk $_name: cannot set ${_kv}"
  done
  echo 1 >"$_dir/power" || vm_fail "null_blk $_name: cannot power on"
  vm_wait_for "/dev/$_name"
}

# vm_null_blk_remove NAME: powers off and removes a configfs null_blk.
vm_null_blk_remove() {
  echo 0 >"/sys/kernel/config/nullb/$1/power" 2>/dev/null
  rmdir "/sys/kernel/config/nullb/$1"
}

# vm_wait_io DEV [COUNT] [SECONDS]: waits until the block device DEV has
# completed at least COUNT (default 64) requests since it appeared, i.e.
# until a load started in the background really runs on it (a program
# started with `&` may not have opened the device yet). Fails after SECONDS
# (default 30).
vm_wait_io() {
  _stat=/sys/block/${1#/dev/}/stat
  _n=$(( ${3:-30} * 10 ))
  while :; do
    if [ -r "$_stat" ]; then
      _done=$(awk '{print $1 + $5}' "$_stat")
      [ "$_done" -ge "${2:-64}" ] && return 0
    fi
    _n=$((_n - 1))
    [ "$_n" -gt 0 ] || vm_fail "no I/O on $1 after ${3:-30} s (did the load start?)"
    sleep 0.1
  done
}

# vm_zloop_check_files REPORT DIR: checks zloop zone files against a
# `blkzone report` saved in REPORT (of a device whose files are DIR/cnv-*,
# DIR/seq-*, e.g. after the device is gone): every sequential zone's file
# size is its write pointer (blkzone prints sectors), and a full zone's
# file holds its whole capacity. Fails on the first mismatch.
vm_zloop_check_files() {
  while read -r _line; do
    _start=$(echo "$_line" | sed -n 's/.*start: 0x\([0-9a-f]*\),.*/\1/p')
    _len=$(echo "$_line" | sed -n 's/.*len 0x\([0-9a-f]*\),.*/\1/p')
    _cap=$(echo "$_line" | sed -n 's/.*cap 0x\([0-9a-f]*\),.*/\1/p')
    _wptr=$(echo "$_line" | sed -n 's/.*wptr 0x\([0-9a-f]*\) .*/\1/p')
    _cond=$(echo "$_line" | sed -n 's/.*zcond: *\([0-9]*\).*/\1/p')
    _type=$(echo "$_line" | sed -n 's/.*type: *\([0-9]*\).*/\1/p')
    [ -n "$_start" ] && [ "$_type" = 2 ] || continue
    _f=$(printf '%s/seq-%06d' "$2" $(( 0x$_start / 0x$_len )))
    _size=$(stat -c %s "$_f")
    if [ "$_cond" = 14 ]; then
      vm_expect_eq "$_f (full)" "$_size" $(( 0x$_cap * 512 ))
    else
      vm_expect_eq "$_f" "$_size" $(( 0x$_wptr * 512 ))
    fi
  done <"$1"
}
