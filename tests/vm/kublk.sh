# Sourced by run-vm: builds kublk, the ublk server the kernel ships with
# its ublk selftests (tools/testing/selftests/ublk: null, loop and stripe
# targets; copy, USER_COPY and zero-copy modes), for `run-vm --peer kublk`.
# It is a benchmark peer for softblk's ublk front end, never part of
# softblk: the kernel's own server of the same interface, in C, with no
# work of its own beyond the interface (null) or a file (loop).
#
# From Debian's archive, with apt-get download:
#   linux-source-X.Y (the series of run-vm's backports kernel, version
#     pinned to it, through run-vm's private index): kublk's sources and
#     the kernel's uapi headers (ublk_cmd.h, io_uring.h, fs.h: newer than
#     bookworm's linux-libc-dev);
#   liburing-dev of trixie (a private index of trixie's main in the
#     cache): kublk's batch mode needs liburing 2.5+, bookworm has 2.3.
#     Linked statically, so the guest needs nothing more.
# The binary lands in $cache_dir/kublk/$kver/kublk. A failed build leaves
# its reason in $cache_dir/kublk/$kver.failed: later runs skip with it
# until this file changes.

# Sets kublk_bin, or kublk_failure (one line) and returns 1. Uses run-vm's
# globals (kver, cache_dir, lock_fd, mirror, backports_apt_opts).
build_kublk() {
  kublk_bin=$cache_dir/kublk/$kver/kublk
  kublk_failure=
  kublk_in_place && return 0
  if [[ -z ${backports_apt_opts+x} ]]; then
    kublk_failure="kublk is built from the backports kernel's source: use --kernel backports"
    return 1
  fi
  peer_build kublk "$k_self_dir/kublk.sh" kublk_build_steps kublk_install kublk_in_place ||
    { kublk_failure=$peer_failure; return 1; }
}

kublk_in_place() { [[ -x $kublk_bin ]]; }

kublk_install() {
  mkdir -p "$(dirname "$kublk_bin")"
  cp "$1/kublk" "$kublk_bin"
}

# The build in $1, run by peer_build with errexit; each step is announced as
# "kublk: STEP", the last one naming the step that failed.
kublk_build_steps() {
  local work=$1
  local series ver
  series=$(cut -d. -f1-2 <<<"$kver")
  echo "kublk: find linux-source-$series for $kver"
  ver=$(backports_kernel_version)
  [[ -n $ver ]]
  mkdir -p "$work/debs"
  echo "kublk: download linux-source-$series=$ver"
  (cd "$work/debs" && apt-get "${backports_apt_opts[@]}" download -q "linux-source-$series=$ver")
  local src=linux-source-$series
  local sel=tools/testing/selftests/ublk
  echo "kublk: unpack $sel"
  dpkg-deb --fsys-tarfile "$work"/debs/linux-source-*.deb |
    tar -xO "./usr/src/$src.tar.xz" |
    tar -xJ -C "$work" --wildcards "$src/$sel/*" "$src/include/uapi/linux/*"
  rm -rf "$work/debs"
  # Only the headers bookworm's are too old for: the others (types.h, ...)
  # are the installed ones, which headers_install made fit for user space.
  mkdir -p "$work/inc/linux"
  local h
  for h in ublk_cmd.h io_uring.h io_uring blkdev.h fs.h; do
    [[ ! -e $work/$src/include/uapi/linux/$h ]] || cp -r "$work/$src/include/uapi/linux/$h" "$work/inc/linux/"
  done

  echo "kublk: trixie's package index"
  # peer_build holds the cache lock.
  apt_index trixie || echo "(trixie's index not refreshed: $(tail -n1 "$cache_dir/apt-trixie/update.log"))"
  echo "kublk: download liburing-dev from trixie"
  mkdir -p "$work/uring-deb"
  (cd "$work/uring-deb" && apt-get "${apt_opts[@]}" download -q liburing-dev)
  dpkg-deb -x "$work"/uring-deb/liburing-dev_*.deb "$work/uring"
  local uring=$work/uring/usr

  echo "kublk: compile"
  # The selftests' Makefile builds kublk from every .c file there but its
  # standalone utilities (STANDALONE_UTILS).
  local standalone
  standalone=$(sed -n 's/^STANDALONE_UTILS *:*= *//p' "$work/$src/$sel/Makefile")
  local sources=() f
  for f in "$work/$src/$sel"/*.c; do
    [[ " $standalone " == *" $(basename "$f") "* ]] || sources+=("$f")
  done
  gcc -D_GNU_SOURCE -O2 -Wall -I"$work/inc" -I"$uring/include" -o "$work/kublk" "${sources[@]}" \
    "$uring/lib/x86_64-linux-gnu/liburing.a" -lpthread -lm
  echo "kublk: done"
}
