// `softblk bench`: finds the benchmark driver and execs it. The plans, their
// options and their errors (unknown plan, root needed) are the driver's;
// this file only finds it and tells it which softblk build it measures.
#include "bench_command.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>
#include <unistd.h>

#include <fmt/format.h>

namespace softblk::cli {

namespace {

constexpr const char* k_driver_name = "softblk_bench.py";

std::filesystem::path self_path()
{
    std::error_code ec;
    auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
    return ec ? std::filesystem::path{} : p;
}

// Whether `path` (a resolved path) lies under `dir` (which may go through
// symbolic links).
bool inside(const std::filesystem::path& path, const std::filesystem::path& dir)
{
    std::error_code ec;
    auto real_dir = std::filesystem::weakly_canonical(dir, ec);
    auto rel = path.lexically_relative(ec ? dir : real_dir);
    return !rel.empty() && *rel.begin() != "..";
}

}  // namespace

std::vector<std::filesystem::path> bench_driver_candidates(const std::filesystem::path& self)
{
    std::vector<std::filesystem::path> out;
    if (const char* env = std::getenv("SOFTBLK_BENCH_DRIVER"); env != nullptr && *env != '\0') {
        out.emplace_back(env);
    }
    if (!self.empty()) {
        out.push_back(self.parent_path().parent_path() / SOFTBLK_INSTALL_LIBEXECDIR / "softblk" /
                      k_driver_name);
    }
    out.push_back(std::filesystem::path{SOFTBLK_SOURCE_DIR} / "bench" / "plans" / k_driver_name);
    return out;
}

int run_bench(int argc, char** argv)
{
    const auto self = self_path();
    const auto candidates = bench_driver_candidates(self);
    // A driver named by the caller is that one or none: no silent fallback
    // to another copy.
    if (const char* env = std::getenv("SOFTBLK_BENCH_DRIVER");
        env != nullptr && *env != '\0' && ::access(env, X_OK) != 0) {
        fmt::print(stderr,
                   "softblk bench: SOFTBLK_BENCH_DRIVER={}: not an executable file ({}); unset it "
                   "to use the driver of softblk's source tree or install\n",
                   env, std::strerror(errno));
        return 1;
    }
    const std::filesystem::path* driver = nullptr;
    for (const auto& c : candidates) {
        if (::access(c.c_str(), X_OK) == 0) {
            driver = &c;
            break;
        }
    }
    if (driver == nullptr) {
        std::string tried;
        for (const auto& c : candidates) {
            tried += fmt::format("\n  {}", c.string());
        }
        fmt::print(stderr,
                   "softblk bench: the benchmark driver ({}) was not found; looked at:{}\n"
                   "It lives in softblk's source tree under bench/plans/: set "
                   "SOFTBLK_BENCH_DRIVER=PATH to use a copy elsewhere.\n",
                   k_driver_name, tried);
        return 1;
    }
    // The driver measures this build: this program, and the bench programs
    // of its build tree when it runs from one.
    if (!self.empty()) {
        ::setenv("SOFTBLK_BENCH_SOFTBLK", self.c_str(), 1);
        if (inside(self, SOFTBLK_BINARY_DIR)) {
            ::setenv("SOFTBLK_BENCH_BUILD_DIR", SOFTBLK_BINARY_DIR, 1);
        }
    }
    ::setenv("SOFTBLK_BENCH_VERSION", SOFTBLK_VERSION, 1);
    std::vector<char*> args;
    std::string path = driver->string();
    args.push_back(path.data());
    for (int i = 1; i < argc; ++i) {
        args.push_back(argv[i]);
    }
    args.push_back(nullptr);
    ::execv(path.c_str(), args.data());
    const int err = errno;
    fmt::print(stderr, "softblk bench: cannot run {}: {}{}\n", path, std::strerror(err),
               err == ENOENT ? " (the driver needs python3 on PATH)" : "");
    return 1;
}

}  // namespace softblk::cli
