#!/bin/sh
# Builds one NBD libFuzzer target with clang-16 and libc++ (as fuzz/fat
# does: clang's C++23 with libstdc++ 12 lacks pieces; the codec needs only
# the standard library) in its own build directory and fuzzes for
# FUZZ_SECONDS (60) from a seed corpus of real handshakes (make_seeds.py).
# Crashes are kept in BUILD/TARGET-artifacts/.
#   fuzz/nbd/run_fuzz.sh TARGET [build-dir]     TARGET: codec | handshake
# Needs: apt-get install clang-16 libc++-16-dev libc++abi-16-dev libclang-rt-16-dev
# (scripts/install-deps.sh installs them). Exit 77 (skip) when they are missing.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
target=${1:?usage: run_fuzz.sh codec|handshake [build-dir]}
build=${2:-$root/build-nbd-fuzz}
seconds=${FUZZ_SECONDS:-60}
cxx=${CXX_FUZZ:-clang++-16}
src="$root/src/frontends/nbd"
case "$target" in
    codec | handshake) ;;
    *) echo "unknown target $target (codec or handshake)" >&2; exit 2 ;;
esac
if ! command -v "$cxx" >/dev/null 2>&1; then
    echo "SKIP: $cxx not installed (apt-get install clang-16 libc++-16-dev libc++abi-16-dev libclang-rt-16-dev)"
    exit 77
fi
runtime="$("$cxx" -print-runtime-dir)/libclang_rt.fuzzer-x86_64.a"
if [ ! -f "$runtime" ]; then
    echo "SKIP: no libFuzzer runtime at $runtime (apt-get install libclang-rt-16-dev)"
    exit 77
fi
if ! echo '#include <vector>' | "$cxx" -std=c++2b -stdlib=libc++ -x c++ -fsyntax-only - 2>/dev/null; then
    echo "SKIP: $cxx cannot use libc++ (apt-get install libc++-16-dev libc++abi-16-dev)"
    exit 77
fi
mkdir -p "$build/$target-corpus" "$build/$target-artifacts"
flags="-std=c++2b -stdlib=libc++ -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined"
objs=""
for f in "$here/${target}_fuzzer.cpp" "$src/codec.cpp"; do
    o="$build/$target-$(basename "$f" .cpp).o"
    if [ ! -f "$o" ] || [ "$f" -nt "$o" ] || [ "$src/codec.hpp" -nt "$o" ] || [ "$src/protocol.hpp" -nt "$o" ]; then
        # shellcheck disable=SC2086
        "$cxx" $flags -I"$src" -c "$f" -o "$o"
    fi
    objs="$objs $o"
done
# The libFuzzer runtime itself is built against libstdc++: link both (no
# standard-library types cross between it and the target).
stdcxx=$(ls /usr/lib/*-linux-gnu/libstdc++.so.6 2>/dev/null | head -n 1)
# shellcheck disable=SC2086
"$cxx" -stdlib=libc++ -fsanitize=address,undefined $objs "$runtime" "${stdcxx:--lstdc++}" \
    -o "$build/nbd_${target}_fuzzer"
python3 "$here/make_seeds.py" "$target" "$build/$target-corpus"
cd "$build"
# Symbolized stacks in crash reports, when the symbolizer is there.
for s in llvm-symbolizer-16 llvm-symbolizer; do
    if [ -z "${ASAN_SYMBOLIZER_PATH:-}" ] && command -v "$s" >/dev/null 2>&1; then
        ASAN_SYMBOLIZER_PATH=$(command -v "$s")
        export ASAN_SYMBOLIZER_PATH
    fi
done
exec "./nbd_${target}_fuzzer" -max_total_time="$seconds" -rss_limit_mb=1024 -timeout=10 -max_len=4096 \
    -artifact_prefix="$build/$target-artifacts/" "$target-corpus"
