#!/usr/bin/env bash
# The Debian package (debian/, docs/install.md), built as a user would:
#   - every Build-Depends of debian/control is one of the packages
#     scripts/install-deps.sh installs;
#   - `dpkg-buildpackage -us -uc -b` in a copy of the tree (the files git
#     tracks or would add: uncommitted changes count, build directories
#     do not) builds softblk, libsoftblk0 and libsoftblk-dev;
#   - lintian reports no error (its warnings are printed);
#   - the three .deb files hold the key paths (dpkg -c), the library its
#     soname, and the packaged softblk prints the changelog's version.
# The copy is WORK_DIR/softblk-VERSION; ccache (kept in its own directory:
# debhelper points HOME elsewhere) hashes the paths inside it relative to
# it, so a copy in another build directory or clone finds the objects of the
# last run (Debian's flags name the build path).
#
# Usage: package.sh SOURCE_DIR WORK_DIR VERSION
#   (exit 77: dpkg-buildpackage, debhelper or lintian missing, or a build
#   dependency missing: scripts/install-deps.sh installs them)
set -euo pipefail
src=$(realpath "$1")
work=$2
version=$3

for tool in dpkg-buildpackage dpkg-checkbuilddeps dh lintian; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: $tool is missing (scripts/install-deps.sh installs dpkg-dev, debhelper, lintian)"
    exit 77
  fi
done

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# Build-Depends against install-deps.sh's list: names only (no versions,
# architecture qualifiers or build profiles); debhelper-compat is debhelper.
build_deps=$(awk '/^Build-Depends:/ { on = 1; sub(/^Build-Depends:/, ""); print; next }
    on && /^#/ { next } on && /^[ \t]/ { print; next } on { exit }' "$src/debian/control" |
  tr ',' '\n' | sed 's/[(<\[].*//; s/:any//; s/[[:space:]]//g; /^$/d; s/^debhelper-compat$/debhelper/')
installed_list=$(sed -n '/^packages=(/,/^)/p' "$src/scripts/install-deps.sh" | sed 's/#.*//' |
  tr ' ' '\n' | sed '/^$/d; /^packages=(/d; /^)/d')
for dep in $build_deps; do
  grep -qx -- "$dep" <<<"$installed_list" ||
    fail "debian/control Build-Depends $dep, which scripts/install-deps.sh does not install"
done
if ((failures)); then
  exit 1
fi
echo "Build-Depends ($(wc -w <<<"$build_deps") packages) are all in scripts/install-deps.sh"

if ! missing=$(cd "$src" && dpkg-checkbuilddeps 2>&1); then
  echo "SKIP: build dependencies missing ($missing); scripts/install-deps.sh installs them"
  exit 77
fi

copy=$work/softblk-$version
rm -rf "$work"
mkdir -p "$copy"
if [ "$(git -C "$src" rev-parse --show-toplevel 2>/dev/null || true)" = "$src" ]; then
  git -C "$src" ls-files -co --exclude-standard -z | (cd "$src" && tar --null -T - -cf -) | tar -xf - -C "$copy"
else
  tar -C "$src" --exclude='./build*' --exclude=./.git --exclude=./.cache -cf - . | tar -xf - -C "$copy"
fi

# dh points HOME at a directory of its own: ccache's objects stay where
# they are only if it is told where that is. With base_dir the copy, the
# build path (in -I and -ffile-prefix-map) leaves the hash: without it a
# copy at another path (a CI clone's build directory) compiled everything
# again, 373 CPU s for this script where the objects found take 80.
if command -v ccache >/dev/null; then
  CCACHE_DIR=$(ccache -k cache_dir)
  CCACHE_BASEDIR=$(realpath "$copy")
  export CCACHE_DIR CCACHE_BASEDIR
fi
# No -dbgsym packages: compressing their 40 MB of debug information took
# longer than the rest of a warm build, and nothing here checks them.
export DEB_BUILD_OPTIONS="parallel=$(nproc) noautodbgsym"
t0=$SECONDS
if ! (cd "$copy" && dpkg-buildpackage -us -uc -b) >"$work/build.log" 2>&1; then
  tail -60 "$work/build.log"
  echo "FAIL: dpkg-buildpackage failed after $((SECONDS - t0)) s (log: $work/build.log)"
  exit 1
fi
echo "dpkg-buildpackage: $((SECONDS - t0)) s"

arch=$(dpkg-architecture -qDEB_HOST_ARCH)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
changes=$work/softblk_${version}_${arch}.changes
for p in softblk libsoftblk0 libsoftblk-dev; do
  [ -f "$work/${p}_${version}_${arch}.deb" ] || fail "dpkg-buildpackage made no ${p}_${version}_${arch}.deb"
done
((failures)) && exit 1

t0=$SECONDS
lintian_rc=0
# Its temporary files (mldbm-elf-*, left behind in /tmp) go to WORK_DIR.
mkdir -p "$work/tmp"
lintian_out=$(TMPDIR=$work/tmp lintian --fail-on error --display-level '>=warning' "$changes" 2>&1) ||
  lintian_rc=$?
lintian_out=$(grep -v '^running with root privileges is not recommended' <<<"$lintian_out" || true)
echo "lintian ($((SECONDS - t0)) s):"
if [ -n "$lintian_out" ]; then
  sed 's/^/  /' <<<"$lintian_out"
else
  echo "  no errors or warnings"
fi
if ((lintian_rc != 0)); then
  fail "lintian reports errors (above)"
fi

# contents PACKAGE PATH...: each PATH is in the package.
contents() {
  local deb=$work/$1_${version}_${arch}.deb listing path
  shift
  listing=$(dpkg -c "$deb" | awk '{print $6}')
  for path in "$@"; do
    grep -qx -- "./$path" <<<"$listing" || fail "$(basename "$deb") has no /$path"
  done
}
contents softblk usr/sbin/softblk usr/sbin/softblk-driver usr/bin/softblk-fat \
  usr/share/man/man8/softblk.8.gz usr/share/man/man8/softblk-fat.8.gz \
  usr/share/man/man8/softblk-driver.8.gz usr/share/bash-completion/completions/softblk \
  usr/share/doc/softblk/copyright usr/share/doc/softblk/changelog.gz lib/systemd/system/softblk.service \
  usr/share/man/man5/softblk-devices.d.5.gz etc/softblk/devices.d/ \
  usr/share/doc/softblk/examples/devices.d/data.conf
contents libsoftblk0 "usr/lib/$multiarch/libsoftblk.so.0" "usr/lib/$multiarch/libsoftblk.so.$version"
contents libsoftblk-dev usr/include/softblk.h usr/include/softblk.hpp "usr/lib/$multiarch/libsoftblk.so" \
  "usr/lib/$multiarch/pkgconfig/softblk.pc" "usr/lib/$multiarch/cmake/softblk/softblk-config.cmake" \
  "usr/lib/$multiarch/cmake/softblk/softblk-config-version.cmake"

# What is inside: the programs run and name the changelog's version (the
# copy has no .git), the library has soname 0, the man page the options.
root=$work/root
for p in softblk libsoftblk0 libsoftblk-dev; do
  dpkg -x "$work/${p}_${version}_${arch}.deb" "$root"
done
out=$("$root/usr/sbin/softblk" --version 2>&1) || true
[ "$out" = "softblk $version (commit debian/$version)" ] ||
  fail "the packaged softblk --version printed '$out', not 'softblk $version (commit debian/$version)'"
soname=$(objdump -p "$root/usr/lib/$multiarch/libsoftblk.so.$version" | awk '$1 == "SONAME" {print $2}')
[ "$soname" = libsoftblk.so.0 ] || fail "libsoftblk.so.$version has soname '$soname', not libsoftblk.so.0"
# (grep -c reads to the end: with -q, zcat could die of SIGPIPE, and
# pipefail would call that a failure.)
zcat "$root/usr/share/man/man8/softblk.8.gz" | grep -c '^\.SH TARGET TYPES' >/dev/null ||
  fail "the packaged softblk.8 has no TARGET TYPES section"

# dh_installsystemd enables and starts the unit on install and leaves a
# running daemon alone on upgrade (debian/rules, docs/install.md): the
# postinst starts (never restarts) it, the prerm stops it on removal only.
postinst=$(dpkg-deb -I "$work/softblk_${version}_${arch}.deb" postinst 2>/dev/null || true)
grep -q "deb-systemd-helper.*enable.*softblk.service" <<<"$postinst" ||
  fail "the softblk package's postinst does not enable softblk.service"
grep -q "deb-systemd-invoke start.*softblk.service" <<<"$postinst" ||
  fail "the softblk package's postinst does not start softblk.service"
! grep -q "_dh_action\|deb-systemd-invoke restart" <<<"$postinst" ||
  fail "the softblk package's postinst restarts softblk.service on upgrade (every export would stop)"
prerm=$(dpkg-deb -I "$work/softblk_${version}_${arch}.deb" prerm 2>/dev/null || true)
grep -q '"$1" = remove' <<<"$prerm" ||
  fail "the softblk package's prerm stops softblk.service on upgrade too, not only on removal"

if ((failures)); then
  echo "$failures check(s) failed"
  exit 1
fi
echo "package: softblk, libsoftblk0, libsoftblk-dev built, lintian without errors, contents as expected"
