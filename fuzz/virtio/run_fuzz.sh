#!/bin/sh
# Builds the virtio library's libFuzzer targets with clang (the library
# needs only the standard library and kernel headers) in their own build
# directory and fuzzes each for FUZZ_SECONDS (30), from a few seeds: real
# messages of a QEMU-like session, and well-formed and looping chains.
#   fuzz/virtio/run_fuzz.sh [build-dir]
# Needs: clang-16 and libc++ (fuzz/lib_fuzz.sh; scripts/install-deps.sh
# installs them).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build-virtio-fuzz}
seconds=${FUZZ_SECONDS:-30}
. "$root/fuzz/lib_fuzz.sh"
fuzz_toolchain '#include <vector>'
mkdir -p "$build"
src="$root/src/virtio"
flags="-std=c++2b -stdlib=libc++ -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I$root/include"
fuzz_compile "$build" "" "$flags" "$src/memory.cpp" "$src/split_ring.cpp" "$src/inflight.cpp" \
    "$src/vhost_user.cpp" "$here/vhost_user_fuzzer.cpp" "$here/chain_fuzzer.cpp"
library="$build/memory.o $build/split_ring.o $build/inflight.o $build/vhost_user.o"
for t in vhost_user_fuzzer chain_fuzzer; do
    # shellcheck disable=SC2086
    fuzz_link "$build/$t" "$build/$t.o" $library
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
