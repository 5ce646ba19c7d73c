#!/usr/bin/env bash
# Memory is a budget (docs/reliability.md, "Memory budget"), as root with
# the FUSE export: a daemon started with a 64 MiB budget hosts a 256 MiB
# memory-backed device that is written in full through its exported file.
# The writes past the budget fail with ENOSPC, the daemon stays up, a second
# device keeps serving reads and writes, `list` shows the use against the
# budget, a discard gives budget back, and a device's own memory_limit
# stops it before the daemon's budget does (through the file: ENOSPC;
# through its loop device: ENOSPC or EIO, as the kernel reports it).
# Usage: memory_budget.sh PATH/TO/softblk        (exit 77: skipped)
softblk=${1:?usage: $0 PATH/TO/softblk}
set -euo pipefail  # before the library, so that a missing one stops the test
. "$(dirname "$0")/../support/lib_cli.sh"
require_root_fuse dd fallocate cmp
setup_run_dir climem

mib=$((1 << 20))

note "a daemon with a 64 MiB budget"
"$softblk" daemon --memory-limit 64M
remember_daemon
daemon=$(cat "$run_dir/daemon.pid")
[ "$("$softblk" status --json | jq .memory.limit_bytes)" -eq $((64 * mib)) ] ||
  fail "status does not show the 64 MiB budget: $("$softblk" status --json)"

"$softblk" add null memory_backed=1 discard=1 size=256 bs=4096 --export fuse --export-opt loop=0 --name big >/dev/null
"$softblk" add null memory_backed=1 size=32 bs=4096 --export fuse --export-opt loop=0 --name small >/dev/null
big=$(field big .export.file)
small=$(field small .export.file)
[ -f "$big" ] && [ -f "$small" ] || fail "no exported files"

pattern=$run_dir/pattern
head -c $((4 * mib)) /dev/urandom >"$pattern"
dd if="$pattern" of="$small" bs=1M oflag=direct conv=notrunc status=none || fail "cannot write small"

note "write the 256 MiB device in full: ENOSPC past the budget"
set +e
err=$(dd if=/dev/zero of="$big" bs=1M count=256 oflag=direct conv=notrunc 2>&1)
rc=$?
set -e
echo "$err" | tail -3
[ "$rc" -ne 0 ] || fail "writing 256 MiB under a 64 MiB budget succeeded"
grep -q "No space left on device" <<<"$err" || fail "the failed write is not ENOSPC: $err"
written=$(awk '/bytes/ && /copied/ {print $1}' <<<"$err")
echo "written before ENOSPC: $((written / mib)) MiB"
[ "$written" -ge $((48 * mib)) ] && [ "$written" -le $((64 * mib)) ] ||
  fail "expected 48..64 MiB written before ENOSPC, got $written bytes"
alive "$daemon" || fail "the daemon died"

note "the daemon and the other device keep serving"
"$softblk" status >/dev/null || fail "status failed"
cmp <(head -c $((4 * mib)) "$small") "$pattern" || fail "small lost its data"
# Rewriting pages it holds needs no new memory.
head -c $((4 * mib)) /dev/urandom >"$pattern"
dd if="$pattern" of="$small" bs=1M oflag=direct conv=notrunc status=none || fail "small refused a rewrite"
cmp <(head -c $((4 * mib)) "$small") "$pattern" || fail "small did not keep the rewrite"

note "list shows the use against the budget"
"$softblk" list
json=$("$softblk" list --json)
used_big=$(jq -r '.[] | select(.name == "big") | .memory.used_bytes' <<<"$json")
daemon_used=$(jq -r '.[0].memory.daemon_used_bytes' <<<"$json")
daemon_limit=$(jq -r '.[0].memory.daemon_limit_bytes' <<<"$json")
[ "$used_big" -ge $((48 * mib)) ] || fail "big's memory.used_bytes is $used_big"
[ "$daemon_limit" -eq $((64 * mib)) ] || fail "daemon_limit_bytes is $daemon_limit"
[ "$daemon_used" -le "$daemon_limit" ] || fail "the daemon uses $daemon_used of $daemon_limit"
"$softblk" list | grep -q "of 64.0 MiB" || fail "the list table does not show the budget"
# What the store's chunks are (huge_pages) and why.
chunks=$(jq -c '.[] | select(.name == "big") | .memory.chunks' <<<"$json")
case "$(jq -r .kind <<<"$chunks")" in huge | small | measuring) ;; *)
  fail "list --json has no memory.chunks.kind for big: $chunks" ;;
esac
[ -n "$(jq -r '.why // empty' <<<"$chunks")" ] || fail "memory.chunks says no why: $chunks"
[ "$("$softblk" status --json | jq .memory.used_bytes)" -eq "$daemon_used" ] ||
  fail "status and list disagree on the memory used"

note "a discard gives budget back"
fallocate --punch-hole --keep-size --offset 0 --length $((32 * mib)) "$big"
after=$(field big .memory.used_bytes)
echo "big: $((used_big / mib)) MiB before the discard, $((after / mib)) MiB after"
# The store keeps freed pages for reuse up to 1/8 of the smallest limit over
# it (the 64 MiB budget: 8 MiB) and gives the rest back.
[ "$after" -le $((used_big - 24 * mib)) ] || fail "discarding 32 MiB freed only $(((used_big - after) / mib)) MiB"
dd if=/dev/urandom of="$small" bs=1M count=16 seek=8 oflag=direct conv=notrunc status=none ||
  fail "small cannot use the budget the discard freed"

note "a device's own memory_limit"
"$softblk" del big small >/dev/null
"$softblk" add null memory_backed=1 size=64 memory_limit=8 bs=4096 --export fuse --export-opt loop=0 --name capped >/dev/null
capped=$(field capped .export.file)
set +e
err=$(dd if=/dev/zero of="$capped" bs=1M count=32 oflag=direct conv=notrunc 2>&1)
rc=$?
set -e
[ "$rc" -ne 0 ] && grep -q "No space left on device" <<<"$err" || fail "memory_limit=8 did not stop a 32 MiB write: $err"
written=$(awk '/bytes/ && /copied/ {print $1}' <<<"$err")
[ "$written" -ge $((6 * mib)) ] && [ "$written" -le $((8 * mib)) ] || fail "memory_limit=8 let $written bytes through"
[ "$(field capped .memory.limit_bytes)" -eq $((8 * mib)) ] || fail "list does not show memory_limit"

note "through a loop device the kernel sees the failed writes (ENOSPC or EIO)"
"$softblk" add null memory_backed=1 size=64 memory_limit=8 bs=4096 --export fuse --name looped >/dev/null
loop=$(field looped .export.loop)
[ -b "$loop" ] || fail "looped has no loop device"
set +e
err=$(dd if=/dev/zero of="$loop" bs=1M count=32 oflag=direct 2>&1)
rc=$?
set -e
[ "$rc" -ne 0 ] && grep -Eq "No space left on device|Input/output error" <<<"$err" ||
  fail "a 32 MiB write to $loop under memory_limit=8 did not fail with ENOSPC or EIO: $err"
alive "$daemon" || fail "the daemon died"
dd if="$loop" of=/dev/null bs=1M count=4 iflag=direct status=none || fail "$loop no longer reads"
set +e
err=$("$softblk" add null memory_limit=8 size=64 --export none 2>&1)
rc=$?
set -e
[ "$rc" -ne 0 ] && grep -q "memory_limit=8" <<<"$err" || fail "memory_limit without memory_backed was accepted: $err"

"$softblk" del --all >/dev/null
"$softblk" shutdown >/dev/null
wait_gone "$daemon" 20 || fail "daemon still runs after shutdown"
echo PASS
