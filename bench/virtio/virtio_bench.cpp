// softblk-bench-virtio: drives a vhost-user-blk back end through softblk's
// virtio-blk driver (target type "virtio") and reports what one job did:
// IOPS, MiB/s and this process's CPU time per I/O (user + system, all
// threads). bench/virtio/run.sh runs it against softblk's back end and
// qemu-storage-daemon's and measures the back ends' CPU from outside.
//
//   softblk-bench-virtio --path SOCKET [--rw randread|randwrite|read|write]
//       [--bs BYTES] [--qd N] [--seconds S] [--size MiB] [--queues N]
//       [--opt KEY=VALUE]...
//
// --queues N runs N threads, each driving its own device queue (and
// virtqueue) with --qd requests in flight. --backend-pid PID adds the back
// end's CPU time per I/O: the CPU time of the whole process (all threads,
// exited ones included; /proc/PID/stat, clock ticks) from when the rings
// are up to when the job ends, before the connection closes. Prints one
// JSON line.
#include <softblk/device.hpp>
#include <softblk/support/clock.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <sys/resource.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

namespace {

struct job {
    std::string path;
    std::string rw = "randread";
    uint64_t bs = 4096;
    unsigned qd = 1;
    double seconds = 5;
    uint64_t size_mib = 256;
    unsigned queues = 1;
    int backend_pid = 0;
    std::vector<std::string> options;
};

struct slot {
    softblk::bio b;
    std::vector<uint8_t> buf;
    struct worker* w = nullptr;
};

struct worker {
    softblk::io_queue* q = nullptr;
    const job* j = nullptr;
    std::mt19937_64 rng;
    uint64_t next_seq = 0;
    uint64_t span = 0;  // bytes this worker covers
    uint64_t base = 0;
    uint64_t done = 0;
    uint64_t errors = 0;
    bool stop = false;
    unsigned outstanding = 0;

    void fill(softblk::bio& b)
    {
        const uint64_t blocks = span / j->bs;
        uint64_t blk;
        if (j->rw == "read" || j->rw == "write") {
            blk = next_seq++ % blocks;
        } else {
            blk = rng() % blocks;
        }
        b.offset = base + blk * j->bs;
        b.length = j->bs;
        b.op =
            j->rw.find("write") != std::string::npos ? softblk::io_op::write : softblk::io_op::read;
    }
};

void on_done(softblk::bio& b, int status)
{
    auto& s = *static_cast<slot*>(b.user_data);
    worker& w = *s.w;
    if (status != 0) {
        ++w.errors;
    }
    ++w.done;
    if (w.stop) {
        --w.outstanding;
        return;
    }
    w.fill(b);
    w.q->submit(b);
}

double cpu_seconds()
{
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// Nanoseconds of CPU time process `pid` has used, all its threads, also
// those that have exited (utime + stime of /proc/PID/stat, in clock
// ticks), or 0. Not the sum of /proc/PID/task/*/schedstat: a back end's
// short-lived threads (io_uring's io-wq workers, thread pools) exit during
// a run and take their time out of that sum, which then shrinks.
uint64_t run_ns(int pid)
{
    if (pid <= 0) {
        return 0;
    }
    std::ifstream in(fmt::format("/proc/{}/stat", pid));
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // The command name (field 2) may hold spaces and parentheses: count
    // the fields after its last ')'. utime and stime are fields 14 and 15.
    const auto close = stat.rfind(')');
    if (close == std::string::npos) {
        return 0;
    }
    std::istringstream fields(stat.substr(close + 1));
    std::string field;
    uint64_t utime = 0, stime = 0;
    for (int n = 3; n <= 15 && fields >> field; ++n) {
        if (n == 14) {
            utime = std::strtoull(field.c_str(), nullptr, 10);
        } else if (n == 15) {
            stime = std::strtoull(field.c_str(), nullptr, 10);
        }
    }
    const auto tick = static_cast<uint64_t>(sysconf(_SC_CLK_TCK));
    return tick == 0 ? 0 : (utime + stime) * (1'000'000'000 / tick);
}

int usage(const char* self)
{
    fmt::print(stderr,
               "usage: {} --path SOCKET [--rw randread|randwrite|read|write] [--bs BYTES] [--qd N] "
               "[--seconds S] [--size MiB] [--queues N] [--backend-pid PID] [--opt KEY=VALUE]...\n",
               self);
    return 2;
}

}  // namespace

int main(int argc, char** argv)
{
    job j;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
        if (a == "--path") {
            j.path = value();
        } else if (a == "--rw") {
            j.rw = value();
        } else if (a == "--bs") {
            j.bs = std::stoull(value());
        } else if (a == "--qd") {
            j.qd = static_cast<unsigned>(std::stoul(value()));
        } else if (a == "--seconds") {
            j.seconds = std::stod(value());
        } else if (a == "--size") {
            j.size_mib = std::stoull(value());
        } else if (a == "--queues") {
            j.queues = static_cast<unsigned>(std::stoul(value()));
        } else if (a == "--backend-pid") {
            j.backend_pid = std::stoi(value());
        } else if (a == "--opt") {
            j.options.push_back(value());
        } else {
            return usage(argv[0]);
        }
    }
    if (j.path.empty() || j.qd == 0 || j.bs == 0 || j.queues == 0) {
        return usage(argv[0]);
    }
    std::vector<std::string> opts = j.options;
    opts.push_back("path=" + j.path);
    opts.push_back(fmt::format("submit_queues={}", j.queues));
    bool has_poll_queues = false;
    bool has_depth = false;
    for (const auto& o : j.options) {
        has_poll_queues = has_poll_queues || o.rfind("poll_queues=", 0) == 0;
        has_depth = has_depth || o.rfind("hw_queue_depth=", 0) == 0;
    }
    if (!has_poll_queues) {
        opts.push_back("poll_queues=0");
    }
    if (!has_depth) {
        opts.push_back(fmt::format("hw_queue_depth={}", std::max(j.qd, 1u)));
    }
    auto dev = softblk::device::create("bench", "virtio", opts);
    if (!dev) {
        fmt::print(stderr, "{}\n", dev.error().message);
        return 1;
    }
    softblk::device& d = **dev;
    const uint64_t capacity = std::min<uint64_t>(d.limits().capacity_bytes, j.size_mib << 20);
    std::vector<worker> workers(j.queues);
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    const double cpu0 = cpu_seconds();
    const uint64_t backend0 = run_ns(j.backend_pid);
    uint64_t t0 = 0;
    for (unsigned q = 0; q < j.queues; ++q) {
        worker& w = workers[q];
        w.q = &d.queue(q);
        w.j = &j;
        w.rng.seed(q + 1);
        w.span = capacity / j.queues / j.bs * j.bs;
        w.base = q * w.span;
        threads.emplace_back([&w, &j, &go] {
            std::vector<slot> slots(j.qd);
            while (!go.load(std::memory_order_acquire)) {
            }
            const uint64_t end = softblk::monotonic_ns() + static_cast<uint64_t>(j.seconds * 1e9);
            for (slot& s : slots) {
                s.buf.assign(j.bs, 0x5a);
                s.w = &w;
                s.b.buffer = s.buf.data();
                s.b.on_complete = on_done;
                s.b.user_data = &s;
                w.fill(s.b);
                ++w.outstanding;
                w.q->submit(s.b);
            }
            while (softblk::monotonic_ns() < end) {
                w.q->wait(1, 100'000'000);
            }
            w.stop = true;
            while (w.outstanding > 0) {
                w.q->wait(1, 100'000'000);
            }
        });
    }
    t0 = softblk::monotonic_ns();
    go.store(true, std::memory_order_release);
    for (auto& t : threads) {
        t.join();
    }
    const double elapsed = static_cast<double>(softblk::monotonic_ns() - t0) / 1e9;
    const double cpu = cpu_seconds() - cpu0;
    const uint64_t backend_ns = run_ns(j.backend_pid) - backend0;
    uint64_t ios = 0, errors = 0;
    for (const auto& w : workers) {
        ios += w.done;
        errors += w.errors;
    }
    nlohmann::json out = {{"rw", j.rw},
                          {"bs", j.bs},
                          {"qd", j.qd},
                          {"queues", j.queues},
                          {"seconds", elapsed},
                          {"ios", ios},
                          {"errors", errors},
                          {"iops", static_cast<double>(ios) / elapsed},
                          {"mib_s", static_cast<double>(ios * j.bs) / elapsed / (1 << 20)},
                          {"cpu_s", cpu},
                          {"cpu_us_per_io", ios ? cpu * 1e6 / static_cast<double>(ios) : 0.0}};
    if (j.backend_pid > 0) {
        out["backend_cpu_us_per_io"] =
            ios ? static_cast<double>(backend_ns) / 1e3 / static_cast<double>(ios) : 0.0;
    }
    fmt::print("{}\n", out.dump());
    return errors == 0 ? 0 : 1;
}
