#!/bin/sh
# Builds the virtio library's libFuzzer targets with clang (the library
# needs only the standard library and kernel headers) in their own build
# directory and fuzzes each for FUZZ_SECONDS (30), from a few seeds: real
# messages of a QEMU-like session, and well-formed and looping chains.
#   fuzz/virtio/run_fuzz.sh [build-dir]
# Needs: apt-get install clang-16 libc++-16-dev libc++abi-16-dev libclang-rt-16-dev
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build-virtio-fuzz}
seconds=${FUZZ_SECONDS:-30}
cxx=${CXX_FUZZ:-clang++-16}
if ! command -v "$cxx" >/dev/null 2>&1; then
    echo "SKIP: $cxx not installed (apt-get install clang-16 libc++-16-dev libc++abi-16-dev libclang-rt-16-dev)"
    exit 77
fi
mkdir -p "$build"
src="$root/src/virtio"
flags="-std=c++2b -stdlib=libc++ -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I$root/include"
runtime="$("$cxx" -print-runtime-dir)/libclang_rt.fuzzer-x86_64.a"
if [ ! -f "$runtime" ]; then
    echo "SKIP: no libFuzzer runtime at $runtime (apt-get install libclang-rt-16-dev)"
    exit 77
fi
stdcxx=$(ls /usr/lib/*-linux-gnu/libstdc++.so.6 2>/dev/null | head -n 1)
objs=""
for f in memory split_ring inflight vhost_user; do
    o="$build/$f.o"
    if [ ! -f "$o" ] || [ "$src/$f.cpp" -nt "$o" ]; then
        "$cxx" $flags -c "$src/$f.cpp" -o "$o"
    fi
    objs="$objs $o"
done
for t in vhost_user_fuzzer chain_fuzzer; do
    "$cxx" $flags -c "$here/$t.cpp" -o "$build/$t.o"
    # The libFuzzer runtime is built against libstdc++: link both.
    "$cxx" -stdlib=libc++ -fsanitize=address,undefined "$build/$t.o" $objs "$runtime" \
        "${stdcxx:--lstdc++}" -o "$build/$t"
done
python3 "$here/make_seeds.py" "$build"
cd "$build"
status=0
for t in vhost_user_fuzzer:4096 chain_fuzzer:20000; do
    name=${t%%:*}
    mkdir -p "corpus-$name"
    echo "== $name for $seconds s"
    ./$name -max_total_time="$seconds" -rss_limit_mb=1024 -timeout=10 -max_len="${t##*:}" \
        "corpus-$name" "seeds-$name" || status=$?
    [ $status -eq 0 ] || break
done
exit $status
