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
#   call SOCKET    the same four requests (add, set, get, del) sent to the
#                  daemon's control socket (src/cli/protocol.hpp) over one
#                  connection, through a relay (python3) between two fifos
#                  and the socket: what `softblk set`/`get` send, without a
#                  process start per request (some 3,000 for the table)
# Options: --kernel   expect the kernel column (the table's own result
#                     where docs/null.md records no difference; rows of
#                     softblk's own attributes are skipped)
#          --no-faults  skip the fault-injection rows (a kernel built
#                     without CONFIG_BLK_DEV_NULL_BLK_FAULT_INJECTION)
#          --only REGEX  only rows whose attribute matches
# Exit status 0 when every row matches, 1 otherwise. POSIX sh (the VM
# lab's is busybox); the tree needs dd, call needs python3 (host only).
# Usage: nullb_limits.sh TABLE tree ROOT|set SOFTBLK|call SOCKET [--kernel] [--no-faults] [--only REGEX]
set -u
table=${1:?usage: $0 TABLE tree ROOT|set SOFTBLK|call SOCKET [--kernel] [--no-faults] [--only REGEX]}
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
case $mode in tree | set | call) ;; *) echo "mode is tree, set or call" >&2; exit 2 ;; esac

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

# call mode: a relay between two fifos and the control socket, the shell's
# fd 3 (requests) and fd 4 (replies); closing fd 3 ends it. The daemon
# answers a connection's requests in order, one line each.
if [ "$mode" = call ]; then
  fifos=$(mktemp -d /tmp/softblk-limits.XXXXXX) || exit 1
  mkfifo "$fifos/req" "$fifos/rep" || exit 1
  python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
replies = s.makefile("rb")
for line in sys.stdin.buffer:
    s.sendall(line)
    sys.stdout.buffer.write(replies.readline())
    sys.stdout.buffer.flush()
' "$target" <"$fifos/req" >"$fifos/rep" &
  relay=$!
  exec 3>"$fifos/req" 4<"$fifos/rep"
  trap 'exec 3>&-; wait $relay; rm -rf "$fifos"' EXIT
fi
id=0

# call METHOD PARAMS: sends one request (PARAMS a JSON object); sets reply
# to the reply's line. Exits when the relay or the daemon is gone.
call() {
  id=$((id + 1))
  printf '{"id":%d,"method":"%s","params":%s}\n' "$id" "$1" "$2" >&3
  if ! IFS= read -r reply <&4; then
    echo "call: no reply to $1 $2: the relay or the daemon ended"
    exit 1
  fi
}

# reply_errno: sets r to the errno's name of the reply (negative errno in
# error.code, as `softblk set --json` names it), 0 for a result.
reply_errno() {
  case $reply in
  "{\"id\":$id,\"result\":"*) r=0 ;;
  '{"error":{"code":-'*"},\"id\":$id}")
    r=${reply#'{"error":{"code":-'}
    case ${r%%,*} in
    1) r=EPERM ;;
    2) r=ENOENT ;;
    5) r=EIO ;;
    12) r=ENOMEM ;;
    13) r=EACCES ;;
    16) r=EBUSY ;;
    17) r=EEXIST ;;
    19) r=ENODEV ;;
    22) r=EINVAL ;;
    34) r=ERANGE ;;
    95) r=EOPNOTSUPP ;;
    *) r="'$reply'" ;;
    esac
    ;;
  *) r="'$reply'" ;;
  esac
}

# json_strings WORD...: sets js to the words as a JSON array of strings;
# false for a word with a quote or backslash (the table has none).
json_strings() {
  js=
  for w in "$@"; do
    case $w in *[\"\\]*) return 1 ;; esac
    js="$js${js:+,}\"$w\""
  done
  js="[$js]"
}

# set_options NAME KEY=VALUE...: one set request (as `softblk set` sends
# it: written in order, stopping at the first error); sets r as put does.
set_options() {
  name=$1
  shift
  if ! json_strings "$@"; then
    r="unsendable: $*"
    return
  fi
  call set "{\"name\":\"$name\",\"options\":$js,\"force\":false}"
  reply_errno
}

# make NAME: a powered-off device with the defaults.
make_dev() {
  case $mode in
  tree) mkdir "$target/$1" ;;
  set) "$target" add null power=0 --export none --name "$1" >/dev/null ;;
  call)
    call add "{\"type\":\"null\",\"name\":\"$1\",\"options\":[\"power=0\"],\"export\":\"none\"}"
    reply_errno
    [ "$r" = 0 ] || echo "add $1: $reply"
    [ "$r" = 0 ]
    ;;
  esac
}

drop_dev() {
  case $mode in
  tree) rmdir "$target/$1" ;;
  set) "$target" del "$1" >/dev/null ;;
  call)
    call del "{\"name\":\"$1\"}"
    reply_errno
    [ "$r" = 0 ]
    ;;
  esac
}

# put NAME ATTR VALUE: sets r to the errno's name, 0 on success. The tree
# gets the value and its newline in one write(2): dd reads the
# here-document, which the shell has written before dd starts, in one read.
put() {
  case $mode in
  tree)
    err=$(dd of="$target/$1/$2" bs=4096 conv=notrunc status=none 2>&1 <<EOF
$3
EOF
    )
    # strerror's text: what follows the last ": ".
    errno_name "${err##*: }"
    ;;
  set)
    out=$("$target" set "$1" "$2=$3" --json 2>/dev/null) && { r=0; return; }
    name=$(printf '%s\n' "$out" | sed -n 's/^ *"name": "\(E[A-Z0-9]*\)".*/\1/p')
    r=${name:-"'$out'"}
    ;;
  call) set_options "$1" "$2=$3" ;;
  esac
}

# get NAME ATTR: sets r to the value as cat shows it, lines joined with |.
# The tree's file is read by the shell's read (no process: the VM lab's
# kernel run reads some 450 values).
get() {
  case $mode in
  tree)
    r=
    { while IFS= read -r line || [ -n "$line" ]; do r="$r$line|"; done <"$target/$1/$2"; } 2>/dev/null ||
      r="cannot read $2"
    ;;
  set) r=$("$target" get "$1" "$2" 2>&1 | tr '\n' '|') ;;
  call)
    # {"id":N,"result":{...,"values":{"ATTR":"VALUE"}}}, the lines of
    # VALUE joined by \n; anything else is shown whole (a mismatch).
    call get "{\"name\":\"$1\",\"keys\":[\"$2\"]}"
    v=${reply#"{\"id\":$id,\"result\":{"*"\"values\":{\"$2\":\""}
    v=${v%'"}}}'}
    r=
    while :; do
      case $v in
      *'\n'*)
        r="$r${v%%'\n'*}|"
        v=${v#*'\n'}
        ;;
      *)
        r="$r$v"
        break
        ;;
      esac
    done
    case $r in *[\"\\]*) r="'$reply'" ;; esac
    ;;
  esac
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
  elif [ -n "$writes" ] && [ "$mode" = call ]; then
    # shellcheck disable=SC2086
    set_options "$dev" $writes
    [ "$r" = 0 ] || setup="$writes failed: $r"
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
