#!/bin/sh
# Builds one NBD libFuzzer target with clang-16 and libc++ (as fuzz/fat
# does: clang's C++23 with libstdc++ 12 lacks pieces; the codec needs only
# the standard library) in its own build directory and fuzzes for
# FUZZ_SECONDS (60) from a seed corpus of real handshakes (make_seeds.py).
# Crashes are kept in BUILD/TARGET-artifacts/.
#   fuzz/nbd/run_fuzz.sh TARGET [build-dir]     TARGET: codec | handshake
# Needs: clang-16 and libc++ (fuzz/lib_fuzz.sh; scripts/install-deps.sh
# installs them). Exit 77 (skip) when they are missing.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
target=${1:?usage: run_fuzz.sh codec|handshake [build-dir]}
build=${2:-$root/build-nbd-fuzz}
seconds=${FUZZ_SECONDS:-60}
src="$root/src/frontends/nbd"
case "$target" in
    codec | handshake) ;;
    *) echo "unknown target $target (codec or handshake)" >&2; exit 2 ;;
esac
. "$root/fuzz/lib_fuzz.sh"
fuzz_toolchain '#include <vector>'
mkdir -p "$build/$target-corpus" "$build/$target-artifacts"
fuzz_compile "$build" "$target-" "-std=c++2b -stdlib=libc++ -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I$src" \
    "$here/${target}_fuzzer.cpp" "$src/codec.cpp"
# shellcheck disable=SC2086
fuzz_link "$build/nbd_${target}_fuzzer" $fuzz_objs
python3 "$here/make_seeds.py" "$target" "$build/$target-corpus"
cd "$build"
fuzz_symbolizer
exec "./nbd_${target}_fuzzer" -max_total_time="$seconds" -rss_limit_mb=1024 -timeout=10 -max_len=4096 \
    -artifact_prefix="$build/$target-artifacts/" "$target-corpus"
