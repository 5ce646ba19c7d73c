#!/bin/sh
# Builds the FAT libFuzzer target with clang-16 and libc++ (std::expected
# needs clang >= 19 with libstdc++ 12) in its own build directory, makes a
# seed corpus with mkfs.fat and mtools (including images whose directories
# form cycles), and fuzzes for FUZZ_SECONDS (30). Exit 77 (skip) when the
# compiler, libc++ or the libFuzzer runtime is missing; a finding fails,
# with the input left as crash-*/timeout-*/oom-* in the build directory.
#   fuzz/fat/run_fuzz.sh [build-dir]
# Needs: clang-16 and libc++ (fuzz/lib_fuzz.sh), dosfstools, mtools
# (scripts/install-deps.sh installs them). The ctest fat_mount_fuzz runs it.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build-fat-fuzz}
seconds=${FUZZ_SECONDS:-30}
. "$root/fuzz/lib_fuzz.sh"
fuzz_toolchain '#include <expected>'
mkdir -p "$build/corpus"
src="$root/src/fs/fat"
# The library as one translation unit, as the unity build compiles it:
# each source includes fmt header-only, which compiled once per source cost
# most of this test's time.
cmake -P "$src/sources.cmake" 2>&1 | sed "s|^\(.*\)|#include \"$src/\1\"|" >"$build/fat_library.next"
cmp -s "$build/fat_library.next" "$build/fat_library.cpp" || mv "$build/fat_library.next" "$build/fat_library.cpp"
rm -f "$build/fat_library.next"
fuzz_compile "$build" "" "-std=c++2b -stdlib=libc++ -O1 -g -fsanitize=fuzzer,address,undefined -DFMT_HEADER_ONLY=1 -I$root/include -I$src" \
    "$here/mount_walk_fuzzer.cpp" "$build/fat_library.cpp"
# shellcheck disable=SC2086
fuzz_link "$build/fat_mount_fuzzer" $fuzz_objs
# Seeds: small FAT12 and FAT16 images with long names, subdirectories and
# deleted entries; odd sizes mount read-write in the fuzzer.
seed() { # name size-KiB mkfs-args
    img="$build/corpus/$1"
    rm -f "$img"
    mkfs.fat -C $3 "$img" "$2" >/dev/null
    tmp=$(mktemp -d)
    mkdir -p "$tmp/Sub Dir/deeper"
    echo hello > "$tmp/readme.txt"
    echo long > "$tmp/A long file name.text"
    head -c 5000 /dev/zero | tr '\0' x > "$tmp/Sub Dir/deeper/data.bin"
    mcopy -s -i "$img" "$tmp"/* ::/
    mdel -i "$img" ::/readme.txt
    rm -rf "$tmp"
}
if command -v mkfs.fat >/dev/null 2>&1 && command -v mcopy >/dev/null 2>&1; then
    seed fat12.img 160 "-F 12"
    seed fat16.img 2200 "-F 16 -s 1"
    cp "$build/corpus/fat12.img" "$build/corpus/fat12-rw.img"
    printf 'x' >> "$build/corpus/fat12-rw.img"
    if command -v python3 >/dev/null 2>&1; then
        python3 "$here/make_cycle_seeds.py" "$build/corpus"
        cp "$build/corpus/cycle-long.img" "$build/corpus/cycle-long-rw.img"
        printf 'x' >> "$build/corpus/cycle-long-rw.img"
    fi
fi
cp -n "$here"/corpus/* "$build/corpus/" 2>/dev/null || true
cd "$build"
exec ./fat_mount_fuzzer -max_total_time="$seconds" -rss_limit_mb=1024 -timeout=10 -max_len=2300000 corpus
