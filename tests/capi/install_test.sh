#!/bin/bash
# libsoftblk as a user outside the tree gets it: `cmake --install` of the
# lib and dev components into a temporary prefix, then
#  - the library exports only softblk_* functions, in version node SOFTBLK_0,
#    with soname libsoftblk.so.0;
#  - examples/c builds with `cc $(pkg-config --cflags --libs softblk)` and
#    runs (a memory-backed null device written and read back, a zoned one
#    with zone appends);
#  - examples/cpp builds with CMake's find_package(softblk) and runs.
# Usage: install_test.sh BUILD_DIR EXAMPLES_DIR SANITIZERS GENERATOR
set -euo pipefail
build=$1 examples=$2 sanitize=${3:-} generator=${4:-Ninja}

for tool in cc c++ pkg-config nm; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool is not installed"; exit 77; }
done

work=$(mktemp -d /tmp/softblk-capi-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" --component lib >"$work/install.log"
cmake --install "$build" --prefix "$prefix" --component dev >>"$work/install.log"
pc=$(find "$prefix" -name softblk.pc)
[[ -n $pc ]] || { echo "FAIL: no softblk.pc under $prefix"; cat "$work/install.log"; exit 1; }
libdir=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --variable=libdir softblk)
for f in "$libdir/libsoftblk.so" "$libdir/libsoftblk.so.0" "$prefix/include/softblk.h" \
         "$prefix/include/softblk.hpp" "$libdir/cmake/softblk/softblk-config.cmake" \
         "$libdir/cmake/softblk/softblk-config-version.cmake"; do
  [[ -e $f ]] || { echo "FAIL: $f not installed"; exit 1; }
done

# Only the C functions leave the library, all in SOFTBLK_0.
lib=$(readlink -f "$libdir/libsoftblk.so.0")
others=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v -E '^(softblk_[a-z0-9_]+@@SOFTBLK_0|SOFTBLK_0)$' || true)
if [[ -n $others ]]; then
  echo "FAIL: libsoftblk exports symbols beyond softblk_*@@SOFTBLK_0:"; echo "$others" | head -20
  exit 1
fi
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ $soname == libsoftblk.so.0 ]] || { echo "FAIL: soname '$soname', not libsoftblk.so.0"; exit 1; }

flags=()
if [[ -n $sanitize ]]; then
  flags=("-fsanitize=$sanitize")
fi

# The C example, as docs/capi.md says to build one.
export PKG_CONFIG_PATH=$(dirname "$pc")
cc -std=c11 -Wall -Wextra -Werror "${flags[@]}" -o "$work/softblk_example" \
   "$examples/c/softblk_example.c" $(pkg-config --cflags --libs softblk) -Wl,-rpath,"$libdir"
"$work/softblk_example"

# The C++ example through find_package(softblk).
cmake -S "$examples/cpp" -B "$work/cpp" -G "$generator" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_CXX_FLAGS="${flags[*]}" >"$work/cpp.log" 2>&1 ||
  { cat "$work/cpp.log"; echo "FAIL: configuring examples/cpp with find_package(softblk)"; exit 1; }
cmake --build "$work/cpp" >>"$work/cpp.log" 2>&1 ||
  { cat "$work/cpp.log"; echo "FAIL: building examples/cpp"; exit 1; }
"$work/cpp/softblk_example_cpp"
echo "PASS: installed, exports softblk_* only, C and C++ examples built out of tree and ran"
