#!/bin/sh
# Builds the NBD codec libFuzzer target with clang (Debian's clang 14 and
# libclang-rt-14-dev; the codec needs only the standard library) in its own
# build directory and fuzzes for FUZZ_SECONDS (30) from a small seed corpus
# of real handshakes.
#   fuzz/nbd/run_fuzz.sh [build-dir]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build-nbd-fuzz}
seconds=${FUZZ_SECONDS:-30}
cxx=${CXX_FUZZ:-clang++}
if ! command -v "$cxx" >/dev/null 2>&1; then
    echo "SKIP: $cxx not installed (apt-get install clang libclang-rt-14-dev)"
    exit 77
fi
mkdir -p "$build/corpus"
src="$root/src/frontends/nbd"
"$cxx" -std=c++2b -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$src" "$here/codec_fuzzer.cpp" "$src/codec.cpp" -o "$build/nbd_codec_fuzzer"
python3 "$here/make_seeds.py" "$build/corpus"
cd "$build"
exec ./nbd_codec_fuzzer -max_total_time="$seconds" -rss_limit_mb=1024 -timeout=10 -max_len=4096 corpus
