#!/bin/sh
# Runs the attribute table tests/cli/nullb_limits.tsv (null_blk's configfs
# attributes at and beyond each limit, with the kernel's result) against
# one way of writing attributes, and prints every row whose errno or value
# read back differs from the expected one:
#   tree ROOT      a configfs-shaped directory: the kernel's
#                  /sys/kernel/config/nullb or `softblk nullb mount`'s tree
#                  (mkdir, one write(2) per value as `echo`, cat, rmdir)
#   set SOFTBLK    `softblk add null power=0 --export none`, `softblk set
#                  --json`, `softblk get`, `softblk del` (the daemon of
#                  SOFTBLK_RUN_DIR)
# Options: --kernel   expect the kernel column (the table's own result
#                     where docs/null.md records no difference; rows of
#                     softblk's own attributes are skipped)
#          --no-faults  skip the fault-injection rows (a kernel built
#                     without CONFIG_BLK_DEV_NULL_BLK_FAULT_INJECTION)
#          --only REGEX  only rows whose attribute matches
# Exit status 0 when every row matches, 1 otherwise. POSIX sh (the VM
# lab's is busybox); the tree needs dd.
# Usage: nullb_limits.sh TABLE tree ROOT|set SOFTBLK [--kernel] [--no-faults] [--only REGEX]
set -u
table=${1:?usage: $0 TABLE tree ROOT|set SOFTBLK [--kernel] [--no-faults] [--only REGEX]}
mode=${2:?}
target=${3:?}
shift 3
expect_kernel=0
faults=1
only=.
while [ $# -gt 0 ]; do
  case $1 in
  --kernel) expect_kernel=1 ;;
  --no-faults) faults=0 ;;
  --only) only=$2; shift ;;
  *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ "$mode" = tree ] || [ "$mode" = set ] || { echo "mode is tree or set" >&2; exit 2; }

cpus=$(($(sed 's/.*[-,]//' /sys/devices/system/cpu/possible) + 1))
nodes=$(ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null | wc -l)
[ "$nodes" -gt 0 ] || nodes=1
# Per process, so two runs (kernel and softblk) never share a name.
prefix=lim$$x

# The rows run without a subshell or pipe where a builtin does (results in
# variables): in the VM lab every fork costs some 20 ms under TCG, and the
# table has some 650 rows.

# errno_name TEXT: sets r to the errno's name from strerror's text (dd's
# message ends in it).
errno_name() {
  case $1 in
  "") r=0 ;;
  "Invalid argument") r=EINVAL ;;
  "Numerical result out of range") r=ERANGE ;;
  "Device or resource busy") r=EBUSY ;;
  "Operation not permitted") r=EPERM ;;
  "No such file or directory") r=ENOENT ;;
  "Permission denied") r=EACCES ;;
  "No such device") r=ENODEV ;;
  "Operation not supported") r=EOPNOTSUPP ;;
  "Cannot allocate memory") r=ENOMEM ;;
  "File exists") r=EEXIST ;;
  "Input/output error") r=EIO ;;
  *) r="'$1'" ;;
  esac
}

# make NAME: a powered-off device with the defaults.
make_dev() {
  if [ "$mode" = tree ]; then
    mkdir "$target/$1"
  else
    "$target" add null power=0 --export none --name "$1" >/dev/null
  fi
}

drop_dev() {
  if [ "$mode" = tree ]; then
    rmdir "$target/$1"
  else
    "$target" del "$1" >/dev/null
  fi
}

# put NAME ATTR VALUE: sets r to the errno's name, 0 on success. The tree
# gets the value and its newline in one write(2): dd reads the
# here-document, which the shell has written before dd starts, in one read.
put() {
  if [ "$mode" = tree ]; then
    err=$(dd of="$target/$1/$2" bs=4096 conv=notrunc status=none 2>&1 <<EOF
$3
EOF
    )
    # strerror's text: what follows the last ": ".
    errno_name "${err##*: }"
  else
    out=$("$target" set "$1" "$2=$3" --json 2>/dev/null) && { r=0; return; }
    name=$(printf '%s\n' "$out" | sed -n 's/^ *"name": "\(E[A-Z0-9]*\)".*/\1/p')
    r=${name:-"'$out'"}
  fi
}

# get NAME ATTR: sets r to the value as cat shows it, lines joined with |.
get() {
  if [ "$mode" = tree ]; then
    r=$(tr '\n' '|' 2>&1 <"$target/$1/$2")
  else
    r=$("$target" get "$1" "$2" 2>&1 | tr '\n' '|')
  fi
  r=${r%|}
}

tab=$(printf '\t')
rows=0
skipped=0
bad=0
n=0
while IFS=$tab read -r when attr value pre want_errno want_read kernel why; do
  case $when in '' | '#'*) continue ;; esac
  n=$((n + 1))
  if [ "$only" != . ] && ! printf '%s\n' "$attr" | grep -Eq -- "$only"; then continue; fi
  if [ "$faults" = 0 ]; then
    case $attr in *_inject/*) skipped=$((skipped + 1)); continue ;; esac
  fi
  if [ "$expect_kernel" = 1 ]; then
    case $kernel in
    skip) skipped=$((skipped + 1)); continue ;;
    =) ;;
    *) want_errno=${kernel%%/*}; want_read=${kernel#*/} ;;
    esac
  fi
  [ "$value" = '""' ] && value=
  [ "$want_read" = '""' ] && want_read=
  [ "$want_read" = CPUS ] && want_read=$cpus
  [ "$want_read" = NODES ] && want_read=$nodes
  rows=$((rows + 1))
  dev=$prefix$n
  if ! make_dev "$dev"; then
    echo "row $n: cannot make $dev"
    bad=$((bad + 1))
    continue
  fi
  setup=ok
  writes=
  if [ "$pre" != - ]; then
    old_ifs=$IFS
    IFS=,
    # shellcheck disable=SC2086
    set -- $pre
    IFS=$old_ifs
    writes="$*"
  fi
  [ "$when" = live ] && writes="$writes power=1"
  if [ -n "$writes" ] && [ "$mode" = set ]; then
    # One `set` writes them in order and stops at the first error.
    # shellcheck disable=SC2086
    "$target" set "$dev" $writes >/dev/null 2>&1 || setup="$writes failed"
  else
    for kv in $writes; do
      put "$dev" "${kv%%=*}" "${kv#*=}"
      [ "$r" = 0 ] || setup="$kv: $r"
    done
  fi
  got_errno=-
  case $when in
  new) got_errno=0 ;;
  off | live)
    put "$dev" "$attr" "$value"
    got_errno=$r
    ;;
  on)
    put "$dev" "$attr" "$value"
    if [ "$r" = 0 ]; then
      put "$dev" power 1
      got_errno=$r
    else
      got_errno="write $r"
    fi
    ;;
  esac
  got_read=-
  if [ "$want_read" != - ]; then
    get "$dev" "$attr"
    got_read=$r
  fi
  if [ "$setup" != ok ] || [ "$got_errno" != "$want_errno" ] || [ "$got_read" != "${want_read}" ]; then
    bad=$((bad + 1))
    echo "MISMATCH row $n: $when $attr='$value' (pre $pre): got $got_errno read '$got_read'," \
      "want $want_errno read '$want_read' [setup $setup] -- $why"
  fi
  drop_dev "$dev" || echo "row $n: cannot remove $dev"
done <"$table"
column=softblk
[ "$expect_kernel" = 1 ] && column=kernel
echo "nullb_limits ($mode, $column column): $rows rows, $bad mismatched, $skipped skipped"
[ "$bad" = 0 ]
