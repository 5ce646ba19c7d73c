#!/bin/bash
# softblk bench smoke's one VM boot (runs inside tests/vm/run-vm): the code
# paths of the VM lab's plans, rnull (and nullblk-4k, the same script with
# one cell) and zloop, one after the other in one boot instead of one boot
# each (side by side they took longer: 108-171 s against 79-106 s for the
# boot at load 13-18, the parts contending for the emulated vCPUs). Each
# part runs as its own script (their traps clean up their devices) and is
# bracketed by lines the driver splits the output on:
#   SMOKE-PART-BEGIN NAME
#   SMOKE-PART-END NAME STATUS    (the part's exit status; 77: skipped)
# Arguments: the files' guest paths, then each part's own:
#   vm_smoke_guest.sh RNULL_SCRIPT ZLOOP_SCRIPT -- RNULL-ARGS...
# zloop's settings come in the environment (run-vm --env), as for the
# zloop plan. Exit status: 1 when a part failed, 77 when both skipped.
set -uo pipefail
. /softblk-vm/lib.sh
[ $# -ge 3 ] && [ "$3" = -- ] || vm_fail "usage: vm_smoke_guest.sh RNULL_SCRIPT ZLOOP_SCRIPT -- RNULL-ARGS..."
rnull=$1 zloop=$2
shift 3
statuses=()
part() {
  local name=$1 rc=0
  shift
  vm_step "part $name started"  # the guest's clock: where the boot's time goes
  echo "SMOKE-PART-BEGIN $name"
  bash "$@" || rc=$?
  vm_step "part $name ended"
  echo "SMOKE-PART-END $name $rc"
  statuses+=("$rc")
}
part rnull "$rnull" "$@"
part zloop "$zloop"
for rc in "${statuses[@]}"; do
  [ "$rc" = 0 ] || [ "$rc" = 77 ] || vm_fail "a part failed (SMOKE-PART-END above)"
done
[ "${statuses[*]}" != "77 77" ] || vm_skip "every part skipped (SKIP lines above)"
echo PASS
