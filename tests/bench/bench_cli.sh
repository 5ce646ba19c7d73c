#!/usr/bin/env bash
# `softblk bench`: the driver is found from the build tree and lists the
# plans; an unknown plan is refused with the list; zloop (not implemented
# yet) says which script to use (exit 2); a SOFTBLK_BENCH_DRIVER that is not there is an
# error, not a silent fallback.
set -euo pipefail
softblk=${1:?usage: bench_cli.sh SOFTBLK}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$softblk" bench --list >"$out/list" || fail "softblk bench --list exited with $?"
for plan in rnull nullblk-4k zloop fat exports file core smoke; do
  grep -q "^  $plan " "$out/list" || fail "--list lacks $plan: $(cat "$out/list")"
done
grep -q "^  zloop .*not implemented yet: use bench/zoned/vm.sh" "$out/list" ||
  fail "--list does not say zloop is not implemented"

rc=0; "$softblk" bench no-such-plan 2>"$out/err" || rc=$?
[ "$rc" = 2 ] || fail "unknown plan: exit $rc, not 2"
grep -q "unknown plan 'no-such-plan'" "$out/err" && grep -q "^  exports " "$out/err" ||
  fail "unknown plan: $(cat "$out/err")"

for plan in zloop; do
  rc=0; "$softblk" bench "$plan" --out "$out/results" 2>"$out/err" || rc=$?
  [ "$rc" = 2 ] || fail "$plan: exit $rc, not 2"
  grep -q "not implemented yet: use bench/" "$out/err" || fail "$plan: $(cat "$out/err")"
done
[ ! -e "$out/results" ] || fail "a plan that is not implemented wrote results"

rc=0; SOFTBLK_BENCH_DRIVER=$out/none "$softblk" bench core 2>"$out/err" || rc=$?
[ "$rc" = 1 ] || fail "missing driver: exit $rc, not 1"
grep -q "SOFTBLK_BENCH_DRIVER=$out/none: not an executable" "$out/err" || fail "missing driver: $(cat "$out/err")"

# Root is checked before anything runs, for the plans that need it (as
# nobody, where nobody can run softblk and read the driver).
here=$(cd "$(dirname "$0")" && pwd)
as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups "$@"; }
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1 && command -v setpriv >/dev/null &&
  as_nobody test -x "$softblk" && as_nobody test -r "$here/../../bench/plans/softblk_bench.py"; then
  chmod 0755 "$out"
  rc=0; as_nobody "$softblk" bench file --out "$out/results" 2>"$out/err" || rc=$?
  [ "$rc" = 1 ] || fail "file as nobody: exit $rc, not 1: $(cat "$out/err")"
  grep -q "softblk bench file: needs root" "$out/err" || fail "file as nobody: $(cat "$out/err")"
fi
echo "bench_cli: ok"
