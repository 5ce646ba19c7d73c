#!/usr/bin/env bash
# Fetches the source of the installed fio from Debian (apt-get source, the
# exact version dpkg has installed) and runs fio's ./configure in it, so that
# the softblk fio engine (bench/fio/) compiles against the same headers and
# config-host.h as the fio binary that loads it. The engine's CMake step
# looks for it in the directory this script prints.
#
#   scripts/fetch-fio-source.sh [CACHE_DIR]    (default ~/.cache/softblk)
#
# The source lands in CACHE_DIR/fio-VERSION (VERSION as `fio --version`
# prints it, e.g. fio-3.33), with a stamp file `.softblk-configured` once
# configure succeeded. Nothing is changed in the system's apt configuration:
# the deb-src entry, the package lists and the downloads live in
# CACHE_DIR/fio-apt. Needs network access to deb.debian.org, and dpkg-dev
# (dpkg-source) to unpack. Idempotent: a configured tree is left as it is.
set -euo pipefail

cache=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/softblk}
if ! command -v fio >/dev/null; then
  echo "fetch-fio-source: fio is not installed (scripts/install-deps.sh installs it)" >&2
  exit 1
fi
fio_version=$(fio --version)                         # fio-3.33
deb_version=$(dpkg-query -W -f='${Version}' fio)     # 3.33-3
dest=$cache/$fio_version
if [ -f "$dest/.softblk-configured" ]; then
  echo "$dest"
  exit 0
fi
if ! command -v dpkg-source >/dev/null; then
  echo "fetch-fio-source: dpkg-source is missing: apt-get install dpkg-dev" >&2
  exit 1
fi

# A private apt setup with the deb-src entry of the release this system
# runs, so that `apt-get source` works without editing /etc/apt.
# shellcheck source=/dev/null
. /etc/os-release
apt_dir=$cache/fio-apt
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/src"
{
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]" \
    "http://deb.debian.org/debian $VERSION_CODENAME main"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]" \
    "http://deb.debian.org/debian $VERSION_CODENAME-updates main"
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]" \
    "http://deb.debian.org/debian-security $VERSION_CODENAME-security main"
} >"$apt_dir/sources.list"
apt_opts=(-q -o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
  -o Debug::NoLocking=1)
apt-get "${apt_opts[@]}" update >&2
rm -rf "$apt_dir/src"/fio-*
(cd "$apt_dir/src" && apt-get "${apt_opts[@]}" source "fio=$deb_version" >&2)
unpacked=$apt_dir/src/fio-${deb_version%-*}
if [ ! -f "$unpacked/ioengines.h" ]; then
  echo "fetch-fio-source: apt-get source fio=$deb_version left no $unpacked/ioengines.h" >&2
  exit 1
fi
src_version=$(sed -n 's/^DEF_VER=//p' "$unpacked/FIO-VERSION-GEN")
if [ "$src_version" != "$fio_version" ]; then
  echo "fetch-fio-source: the source is $src_version but the installed fio is $fio_version" >&2
  exit 1
fi

# Debian's configure line (debian/rules) without --enable-gfio and
# --enable-libnbd, which only add the GUI and the nbd engine (and need
# their libraries): the structures an engine sees come out the same.
(cd "$unpacked" && ./configure --disable-native --prefix=/usr >&2)
rm -rf "$dest"
mkdir -p "$cache"
mv "$unpacked" "$dest"
touch "$dest/.softblk-configured"
echo "$dest"
