#!/usr/bin/env bash
# Installs every Debian package that softblk's build, tests and benchmarks
# need. Idempotent: packages already present are left as they are, and
# apt-get update runs only when something is missing. Installing needs root:
# as root it runs apt-get itself, otherwise through sudo; with neither it
# names the missing packages and fails.
set -euo pipefail

packages=(
  # build
  build-essential cmake ninja-build pkg-config git ccache clang-format-14
  clang-tidy-19 clang-19
  liburing-dev libfuse3-dev libcli11-dev nlohmann-json3-dev libfmt-dev
  libspdlog-dev libgtest-dev libgmock-dev libbenchmark-dev libgnutls28-dev
  libnbd-dev
  # sd_notify for softblk.service; systemd-analyze verify of the unit
  # (tests/package)
  libsystemd-dev systemd
  # metrics (docs/metrics.md): the text format and the HTTP listener
  # (prometheus-cpp's serializer and exposer); the parser its test uses
  prometheus-cpp-dev python3-prometheus-client curl
  # the man pages and bash completion (scripts/man, run at build time) and
  # their tests (tests/package)
  python3 groff-base man-db
  # the Debian package (debian/) and its test (tests/package/package.sh):
  # dpkg-buildpackage is in dpkg-dev, below
  debhelper lintian
  # optional rbd target (built only when librbd-dev is present)
  librbd-dev
  # the fio engine (bench/fio): dpkg-source unpacks fio's source package
  dpkg-dev
  # host tests and benchmarks
  fuse3 util-linux e2fsprogs xfsprogs dosfstools mtools fio procps kmod
  nbdkit libnbd-bin python3-libnbd qemu-utils qemu-system-common gnutls-bin jq
  # the bench report generator (bench/report) and its tests: plots, and a
  # headless browser's screenshot of the HTML report
  python3-matplotlib python3-pil chromium
  # rbd target tests and benchmark: a single-node Ceph cluster and the
  # peer (qemu-storage-daemon's rbd driver)
  ceph-mon ceph-osd ceph-common qemu-block-extra
  # VM lab
  qemu-system-x86 busybox-static cpio zstd xz-utils squashfs-tools nbd-client btrfs-progs f2fs-tools
  # the VM lab's Debian root file system with systemd (tests/vm/debian-root.sh)
  mmdebstrap
  # profiles in the VM lab (run-vm --tool perf, bench/zoned/profile_guest.sh)
  linux-perf
  # the kernel's zloop.ko for the VM lab's backports kernel, built out of tree
  # (tests/vm/build-zloop-ko): modpost and objtool are built from the
  # kernel's source, objtool needs libelf
  libelf-dev
  # fuzzing: clang 14 for the NBD codec; clang 16 with libc++ for the
  # fuzzers that need std::expected (fuzz/*/run_fuzz.sh)
  clang libclang-rt-14-dev
  clang-16 libc++-16-dev libc++abi-16-dev libclang-rt-16-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  as_root=()
  if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null; then
      echo "install-deps: these packages are missing and installing them needs root, but this" \
        "is not root and has no sudo: run scripts/install-deps.sh as root, or install them:" \
        "apt-get install ${missing[*]}" >&2
      exit 1
    fi
    as_root=(sudo)
  fi
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all ${#packages[@]} packages present"
fi

# The fio engine (bench/fio, docs/fio.md) compiles against the installed
# fio's own source: fetch it (apt-get source, into ~/.cache/softblk) and
# configure it. Without network this fails; the build then leaves the
# engine out and says why.
if ! "$(dirname "$0")/fetch-fio-source.sh" >/dev/null; then
  echo "install-deps: fio's source could not be fetched (above): the fio engine will not" \
    "be built; run scripts/fetch-fio-source.sh later to add it" >&2
fi
