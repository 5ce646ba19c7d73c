#!/usr/bin/env bash
# The generated man pages format without a warning: groff with every
# warning on (-ww), and man(1) --warnings as Debian's man-db runs it, at 80
# and at 60 columns (a narrow terminal breaks lines differently).
#
# Usage: man_lint.sh MAN_DIR        (exit 77: groff or man missing)
set -euo pipefail
man_dir=$1
for tool in groff man; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool is not installed (apt-get install groff-base man-db)"
    exit 77
  fi
done
export LC_ALL=C.UTF-8
status=0
for page in "$man_dir"/softblk.8 "$man_dir"/softblk-fat.8 "$man_dir"/softblk-driver.8 \
  "$man_dir"/softblk-devices.d.5; do
  [ -s "$page" ] || { echo "FAIL: $page is missing or empty"; status=1; continue; }
  for width in 80 60; do
    warnings=$( { groff -man -ww -z -Tutf8 -rLL="${width}n" "$page"; } 2>&1 >/dev/null)
    warnings+=$( { MANWIDTH=$width man --warnings -l "$page" >/dev/null; } 2>&1)
    if [ -n "$warnings" ]; then
      echo "FAIL: $page at $width columns:"
      echo "$warnings"
      status=1
    fi
  done
  # man(1) shows the page's name line, as apropos and lintian read it.
  if ! lexgrog "$page" 2>/dev/null | grep -q ' - '; then
    echo "FAIL: $page: lexgrog finds no NAME line: $(lexgrog "$page" 2>&1)"
    status=1
  fi
done
((status == 0)) && echo "man pages format cleanly (groff -ww, man --warnings, 80 and 60 columns)"
exit $status
