#!/usr/bin/env bash
# softblk's whole test suite, the README's second command
# (`./scripts/test.sh`, as root or any user; .ci/run calls it). Installs the
# Debian packages (through sudo when not root, only if some are missing),
# builds everything (build/, Release, Ninja), runs every test with CTest
# (two at a time, a timeout on each) and prints a summary: passed, failed,
# and skipped with the reason, both whole tests (exit 77) and GoogleTest
# cases (GTEST_SKIP). Exits non-zero when a test fails or the build does.
# Tests that need root (loop devices, mounts) skip when run without it.
# Extra arguments go to ctest (e.g. -L cli, -R daemon).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
build=$repo/build

"$repo/scripts/install-deps.sh"
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
ninja -C "$build" -j"$(nproc)"

log=$build/ctest-output.log
start=$SECONDS
set +e
ctest --test-dir "$build" --output-on-failure -j2 --timeout 600 "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e

echo
echo "================================================================ summary"
grep -E '^[0-9]+% tests passed' "$log" || echo "ctest did not finish (status $rc)"
if grep -q 'The following tests did not run' "$log"; then
  echo "skipped tests:"
  sed -n '/The following tests did not run/,/^$/p' "$log" | grep -E '^\s+[0-9]+ - ' | sed 's/^\s*/  /'
fi
last=$build/Testing/Temporary/LastTest.log
if [ -f "$last" ] && grep -qE '^\[  SKIPPED \] .*\([0-9]+ ms\)' "$last"; then
  echo "skipped GoogleTest cases (GTEST_SKIP):"
  grep -E '^\[  SKIPPED \] .*\([0-9]+ ms\)' "$last" | sed 's/^\[  SKIPPED \] /  /' | sort -u
fi
# The reasons scripts give for exit 77 ("SKIP: needs root").
if [ -f "$last" ] && grep -qE '^SKIP: ' "$last"; then
  echo "skip reasons:"
  grep -E '^SKIP: ' "$last" | sort | uniq -c | sed 's/^ */  /'
fi
if grep -q 'The following tests FAILED' "$log"; then
  echo "failed tests:"
  sed -n '/The following tests FAILED/,/^$/p' "$log" | grep -E '^\s+[0-9]+ - ' | sed 's/^\s*/  /'
fi
echo "tests took $((SECONDS - start)) s; full output in $log"
exit "$rc"
