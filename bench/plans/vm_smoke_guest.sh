#!/bin/bash
# softblk bench smoke's one VM boot (runs inside tests/vm/run-vm): the code
# paths of the VM lab's plans, rnull (and nullblk-4k, the same script with
# one cell) and zloop, side by side in one boot instead of one boot each.
# Each part runs as its own script (their traps clean up their devices;
# their devices, run directories and files do not overlap) with its output
# in a file, printed whole when the part ends, bracketed by lines the
# driver splits the output on:
#   SMOKE-PART-BEGIN NAME
#   SMOKE-PART-END NAME STATUS    (the part's exit status; 77: skipped)
# Side by side because most of a part's time under TCG is waiting (fio's
# timed runs, a device appearing) and starting programs, which the two
# vCPUs overlap: the boot is smoke's longest path (docs/bench.md).
# Arguments: the files' guest paths, then each part's own:
#   vm_smoke_guest.sh RNULL_SCRIPT ZLOOP_SCRIPT -- RNULL-ARGS...
# zloop's settings come in the environment (run-vm --env), as for the
# zloop plan. Exit status: 1 when a part failed, 77 when both skipped.
set -uo pipefail
. /softblk-vm/lib.sh
[ $# -ge 3 ] && [ "$3" = -- ] || vm_fail "usage: vm_smoke_guest.sh RNULL_SCRIPT ZLOOP_SCRIPT -- RNULL-ARGS..."
rnull=$1 zloop=$2
shift 3
declare -A pid_of=()
part() {
  local name=$1
  shift
  (
    vm_step "part $name started"
    echo "SMOKE-PART-BEGIN $name"
    rc=0
    bash "$@" || rc=$?
    vm_step "part $name ended"
    echo "SMOKE-PART-END $name $rc"
    exit "$rc"
  ) >"/tmp/smoke-part-$name.out" 2>&1 &
  pid_of[$name]=$!
}
part rnull "$rnull" "$@"
part zloop "$zloop"
statuses=()
while [ ${#pid_of[@]} -gt 0 ]; do  # each part's output as soon as it ends
  for name in "${!pid_of[@]}"; do
    kill -0 "${pid_of[$name]}" 2>/dev/null && continue
    rc=0
    wait "${pid_of[$name]}" || rc=$?
    cat "/tmp/smoke-part-$name.out"
    statuses+=("$rc")
    unset "pid_of[$name]"
  done
  [ ${#pid_of[@]} -eq 0 ] || sleep 0.2
done
for rc in "${statuses[@]}"; do
  [ "$rc" = 0 ] || [ "$rc" = 77 ] || vm_fail "a part failed (SMOKE-PART-END above)"
done
[ "${statuses[*]}" != "77 77" ] || vm_skip "every part skipped (SKIP lines above)"
echo PASS
