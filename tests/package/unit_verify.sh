#!/usr/bin/env bash
# softblk.service as `cmake --install` installs it (systemd/softblk.service.in,
# cmake/install.cmake, docs/install.md):
#   - the programs component installs the unit into systemd's unit
#     directory (below the install prefix unless that is /usr), with
#     ExecStart naming the installed softblk;
#   - `systemd-analyze verify` accepts it without a single message (an
#     unknown key, a misspelt value or a missing program is only a warning
#     there, and fails here), in a root holding the installed files and the
#     system's units (it needs no running systemd);
#   - the options docs/install.md promises are in it;
#   - `systemd-analyze security` prints its exposure (for information).
# Usage: unit_verify.sh BUILD_DIR WORK_DIR     (exit 77: no systemd-analyze)
set -euo pipefail
build=$1
work=$2

command -v systemd-analyze >/dev/null ||
  { echo "SKIP: systemd-analyze is missing (Debian's systemd package; scripts/install-deps.sh)"; exit 77; }
units=/lib/systemd/system
[ -f $units/sysinit.target ] || units=/usr/lib/systemd/system
[ -f $units/sysinit.target ] ||
  { echo "SKIP: no systemd unit directory with sysinit.target (/lib/systemd/system)"; exit 77; }

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

root=$work/root
rm -rf "$root"
mkdir -p "$root"
trap 'rm -rf "$root"' EXIT
DESTDIR=$root cmake --install "$build" --component programs >"$work/install.log"
unit=$(cd "$root" && find . -path '*/systemd/system/softblk.service' | sed 's/^\.//')
[ -n "$unit" ] || { cat "$work/install.log"; echo "FAIL: cmake --install put no softblk.service below $root"; exit 1; }
echo "installed: $unit"
exec_start=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$root$unit")
[ -x "$root$exec_start" ] || fail "ExecStart names $exec_start, which the install does not hold"

# The units the service names (multi-user.target, network-online.target,
# the default dependencies) are the system's.
# (-n: the installed unit stays when the prefix puts it among them.)
mkdir -p "$root/lib/systemd/system"
cp -an "$units/." "$root/lib/systemd/system/"
# --man=no: the man page is checked below, in the install, not in the
# system's manual.
out=$(systemd-analyze verify --man=no --root="$root" "$unit" 2>&1) || fail "systemd-analyze verify failed"
if [ -n "$out" ]; then
  sed 's/^/  /' <<<"$out"
  fail "systemd-analyze verify printed the messages above"
else
  echo "systemd-analyze verify: no messages"
fi
man_page=$(sed -n 's/^Documentation=man:\([a-z-]*\)(\([0-9]\))$/\1.\2/p' "$root$unit")
[ -n "$man_page" ] && [ -n "$(find "$root" -name "$man_page")" ] ||
  fail "Documentation= names man:${man_page:-?}, which the install does not hold"

# What docs/install.md says of the service.
for line in Type=notify "ExecStart=$exec_start daemon --foreground" "ExecStartPost=-$exec_start apply" \
  "ExecReload=$exec_start apply" RuntimeDirectoryPreserve=yes ProtectSystem=strict ProtectHome=yes \
  PrivateTmp=yes NoNewPrivileges=yes WantedBy=multi-user.target; do
  grep -qx -- "$line" "$root$unit" || fail "softblk.service has no line $line"
done
for option in PrivateDevices DevicePolicy DeviceAllow ProtectKernelTunables ProtectKernelModules \
  ProtectClock PrivateNetwork PrivateUsers DynamicUser User; do
  ! grep -q "^$option=" "$root$unit" || fail "softblk.service sets $option, which breaks the exports (see its comment)"
done

if exposure=$(systemd-analyze security --offline=true --root="$root" "$unit" 2>&1 | grep 'Overall exposure'); then
  echo "systemd-analyze security: $exposure"
fi

if ((failures)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "PASS"
