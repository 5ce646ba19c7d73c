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

# vm_bench_zone_fs FS [MOUNT_OPTS]: the zoned benchmarks' file system for
# zone files (bench/zoned/*_guest.sh): FS (ext4 or xfs) on a brd RAM disk of
# $ZONE_FS_MIB (default 768) MiB, mounted on /mnt/zl (with MOUNT_OPTS if
# given; softblk bench smoke's small devices need less). brd allocates a
# page on the first write to it, so the disk is written full first: no
# device then pays for those pages in the middle of its jobs. ext4's inode
# tables and journal are zeroed by mkfs, not by ext4lazyinit in the
# background of the first jobs.
vm_bench_zone_fs() {
  vm_require_tool "mkfs.$1"
  local mib=${ZONE_FS_MIB:-768}
  vm_require_module brd rd_nr=1 rd_size=$((mib * 1024))
  dd if=/dev/zero of=/dev/ram0 bs=1M count=$mib oflag=direct status=none
  case $1 in
    ext4) mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 /dev/ram0 ;;
    xfs) mkfs.xfs -q -f /dev/ram0 ;;
    *) vm_fail "FS=$1: ext4 or xfs" ;;
  esac
  mkdir -p /mnt/zl && mount ${2:+-o "$2"} /dev/ram0 /mnt/zl || vm_fail "cannot mount $1 on /dev/ram0"
}

# vm_zone_fs_root FS: where zone files go, in $zone_root. tmpfs (or
# nothing): /tmp; xfs or ext4: a file system of that kind made on a 512 MiB
# brd RAM disk and mounted on /mnt/zone-fs (unmounted by
# vm_zone_fs_cleanup).
vm_zone_fs_root() {
  zone_root=/tmp
  case "${1:-tmpfs}" in
    tmpfs) return ;;
    xfs | ext4) ;;
    *) vm_fail "zone file system $1: tmpfs, xfs or ext4" ;;
  esac
  vm_require_tool "mkfs.$1"
  vm_require_module brd rd_nr=1 rd_size=$((512 * 1024))
  vm_wait_for /dev/ram0
  if [ "$1" = xfs ]; then mkfs.xfs -q -f /dev/ram0; else mkfs.ext4 -q -F /dev/ram0; fi
  mkdir -p /mnt/zone-fs && mount /dev/ram0 /mnt/zone-fs || vm_fail "cannot mount $1 on /dev/ram0"
  zone_root=/mnt/zone-fs
}
vm_zone_fs_cleanup() {
  if findmnt /mnt/zone-fs >/dev/null 2>&1; then umount /mnt/zone-fs || true; fi
}

# vm_zloop_check_files REPORT DIR: checks zloop zone files against a
# `blkzone report` saved in REPORT (of a device whose files are DIR/cnv-*,
# DIR/seq-*, e.g. after the device is gone): every sequential zone's file
# size is its write pointer (blkzone prints sectors), and a full zone's
# file holds its whole capacity. Fails on the first mismatch.
vm_zloop_check_files() {
  # One sed for the whole report and one stat for all the files: a process
  # per zone costs a fifth of a second under TCG (64 zones: 15 s a check).
  sed -n 's/.*start: 0x\([0-9a-f]*\), len 0x\([0-9a-f]*\), cap 0x\([0-9a-f]*\), wptr 0x\([0-9a-f]*\) .*zcond: *\([0-9]*\).*type: *2(.*/\1 \2 \3 \4 \5/p' \
    "$1" >/tmp/.vm_zloop_zones
  [ -s /tmp/.vm_zloop_zones ] || return 0
  # Zone numbers, then file names, without a subshell per zone.
  _nums=
  while read -r _start _len _cap _wptr _cond; do
    _nums="$_nums $(( 0x$_start / 0x$_len ))"
  done </tmp/.vm_zloop_zones
  # shellcheck disable=SC2086
  printf '%06d\n' $_nums >/tmp/.vm_zloop_nums
  _files=
  while read -r _num; do _files="$_files $2/seq-$_num"; done </tmp/.vm_zloop_nums
  # shellcheck disable=SC2086
  stat -c %s $_files >/tmp/.vm_zloop_sizes || vm_fail "cannot stat the zone files in $2"
  while read -r _start _len _cap _wptr _cond && read -r _num <&3 && read -r _size <&4; do
    _f=$2/seq-$_num
    if [ "$_cond" = 14 ]; then
      vm_expect_eq "$_f (full)" "$_size" $(( 0x$_cap * 512 ))
    else
      vm_expect_eq "$_f" "$_size" $(( 0x$_wptr * 512 ))
    fi
  done </tmp/.vm_zloop_zones 3</tmp/.vm_zloop_nums 4</tmp/.vm_zloop_sizes
}

# vm_softblk_device NAME: prints the /dev/ublkbN that `softblk list` shows
# for the device NAME, asking up to 100 times 0.1 s apart (after a
# `softblk recover`, until the device is back); fails (status 1, nothing
# printed) when it never shows one.
vm_softblk_device() {
  for _ in $(seq 100); do
    _dev=$(softblk list 2>/dev/null | sed -n "s@^$1 .*\(/dev/ublkb[0-9]*\).*@\1@p" | head -n1)
    [ -n "$_dev" ] && { echo "$_dev"; return 0; }
    sleep 0.1
  done
  return 1
}

# vm_json_field KEY: KEY's first number (or true/false) in `softblk list
# --json` (for scripts that keep one device at a time).
vm_json_field() {
  # sed, not head: nothing in the pipe stops reading early (pipefail).
  softblk list --json | grep -o "\"$1\": *[a-z0-9]*" | sed -n '1s/.*: *//p'
}

# vm_median "V1 V2 ...": the median of the numbers (the mean of the two
# middle ones for an even count).
vm_median() {
  tr ' ' '\n' <<<"$1" | grep . | sort -g |
    awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

# vm_ratio A B: A / B to two places (0 when B is 0).
vm_ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", (b > 0) ? a / b : 0}'; }

# vm_add_ublk NAME ARGS...: `softblk add ARGS --name NAME --export ublk`,
# its /dev/ublkbN in $dev; fails with softblk's words when it cannot.
vm_add_ublk() {
  _name=$1
  shift
  softblk add "$@" --name "$_name" --export ublk >"/tmp/add-$_name.txt" 2>&1 ||
    vm_fail "add $_name: $(cat "/tmp/add-$_name.txt")"
  dev=$(grep -o '/dev/ublkb[0-9]*' "/tmp/add-$_name.txt" | head -n1)
  [ -b "$dev" ] || vm_fail "add $_name printed no /dev/ublkbN: $(cat "/tmp/add-$_name.txt")"
}

# vm_kill_under_writer DEV LOG BLOCKS [sequential]: one round of a crash
# test: `softblk-crash-writer write DEV LOG BLOCKS [sequential]` runs in the
# background (its pid in vm_writer_pid, for a cleanup trap) until it has
# logged a few writes, then the softblk daemon is killed with SIGKILL at a
# random moment 0.3 to 1.5 s later; returns once the writer has stopped
# (its next I/O fails when the kernel has aborted the device), after
# printing its summary. Fails when the writer still runs 10 s after the
# kill.
vm_kill_under_writer() {
  # The daemon's pid file (when it names a live process) spares a softblk
  # command, which costs about a second under TCG.
  _pid=
  [ -n "${SOFTBLK_RUN_DIR:-}" ] && read -r _pid <"$SOFTBLK_RUN_DIR/daemon.pid" 2>/dev/null
  if [ -z "$_pid" ] || ! kill -0 "$_pid" 2>/dev/null; then
    _pid=$(softblk list | sed -n 's/.* pid \([0-9]*\) .*/\1/p' | head -n1)
  fi
  [ -n "$_pid" ] || vm_fail "no daemon pid ($(softblk list))"
  _before=$(wc -l <"$2")
  softblk-crash-writer write "$@" >/tmp/writer.txt 2>&1 &
  vm_writer_pid=$!
  for _ in $(seq 100); do [ "$(wc -l <"$2")" -gt $((_before + 4)) ] && break; sleep 0.05; done
  _delay_ms=$((300 + RANDOM % 1200))
  sleep "$(printf '0.%03d' $((_delay_ms % 1000)))"
  [ $_delay_ms -ge 1000 ] && sleep 1
  kill -9 "$_pid"
  while kill -0 "$_pid" 2>/dev/null; do sleep 0.05; done
  for _ in $(seq 200); do kill -0 "$vm_writer_pid" 2>/dev/null || break; sleep 0.05; done
  kill -0 "$vm_writer_pid" 2>/dev/null && vm_fail "the writer still runs 10 s after the kill"
  wait "$vm_writer_pid" || true
  vm_writer_pid=
  cat /tmp/writer.txt
}
