# Sourced by run-vm: builds the kernel's zoned loop driver (zloop.ko) out
# of tree for a trixie-backports kernel whose config leaves it out
# (CONFIG_BLK_DEV_ZONED_LOOP unset), so that VM tests can compare softblk's
# zloop target with the kernel's. The module is a test peer, never part of
# softblk. `run-vm --module zloop` calls build_zloop_ko when the kernel has
# no zloop module; `run-vm --prepare --kernel backports --module zloop`
# builds it ahead of time.
#
# From the private apt index of run-vm's backports kernel it fetches (with
# apt-get download, the version pinned to the kernel's):
#   linux-headers-V, linux-headers-V-common (minus -amd64), linux-kbuild-...:
#     the build tree, .config and Module.symvers of that kernel;
#   linux-source-X.Y: drivers/block/zloop.c (the module's only source file)
#     and the sources of modpost and objtool, whose binaries in
#     linux-kbuild are linked against trixie's glibc (2.38+) and do not run
#     on bookworm: both are built here first.
# The kernel was built with gcc-14; the host compiler builds the module
# (the Debian headers skip kbuild's compiler check), minus the
# -fmin-function-alignment flag that gcc-12 lacks (then kbuild aligns with
# -falign-functions), and without BTF (no pahole needed).
#
# The module lands in the cached kernel's tree as updates/zloop.ko (then
# depmod), so modprobe finds it in the guest. A failed build leaves its
# reason in $cache_dir/zloop/$kver.failed: later runs skip with it (exit 77)
# until this file changes, rather than rebuilding each time. Needs make,
# gcc, libelf-dev (objtool) and the kernel's own build tools
# (scripts/install-deps.sh installs them).

# Sets zloop_failure to a one-line reason and returns 1 when the build
# fails; returns 0 with zloop.ko in $modules_root. Uses run-vm's globals
# (kver, modules_root, cache_dir, lock_fd, backports_apt_opts).
build_zloop_ko() {
  local kmods=$modules_root/lib/modules/$kver
  zloop_failure=
  if [[ -e $kmods/updates/zloop.ko ]] || grep -q '/zloop\.ko' "$kmods/modules.dep" "$kmods/modules.builtin" 2>/dev/null; then
    return 0
  fi
  if [[ $kver == 6.12.* ]]; then
    zloop_failure="zloop is Linux 6.15+ and the $kver kernel is older: use --kernel backports"
    return 1
  fi
  local state=$cache_dir/zloop
  local self_hash
  self_hash=$(sha256sum "$k_self_dir/zloop-ko.sh" | cut -c1-16)
  mkdir -p "$state"
  if [[ -s $state/$kver.failed && $(head -n1 "$state/$kver.failed") == "$self_hash" ]]; then
    zloop_failure="$(tail -n1 "$state/$kver.failed") (cached; log: $state/$kver.log)"
    return 1
  fi
  flock "$lock_fd"
  if [[ -e $kmods/updates/zloop.ko ]]; then flock -u "$lock_fd"; return 0; fi
  log "building zloop.ko for $kver (once; log in $state/$kver.log)"
  local work rc
  work=$(mktemp -d "$state/.build.XXXXXX")
  # errexit holds in the subshell only when it is not part of a || list.
  set +e
  (set -e; zloop_build_steps "$work") >"$state/$kver.log" 2>&1
  rc=$?
  set -e
  if ((rc == 0)); then
    mkdir -p "$kmods/updates"
    cp "$work/zloop/zloop.ko" "$kmods/updates/zloop.ko"
    depmod -b "$modules_root" "$kver"
    rm -f "$state/$kver.failed"
    log "zloop.ko built: $(modinfo -F vermagic "$kmods/updates/zloop.ko")"
  else
    zloop_failure=$(grep '^zloop-ko: ' "$state/$kver.log" | tail -n1 | sed 's/^zloop-ko: //')
    [[ -n $zloop_failure ]] || zloop_failure="build failed"
    zloop_failure="$zloop_failure: $(grep -v '^zloop-ko: ' "$state/$kver.log" | grep -m1 -iE 'error|not found|No such' | cut -c1-200)"
    printf '%s\n%s\n' "$self_hash" "cannot build zloop.ko for $kver: $zloop_failure" >"$state/$kver.failed"
    zloop_failure=$(tail -n1 "$state/$kver.failed")
  fi
  rm -rf "$work"
  flock -u "$lock_fd"
  return $((rc != 0))
}

# The build itself in $1, run in a subshell with errexit; each step is
# announced as "zloop-ko: STEP" (the last one names the step that failed).
zloop_build_steps() {
  local work=$1
  local base=${kver%-amd64}
  local series
  series=$(cut -d. -f1-2 <<<"$kver")
  echo "zloop-ko: find the packages of $kver"
  local ver
  ver=$(apt-cache "${backports_apt_opts[@]}" show "linux-headers-$kver" | sed -n 's/^Version: //p' | head -n1)
  [[ -n $ver ]]
  local pkgs=("linux-headers-$kver=$ver" "linux-headers-$base-common=$ver" "linux-kbuild-$base=$ver"
    "linux-source-$series=$ver")
  echo "zloop-ko: download ${pkgs[*]}"
  mkdir -p "$work/debs"
  (cd "$work/debs" && apt-get "${backports_apt_opts[@]}" download -q "${pkgs[@]}")
  echo "zloop-ko: unpack"
  local deb
  for deb in "$work"/debs/linux-{headers,kbuild}-*.deb; do dpkg-deb -x "$deb" "$work/root"; done
  local hdr=$work/root/usr/src/linux-headers-$kver common=$work/root/usr/src/linux-headers-$base-common
  local kbuild=$work/root/usr/lib/linux-kbuild-$base
  local src=$work/linux-source-$series
  dpkg-deb --fsys-tarfile "$work"/debs/linux-source-*.deb |
    tar -xO "./usr/src/linux-source-$series.tar.xz" |
    tar -xJ -C "$work" --wildcards "linux-source-$series/drivers/block/zloop.c" \
      "linux-source-$series/scripts/mod/*" "linux-source-$series/scripts/include/*" \
      "linux-source-$series/tools/objtool/*" "linux-source-$series/tools/lib/*" \
      "linux-source-$series/tools/include/*" "linux-source-$series/tools/arch/*" \
      "linux-source-$series/tools/build/*" "linux-source-$series/tools/scripts/*"
  rm -rf "$work/debs"
  # The headers' Makefile names the installed path of the common half.
  sed -i "s@/usr/src/linux-headers-$base-common@$common@; s@^KBUILD_OUTPUT=.*@KBUILD_OUTPUT=$hdr@" \
    "$hdr/Makefile"
  local kmake=(make -C "$hdr" CC=gcc CONFIG_DEBUG_INFO_BTF_MODULES=)
  if ! gcc -fmin-function-alignment=16 -x c -c /dev/null -o /dev/null 2>/dev/null; then
    kmake+=(CONFIG_CC_HAS_MIN_FUNCTION_ALIGNMENT=)
  fi

  echo "zloop-ko: build objtool from linux-source-$series"
  mkdir -p "$work/objtool"
  make -C "$src/tools/objtool" O="$work/objtool" -j2
  cp "$work/objtool/objtool" "$kbuild/tools/objtool/objtool"

  echo "zloop-ko: build modpost from linux-source-$series"
  # devicetable-offsets.h: kbuild compiles the offsets file with the
  # kernel's flags (a single target of an external module), then the sed
  # of scripts/Makefile.lib's filechk_offsets turns it into defines.
  mkdir -p "$work/offsets"
  cp "$src/scripts/mod/devicetable-offsets.c" "$work/offsets/"
  echo 'obj-m :=' >"$work/offsets/Kbuild"
  "${kmake[@]}" M="$work/offsets" devicetable-offsets.s
  local mod=$work/mp/scripts/mod
  mkdir -p "$work/mp/scripts"
  cp -r "$src/scripts/mod" "$src/scripts/include" "$work/mp/scripts/"
  # modpost's sources include ../../include/linux/*.h.
  ln -s "$common/include" "$work/mp/include"
  {
    echo "#ifndef __DEVICETABLE_OFFSETS_H__"
    echo "#define __DEVICETABLE_OFFSETS_H__"
    sed -ne 's:^[[:space:]]*\.ascii[[:space:]]*"\(.*\)".*:\1:; /^->/{s:->#\(.*\):/* \1 */:; s:^->\([^ ]*\) [\$#]*\([^ ]*\) \(.*\):#define \1 \2 /* \3 */:; s:->::; p;}' \
      <"$work/offsets/devicetable-offsets.s"
    echo "#endif"
  } >"$mod/devicetable-offsets.h"
  gcc -c "$mod/empty.c" -o "$mod/empty.o"
  gcc -O2 -o "$mod/mk_elfconfig" "$mod/mk_elfconfig.c"
  "$mod/mk_elfconfig" <"$mod/empty.o" >"$mod/elfconfig.h"
  gcc -O2 -I"$mod" -I"$work/mp/scripts/include" -o "$mod/modpost" \
    "$mod/modpost.c" "$mod/file2alias.c" "$mod/sumversion.c" "$mod/symsearch.c"
  cp "$mod/modpost" "$kbuild/scripts/mod/modpost"

  echo "zloop-ko: build zloop.ko from drivers/block/zloop.c"
  mkdir -p "$work/zloop"
  cp "$src/drivers/block/zloop.c" "$work/zloop/"
  echo 'obj-m := zloop.o' >"$work/zloop/Kbuild"
  "${kmake[@]}" M="$work/zloop" modules
  [[ $(modinfo -F vermagic "$work/zloop/zloop.ko") == "$kver "* ]]
  echo "zloop-ko: done"
}
