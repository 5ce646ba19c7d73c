# Shared by the fuzz/*/run_fuzz.sh scripts (POSIX sh, sourced): the clang
# toolchain checks, the compile step and the link step of a libFuzzer
# target built outside the GCC build (clang-16 with libc++: clang's C++23
# with libstdc++ 12 lacks pieces).
#
#   . "$root/fuzz/lib_fuzz.sh"
#   fuzz_toolchain '#include <expected>'     # exit 77 with the reason if unusable
#   fuzz_compile BUILD-DIR PREFIX "FLAGS" SOURCE...   # sets fuzz_objs
#   fuzz_link OUTPUT OBJECT...
#   fuzz_symbolizer                          # ASAN_SYMBOLIZER_PATH for reports
#
# Needs: apt-get install clang-16 libc++-16-dev libc++abi-16-dev libclang-rt-16-dev
# (scripts/install-deps.sh installs them).

fuzz_cxx=${CXX_FUZZ:-clang++-16}
fuzz_install="apt-get install clang-16 libc++-16-dev libc++abi-16-dev libclang-rt-16-dev"

# fuzz_toolchain HEADER-LINE: exits 77 (skip) with the reason when the
# compiler, libc++ (able to compile HEADER-LINE) or the libFuzzer runtime is
# missing; sets fuzz_runtime and fuzz_stdcxx.
fuzz_toolchain() {
    if ! command -v "$fuzz_cxx" >/dev/null 2>&1; then
        echo "SKIP: $fuzz_cxx not installed ($fuzz_install)"
        exit 77
    fi
    if ! echo "$1" | "$fuzz_cxx" -std=c++2b -stdlib=libc++ -x c++ -fsyntax-only - 2>/dev/null; then
        echo "SKIP: $fuzz_cxx cannot compile '$1' with libc++ ($fuzz_install)"
        exit 77
    fi
    fuzz_runtime="$("$fuzz_cxx" -print-runtime-dir)/libclang_rt.fuzzer-x86_64.a"
    if [ ! -f "$fuzz_runtime" ]; then
        echo "SKIP: no libFuzzer runtime at $fuzz_runtime ($fuzz_install)"
        exit 77
    fi
    # The libFuzzer runtime itself is built against libstdc++: link both
    # (no standard-library types cross between it and the target).
    fuzz_stdcxx=$(ls /usr/lib/*-linux-gnu/libstdc++.so.6 2>/dev/null | head -n 1)
}

# fuzz_compile BUILD-DIR PREFIX FLAGS SOURCE...: compiles each source to
# BUILD-DIR/PREFIX<name>.o, as many at a time as there are CPUs, through
# ccache when it is installed (which also notices changed headers; without
# it every source is compiled each time). Sets fuzz_objs; a failed compile
# exits 1 after the others finished.
fuzz_compile() {
    _fz_dir=$1 _fz_prefix=$2 _fz_flags=$3
    shift 3
    _fz_launcher=$(command -v ccache || true)
    _fz_jobs=$(nproc 2>/dev/null || echo 2)
    fuzz_objs="" _fz_pids="" _fz_running=0 _fz_failed=0
    for _fz_src in "$@"; do
        _fz_obj="$_fz_dir/$_fz_prefix$(basename "$_fz_src" .cpp).o"
        # shellcheck disable=SC2086
        $_fz_launcher "$fuzz_cxx" $_fz_flags -c "$_fz_src" -o "$_fz_obj" &
        _fz_pids="$_fz_pids $!"
        fuzz_objs="$fuzz_objs $_fz_obj"
        _fz_running=$((_fz_running + 1))
        if [ "$_fz_running" -ge "$_fz_jobs" ]; then
            for _fz_pid in $_fz_pids; do wait "$_fz_pid" || _fz_failed=1; done
            _fz_pids="" _fz_running=0
        fi
    done
    for _fz_pid in $_fz_pids; do wait "$_fz_pid" || _fz_failed=1; done
    if [ "$_fz_failed" -ne 0 ]; then
        echo "fuzz: compiling the fuzz target failed" >&2
        exit 1
    fi
}

# fuzz_link OUTPUT OBJECT...: links a libFuzzer target.
fuzz_link() {
    _fz_out=$1
    shift
    "$fuzz_cxx" -stdlib=libc++ -fsanitize=address,undefined "$@" "$fuzz_runtime" \
        "${fuzz_stdcxx:--lstdc++}" -o "$_fz_out"
}

# fuzz_symbolizer: symbolized stacks in crash reports, when the symbolizer
# is installed.
fuzz_symbolizer() {
    for _fz_sym in llvm-symbolizer-16 llvm-symbolizer; do
        if [ -z "${ASAN_SYMBOLIZER_PATH:-}" ] && command -v "$_fz_sym" >/dev/null 2>&1; then
            ASAN_SYMBOLIZER_PATH=$(command -v "$_fz_sym")
            export ASAN_SYMBOLIZER_PATH
        fi
    done
}
