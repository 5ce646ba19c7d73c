#!/usr/bin/env bash
# Runs clang-tidy's checks (.clang-tidy says which and why) on softblk's
# sources under src/; any finding fails (exit 1). scripts/test.sh runs it
# in its format stage.
#   scripts/tidy.sh [FILE...]     only these files (default: every src/ file
#                                 the build compiles)
# It configures a build tree of its own (build-tidy/, no unity build, so
# that each file is checked as written) for the compile commands, and uses
# Debian 12's clang-tidy-19: clang 14's cannot parse libstdc++ 12's
# <expected>, which needs C++20 concepts as clang 19 has them.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tidy=${CLANG_TIDY:-clang-tidy-19}
clang=${CLANG:-clang++-19}
for p in "$tidy" "$clang"; do
  if ! command -v "$p" >/dev/null; then
    echo "tidy: $p is not installed (apt-get install clang-tidy-19 clang-19, or run" \
      "scripts/install-deps.sh)" >&2
    exit 2
  fi
done
dir="$repo/build-tidy"
if ! cmake -S "$repo" -B "$dir" -G Ninja -DCMAKE_UNITY_BUILD=OFF -DCMAKE_BUILD_TYPE=Release \
  >"$dir.configure.log" 2>&1; then
  echo "tidy: configuring $dir failed (see $dir.configure.log)" >&2
  exit 2
fi
rm -f "$dir.configure.log"
if (($#)); then
  files=("$@")
else
  files=("$repo/src/")
fi
# Files whose last check was clean and whose preprocessed input has not
# changed since are not checked again (tidy_files.py says how); the stamps
# live in ~/.cache/softblk/tidy (or $SOFTBLK_TIDY_CACHE).
cache=${SOFTBLK_TIDY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/softblk/tidy}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if python3 "$repo/scripts/tidy_files.py" --tidy "$(command -v "$tidy")" --clang "$(command -v "$clang")" \
  --db "$dir" --config "$repo/.clang-tidy" --cache "$cache" --root "$repo" --jobs "$(nproc)" "${files[@]}" >"$out" 2>&1; then
  echo "tidy: no findings in ${files[*]#"$repo/"} ($(tail -n1 "$out" | sed 's/^tidy: //'))"
  exit 0
fi
grep -E -A3 '(warning|error): ' "$out" | grep -v -E '^[0-9]+ warnings? (and [0-9]+ errors? )?generated' | head -200
tail -n1 "$out"
echo "tidy: findings above (checks and why: .clang-tidy)" >&2
exit 1
