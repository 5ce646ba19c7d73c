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
  zloop_failure=
  if zloop_ko_in_place; then
    return 0
  fi
  if [[ $kver == 6.12.* ]]; then
    zloop_failure="zloop is Linux 6.15+ and the $kver kernel is older: use --kernel backports"
    return 1
  fi
  peer_build zloop "$k_self_dir/zloop-ko.sh" zloop_build_steps zloop_install zloop_ko_in_place ||
    { zloop_failure=$peer_failure; return 1; }
}

zloop_ko_in_place() {
  local kmods=$modules_root/lib/modules/$kver
  [[ -e $kmods/updates/zloop.ko ]] || grep -q '/zloop\.ko' "$kmods/modules.dep" "$kmods/modules.builtin" 2>/dev/null
}

zloop_install() {
  local kmods=$modules_root/lib/modules/$kver
  mkdir -p "$kmods/updates"
  cp "$1/zloop/zloop.ko" "$kmods/updates/zloop.ko"
  depmod -b "$modules_root" "$kver"
  log "zloop.ko built: $(modinfo -F vermagic "$kmods/updates/zloop.ko")"
}

# The build itself in $1, run by peer_build with errexit; each step is
# announced as "zloop: STEP" (the last one names the step that failed).
zloop_build_steps() {
  local work=$1
  local base=${kver%-amd64}
  local series
  series=$(cut -d. -f1-2 <<<"$kver")
  echo "zloop: find the packages of $kver"
  local ver
  ver=$(backports_kernel_version)
  [[ -n $ver ]]
  local pkgs=("linux-headers-$kver=$ver" "linux-headers-$base-common=$ver" "linux-kbuild-$base=$ver"
    "linux-source-$series=$ver")
  echo "zloop: download ${pkgs[*]}"
  mkdir -p "$work/debs"
  (cd "$work/debs" && apt-get "${backports_apt_opts[@]}" download -q "${pkgs[@]}")
  echo "zloop: unpack"
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

  echo "zloop: build objtool from linux-source-$series"
  mkdir -p "$work/objtool"
  make -C "$src/tools/objtool" O="$work/objtool" -j2
  cp "$work/objtool/objtool" "$kbuild/tools/objtool/objtool"

  echo "zloop: build modpost from linux-source-$series"
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

  echo "zloop: build zloop.ko from drivers/block/zloop.c"
  mkdir -p "$work/zloop"
  cp "$src/drivers/block/zloop.c" "$work/zloop/"
  echo 'obj-m := zloop.o' >"$work/zloop/Kbuild"
  "${kmake[@]}" M="$work/zloop" modules
  [[ $(modinfo -F vermagic "$work/zloop/zloop.ko") == "$kver "* ]]
  echo "zloop: done"
}
