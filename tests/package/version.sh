#!/usr/bin/env bash
# `--version` of softblk, softblk-driver and softblk-fat: the program's name,
# the project's VERSION and the commit of the source tree (git describe at
# build time), exit status 0.
#
# Usage: version.sh VERSION SOURCE_DIR BUILD/softblk BUILD/softblk-driver BUILD/softblk-fat
set -euo pipefail
version=$1 source_dir=$2
shift 2
commit=
if git -C "$source_dir" rev-parse --show-toplevel >/dev/null 2>&1 &&
  [ "$(realpath "$(git -C "$source_dir" rev-parse --show-toplevel)")" = "$(realpath "$source_dir")" ]; then
  commit=$(git -C "$source_dir" describe --always --tags)
fi
status=0
for program in "$@"; do
  name=$(basename "$program")
  rc=0
  out=$("$program" --version 2>&1) || rc=$?
  if ((rc != 0)); then
    echo "FAIL: $name --version exited with $rc: $out"
    status=1
    continue
  fi
  if [[ ! $out =~ ^$name\ ${version//./\\.}\ \(commit\ ([^ \)]+)\)$ ]]; then
    echo "FAIL: $name --version printed '$out', not '$name $version (commit ...)'"
    status=1
  elif [ -n "$commit" ] && [[ ${BASH_REMATCH[1]} != "$commit"* ]]; then
    echo "FAIL: $name --version names commit ${BASH_REMATCH[1]}, the tree is at $commit (rebuild?)"
    status=1
  else
    echo "$out"
  fi
done
exit $status
