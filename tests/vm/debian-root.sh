#!/usr/bin/env bash
# debian-root.sh: a Debian 12 root file system with systemd as a raw ext4
# image, for `run-vm --root-image` (tests/vm/README.md). Prints the image's
# path; the image is cached (boot a copy: a boot writes to it).
#
#   debian-root.sh KVER MODULES_ROOT [PACKAGE...]
#
# mmdebstrap --variant=minbase with systemd-sysv, udev, kmod, e2fsprogs,
# procps and the PACKAGEs makes a tarball, cached under a hash of the
# package list (SOFTBLK_VM_CACHE/roots); the image adds the kernel KVER's
# modules from MODULES_ROOT/lib/modules/KVER (the lab kernel's own package,
# as run-vm unpacked it) and is cached under a hash of the tarball's key,
# the kernel and this script. Images and tarballs unused for a week go.
# Exit 77 (reason on stderr): mmdebstrap missing, or the mirror not
# reachable.
set -euo pipefail
kver=${1:?usage: debian-root.sh KVER MODULES_ROOT [PACKAGE...]}
modules_root=${2:?usage: debian-root.sh KVER MODULES_ROOT [PACKAGE...]}
shift 2
cache_dir=${SOFTBLK_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/softblk-vm}
mirror=${SOFTBLK_VM_MIRROR:-http://deb.debian.org/debian}
log() { echo "debian-root: $*" >&2; }
skip() { echo "SKIP: $*"; log "SKIP: $*"; exit 77; }

command -v mmdebstrap >/dev/null || skip "mmdebstrap is missing (scripts/install-deps.sh installs it)"
command -v mkfs.ext4 >/dev/null || skip "mkfs.ext4 is missing (e2fsprogs)"
[ "$(id -u)" -eq 0 ] || skip "needs root (the root file system's owners and device nodes)"
[ -d "$modules_root/lib/modules/$kver" ] || { log "no modules in $modules_root/lib/modules/$kver"; exit 2; }

packages=$(printf '%s\n' systemd-sysv udev kmod e2fsprogs procps "$@" | sort -u | paste -sd, -)
dir=$cache_dir/roots
mkdir -p "$dir"
tar_key=$(printf 'format 1\nsuite bookworm\nvariant minbase\npackages %s\n' "$packages" | sha256sum | cut -c1-16)
image_key=$({ echo "tar $tar_key kernel $kver"; sha256sum <"$0"; } | sha256sum | cut -c1-16)
tar=$dir/bookworm-$tar_key.tar
image=$dir/bookworm-$image_key.img
exec {lock_fd}>"$dir/lock"
flock "$lock_fd"

if [ ! -e "$tar" ]; then
  log "mmdebstrap bookworm ($packages): about 20 s on an idle machine, minutes on a loaded one; once"
  t0=$SECONDS
  # (mmdebstrap picks the output's format by its name: it must end in .tar.)
  tmp_tar=$dir/.tmp-$tar_key.tar
  if ! mmdebstrap --quiet --variant=minbase --include="$packages" bookworm "$tmp_tar" "$mirror" \
    >"$dir/mmdebstrap.log" 2>&1; then
    rm -rf "$tmp_tar"
    tail -5 "$dir/mmdebstrap.log" >&2
    skip "mmdebstrap failed (network? log: $dir/mmdebstrap.log)"
  fi
  mv "$tmp_tar" "$tar"
  log "root file system tarball: $(du -h "$tar" | cut -f1) in $((SECONDS - t0)) s"
fi

if [ ! -e "$image" ]; then
  t0=$SECONDS
  stage=$(mktemp -d "$dir/.stage.XXXXXX")
  trap 'rm -rf "$stage"' EXIT
  tar -xf "$tar" -C "$stage" --numeric-owner
  mkdir -p "$stage/usr/lib/modules"
  cp -a "$modules_root/lib/modules/$kver" "$stage/usr/lib/modules/"
  echo softblk-vm >"$stage/etc/hostname"
  # The root is mounted read-write by run-vm's root-init; nothing else.
  : >"$stage/etc/fstab"
  # What costs boot time under TCG and tests nothing here: the login
  # prompts, apt's and e2scrub's timers.
  for unit in serial-getty@ttyS0.service getty@tty1.service apt-daily.timer \
    apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer; do
    ln -sf /dev/null "$stage/etc/systemd/system/$unit"
  done
  rm -f "$image.tmp"
  mkfs.ext4 -q -F -L softblk-root -d "$stage" "$image.tmp" 2G >&2
  mv "$image.tmp" "$image"
  log "root image $(basename "$image"): $(du -h "$image" | cut -f1) used of 2G, in $((SECONDS - t0)) s"
fi
touch "$tar" "$image"
find "$dir" -maxdepth 1 \( -name 'bookworm-*.tar' -o -name 'bookworm-*.img' \) -mtime +7 -delete 2>/dev/null || true
echo "$image"
