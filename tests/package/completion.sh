#!/usr/bin/env bash
# The generated bash completion of softblk: it registers itself, completes
# subcommands, target types, every option of a type as `softblk features
# --json` lists it (and only that type's), export types and their options,
# boolean values, flags, and device names from a running daemon, without
# starting one when none runs.
#
# Usage: completion.sh BUILD/softblk COMPLETION_FILE     (exit 77: no python3)
set -euo pipefail
softblk=$(realpath "$1")
script=$(realpath "$2")
command -v python3 >/dev/null || { echo "SKIP: needs python3 to read softblk features --json"; exit 77; }

run_dir=$(mktemp -d /tmp/softblk-completion.XXXXXX)
export SOFTBLK_RUN_DIR=$run_dir
cleanup() {
  local pid
  pid=$(cat "$run_dir/daemon.pid" 2>/dev/null || true)
  "$softblk" shutdown --force >/dev/null 2>&1 || true
  [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  rm -rf "$run_dir"
}
trap cleanup EXIT

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# complete WORD...: what the completion offers for the command line WORD...
# whose last word is the one being completed (bash's own split: '=' is a
# word of its own), one candidate a line, sorted.
complete_words() {
  bash --norc --noprofile -c '
    source "$1"; shift
    COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
    COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
    _softblk
    printf "%s\n" "${COMPREPLY[@]}"' _ "$script" "$@" | sed '/^$/d' | sort
}
expect() {  # expect "WANTED" WORD...: the candidates, space-separated
  local want=$1 got
  shift
  got=$(complete_words "$@" | tr '\n' ' ' | sed 's/ $//')
  if [ "$got" != "$want" ]; then
    fail "${*}<TAB>: want '$want', got '$got'"
  fi
}

# It registers itself for softblk.
reg=$(bash --norc --noprofile -c 'source "$1" && complete -p softblk' _ "$script")
[ "$reg" = "complete -F _softblk softblk" ] || fail "complete -p softblk: '$reg'"

expect "add apply" softblk a
expect "null" softblk add nu
expect "zloop zloop-ram" softblk add zl
expect "report reset" softblk zone re
expect "mount" softblk nullb m
expect "mkdir mkfs mount mv" softblk fat m
expect "fuse" softblk add null --export f
expect "threads=" softblk add null --export fuse --export-opt th
expect "0 1" softblk add null memory_backed = ""
expect "1" softblk add null memory_backed = 1
expect "null" softblk features nu
# Flags of the command being completed (here `add`), after other words too.
expect "--memory-backed" softblk add null size=4 --mem
expect "--all" softblk del --a
# apply and save (softblk-devices.d(5)): their flags; --config-dir a directory.
expect "--dry-run" softblk apply --dr
expect "--config-dir" softblk save --con
mkdir -p "$run_dir/conf.d"
expect "$run_dir/conf.d" softblk apply --config-dir "$run_dir/conf"

# Every option of a type, and no other's: the candidates after
# `softblk add TYPE` against `softblk features --json`.
features=$("$softblk" features --json)
for type in $(python3 -c 'import json,sys; print(" ".join(t["name"] for t in json.load(sys.stdin)["targets"]))' <<<"$features"); do
  want=$(python3 -c '
import json, sys
t = next(t for t in json.load(sys.stdin)["targets"] if t["name"] == sys.argv[1])
print("\n".join(sorted({n + "=" for o in t["options"] for n in [o["name"]] + ([o["alias"]] if o.get("alias") else [])})))' "$type" <<<"$features")
  got=$(complete_words softblk add "$type" "")
  if [ "$got" != "$want" ]; then
    fail "softblk add $type <TAB> differs from its options in features --json:"
    diff <(echo "$want") <(echo "$got") | head -10 || true
  fi
done
expect "memory_backed= memory_limit=" softblk add null mem

# Device names come from the daemon, and only when one runs: no daemon is
# started by pressing TAB.
expect "" "$softblk" del ""
if "$softblk" status >/dev/null 2>&1; then
  fail "completing a device name started a daemon"
fi
"$softblk" add null size=16 --name tabdev --export none >/dev/null
"$softblk" add zloop-ram --name tabzoned --export none >/dev/null
expect "tabdev tabzoned" "$softblk" del ""
expect "tabzoned" "$softblk" zone report tabz
expect "tabdev" "$softblk" set tabd
expect "tabdev" "$softblk" save tabd

if ((failures)); then
  echo "$failures completion case(s) failed"
  exit 1
fi
echo "bash completion: subcommands, types, options of every type, exports, values, devices"
