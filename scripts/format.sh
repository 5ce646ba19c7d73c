#!/usr/bin/env bash
# Formats softblk's C and C++ sources with the repository's .clang-format.
#   scripts/format.sh                  format every tracked source file in place
#   scripts/format.sh --check          change nothing: list the files that are not
#                                      formatted (with the first lines of the
#                                      difference) and exit 1 if there are any
#   scripts/format.sh [--check] FILE...  only these files
# The files are those git tracks (*.c, *.cpp, *.h, *.hpp), or every such file
# below the checkout when it is not a git checkout. CI (scripts/test.sh) runs
# --check on the whole tree, which takes a few seconds.
#
# clang-format's output changes between major versions, so this uses Debian
# 12's clang-format-14 (scripts/install-deps.sh installs it) and refuses any
# other major version: set CLANG_FORMAT to a clang-format 14 elsewhere.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
k_major=14
check=0
files=()
while (($#)); do
  case $1 in
    --check) check=1 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "format: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) files+=("$1") ;;
  esac
  shift
done

clang_format=${CLANG_FORMAT:-}
if [ -z "$clang_format" ]; then
  for c in clang-format-$k_major clang-format; do
    if command -v "$c" >/dev/null; then clang_format=$c; break; fi
  done
fi
if [ -z "$clang_format" ] || ! command -v "$clang_format" >/dev/null; then
  echo "format: clang-format-$k_major is not installed (apt-get install clang-format-$k_major," \
    "or run scripts/install-deps.sh)" >&2
  exit 2
fi
version=$("$clang_format" --version)
major=$(sed -nE 's/.*clang-format version ([0-9]+)\..*/\1/p' <<<"$version")
if [ "$major" != "$k_major" ]; then
  echo "format: $clang_format is version ${major:-unknown} ($version); the tree is formatted" \
    "with clang-format $k_major, whose output differs: install clang-format-$k_major or set" \
    "CLANG_FORMAT" >&2
  exit 2
fi

cd "$repo"
if ((${#files[@]} == 0)); then
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    mapfile -t files < <(git ls-files -- '*.c' '*.cpp' '*.h' '*.hpp')
  else
    mapfile -t files < <(find . -path './build*' -prune -o -type f \
      \( -name '*.c' -o -name '*.cpp' -o -name '*.h' -o -name '*.hpp' \) -print | sed 's|^\./||' | sort)
  fi
fi

if ((!check)); then
  printf '%s\0' "${files[@]}" | xargs -0 -r -n 32 -P "$(nproc)" "$clang_format" -i --style=file
  echo "format: formatted ${#files[@]} files with $clang_format"
  exit 0
fi

# One --dry-run pass over all files (a second or two), then a diff of the
# few that differ.
mapfile -t bad < <(printf '%s\0' "${files[@]}" |
  xargs -0 -r -n 64 -P "$(nproc)" "$clang_format" --style=file --dry-run 2>&1 |
  sed -nE 's/^(.+):[0-9]+:[0-9]+: (warning|error): code should be clang-formatted.*/\1/p' | sort -u)
if ((${#bad[@]} == 0)); then
  echo "format: ${#files[@]} files formatted as .clang-format says ($clang_format)"
  exit 0
fi
echo "format: ${#bad[@]} of ${#files[@]} files are not formatted (fix: scripts/format.sh ${bad[*]}):"
for f in "${bad[@]}"; do
  echo "--- $f"
  # diff exits 1 on a difference: not the end of the listing (pipefail).
  "$clang_format" --style=file "$f" | diff -u "$f" - | sed -n '3,14p' || true
done
exit 1
