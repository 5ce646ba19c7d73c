#!/usr/bin/env bash
# `softblk bench`: the driver is found from the build tree and lists the
# plans; an unknown plan or a bad option is refused (exit 2) before
# anything runs; a SOFTBLK_BENCH_DRIVER that is not there is an error, not
# a silent fallback; a plan that needs root says so.
set -euo pipefail
softblk=${1:?usage: bench_cli.sh SOFTBLK}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$softblk" bench --list >"$out/list" || fail "softblk bench --list exited with $?"
for plan in rnull nullblk-4k zloop fat exports file core smoke; do
  grep -q "^  $plan " "$out/list" || fail "--list lacks $plan: $(cat "$out/list")"
done
rc=0; "$softblk" bench no-such-plan 2>"$out/err" || rc=$?
[ "$rc" = 2 ] || fail "unknown plan: exit $rc, not 2"
grep -q "unknown plan 'no-such-plan'" "$out/err" && grep -q "^  exports " "$out/err" ||
  fail "unknown plan: $(cat "$out/err")"

rc=0; "$softblk" bench core --rounds 0 --out "$out/results" 2>"$out/err" || rc=$?
[ "$rc" = 2 ] || fail "--rounds 0: exit $rc, not 2"
[ ! -e "$out/results" ] || fail "a refused command line wrote results"

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
