// softblk-bench-zoned: the workloads of the zoned benchmark (the published
// zloop-against-ublk comparison, docs/benchmarks.md "Zoned devices") run
// in-process, through the consumer API's bio path, on softblk's zoned
// devices side by side:
//   null        the null target, zoned=1 memory_backed=1
//   zloop-shm   the zloop target, zone files in /dev/shm (tmpfs)
//   zloop-tmp   the zloop target, zone files in /var/tmp
//   zloop-ram   the zloop target's RAM variant
// Devices of 512 MiB in 16 MiB zones, no conventional zones, no limits,
// queue depth 128, irqmode=0 (as bench/zoned/vm_guest.sh). Workloads, as
// fio --zonemode=zbd runs them: 4 KiB random write QD 1 x 1 job, 4 KiB
// random write QD 32 x 8 jobs (job j writes the zones z with z % 8 == j:
// no two jobs share a zone), 128 KiB random write QD 32 x 1 job, 128 KiB
// sequential write QD 32 x 1 job; each with 1 and 2 queues. A random write
// goes to the write pointer of a zone chosen at random among the job's
// zones; a zone that fills is reset once its writes have completed (and
// not chosen meanwhile); the sequential job writes the zones in order and
// starts over. Jobs are spread over the queues (job j on queue j % queues),
// one thread per queue driving its jobs, as fio's jobs land on the hardware
// queue of their CPU; a single job uses queue 0.
//
// Each workload runs on each device in turn for --rounds rounds; printed:
// the median IOPS and MiB/s of each device, and each device's ratio to
// the null device (the median of the per-round ratios), and the heap
// allocations of the measured loops: the bio path and the zloop queues
// make none; the memory store (null, zloop-ram) allocates its 1 MiB chunks
// and page-table nodes when fresh memory is first written, and its list of
// pages returned to the kernel grows when a reset frees more than the store
// keeps for reuse.
//
// Usage: softblk-bench-zoned [--seconds S] [--rounds N] [--queues 1|2|12]
//                            [--only NAME[,NAME...]]
#include <softblk/device.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fmt/core.h>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <tuple>
#include <unistd.h>
#include <vector>

#include "bench_support.hpp"

namespace {

using namespace softblk;
using bench::now_ns;
using bench::xorshift;

constexpr uint64_t k_mib = 1 << 20;
constexpr uint64_t k_capacity_mb = 512;
constexpr uint64_t k_zone_mb = 16;
constexpr unsigned k_depth = 128;

struct workload {
    const char* name;
    uint32_t block;
    unsigned depth;
    unsigned jobs;
    bool sequential;
};
constexpr workload k_workloads[] = {
    {"randwrite 4k QD1 x1", 4096, 1, 1, false},
    {"randwrite 4k QD32 x8", 4096, 32, 8, false},
    {"randwrite 128k QD32 x1", 128 << 10, 32, 1, false},
    {"write 128k QD32 x1", 128 << 10, 32, 1, true},
};

struct system_def {
    std::string name;
    std::string type;
    std::string dir;  // zloop: the base directory ("" otherwise)
    int id = 0;       // zloop: the device ID (unique in the process, as the kernel's)
};

// One job: its zones (their index in the device), where it writes next in
// each, how many of its writes each has in flight, and its requests.
struct job {
    struct slot {
        bio b;
        job* owner = nullptr;
        uint32_t zone = 0;  // index in `zones`
        bool reset = false;
    };

    io_queue* queue = nullptr;
    uint64_t zone_bytes = 0;
    uint32_t block = 0;
    bool sequential = false;
    std::vector<uint32_t> zones;
    std::vector<uint64_t> written;   // bytes submitted into each zone
    std::vector<uint32_t> inflight;  // writes in flight per zone
    std::vector<uint8_t> full;       // waits for its reset
    std::vector<slot> slots;         // depth writes + one reset
    std::vector<slot*> free_slots;
    slot* reset_slot = nullptr;
    bool reset_busy = false;
    size_t next_seq = 0;
    xorshift rng{0x9E3779B97F4A7C15ull};
    std::vector<char> buffer;
    uint64_t completed = 0;
    uint64_t errors = 0;
    int first_error = 0;

    static void on_complete(bio& b, int status)
    {
        auto* s = static_cast<slot*>(b.user_data);
        job& j = *s->owner;
        if (status < 0) {
            ++j.errors;
            j.first_error = j.first_error != 0 ? j.first_error : status;
        }
        if (s->reset) {
            j.written[s->zone] = 0;
            j.full[s->zone] = 0;
            j.reset_busy = false;
            return;
        }
        if (status == 0) {
            ++j.completed;
        }
        --j.inflight[s->zone];
        j.free_slots.push_back(s);
    }

    // A zone for the next write that is not full, or -1.
    int pick()
    {
        const size_t n = zones.size();
        size_t at = sequential ? next_seq : rng.next() % n;
        for (size_t tries = 0; tries < n; ++tries, at = (at + 1) % n) {
            if (full[at] == 0) {
                if (sequential) {
                    next_seq = at;
                }
                return static_cast<int>(at);
            }
        }
        return -1;
    }

    // Resets one full zone whose writes have all completed (one reset in
    // flight at a time, as fio resets a zone it found full).
    void reset_one()
    {
        if (reset_busy) {
            return;
        }
        for (size_t z = 0; z < zones.size(); ++z) {
            if (full[z] != 0 && inflight[z] == 0) {
                reset_busy = true;
                reset_slot->zone = static_cast<uint32_t>(z);
                reset_slot->b = make_bio(io_op::zone_reset, zones[z] * zone_bytes, 0, nullptr);
                reset_slot->b.on_complete = on_complete;
                reset_slot->b.user_data = reset_slot;
                queue->submit(reset_slot->b);
                return;
            }
        }
    }

    // Submits a write for each request free now (no more: with inline
    // completions a request is free again as soon as it is submitted) or
    // until no zone can take one.
    void fill()
    {
        for (size_t n = free_slots.size(); n > 0 && !free_slots.empty(); --n) {
            const int z = pick();
            if (z < 0) {
                break;
            }
            slot* s = free_slots.back();
            free_slots.pop_back();
            const uint64_t offset = zones[static_cast<size_t>(z)] * zone_bytes + written[z];
            written[z] += block;
            if (written[z] + block > zone_bytes) {
                full[z] = 1;
                next_seq = (next_seq + 1) % zones.size();
            }
            ++inflight[z];
            s->zone = static_cast<uint32_t>(z);
            s->b = make_bio(io_op::write, offset, block, buffer.data());
            s->b.on_complete = on_complete;
            s->b.user_data = s;
            queue->submit(s->b);
        }
        reset_one();
    }
};

// Runs `jobs` (all on `q`) until `deadline`; returns the completions when it
// passed. Then drains. The queue's thread.
uint64_t drive(io_queue& q, std::vector<job*>& jobs, uint64_t deadline, uint64_t& stopped_at);

// A thread that drives one queue for the device's whole life: a queue's
// io_uring (zloop) takes submissions from one thread only
// (IORING_SETUP_SINGLE_ISSUER), as the core's model has it.
class queue_worker {
public:
    explicit queue_worker(io_queue& q) : _q(q), _thread([this] { loop(); }) {}
    ~queue_worker()
    {
        {
            std::lock_guard guard(_lock);
            _exit = true;
        }
        _cv.notify_all();
        _thread.join();
    }
    queue_worker(const queue_worker&) = delete;
    queue_worker& operator=(const queue_worker&) = delete;

    // Starts driving `jobs` until `deadline`; collect() waits for the end.
    void start(std::vector<job*>* jobs, uint64_t deadline)
    {
        std::lock_guard guard(_lock);
        _jobs = jobs;
        _deadline = deadline;
        _busy = true;
        _cv.notify_all();
    }
    // Completions at the deadline, and when it was seen.
    std::pair<uint64_t, uint64_t> collect()
    {
        std::unique_lock guard(_lock);
        _cv.wait(guard, [this] { return !_busy; });
        return {_done, _stopped};
    }

private:
    void loop()
    {
        std::unique_lock guard(_lock);
        for (;;) {
            _cv.wait(guard, [this] { return _busy || _exit; });
            if (_exit) {
                return;
            }
            guard.unlock();
            uint64_t stopped = 0;
            const uint64_t done = drive(_q, *_jobs, _deadline, stopped);
            guard.lock();
            _done = done;
            _stopped = stopped;
            _busy = false;
            _cv.notify_all();
        }
    }

    io_queue& _q;
    std::mutex _lock;
    std::condition_variable _cv;
    std::vector<job*>* _jobs = nullptr;
    uint64_t _deadline = 0;
    uint64_t _done = 0;
    uint64_t _stopped = 0;
    bool _busy = false;
    bool _exit = false;
    std::thread _thread;  // last: starts once the rest is made
};

// Runs `jobs` (all on `q`) until `deadline`; returns the completions when it
// passed. Then drains. The queue's thread.
uint64_t drive(io_queue& q, std::vector<job*>& jobs, uint64_t deadline, uint64_t& stopped_at)
{
    uint64_t at_stop = 0;
    for (;;) {
        for (job* j : jobs) {
            j->fill();
        }
        if (q.process() == 0 && q.in_flight() > 0) {
            q.wait(1, 200'000);
        }
        const uint64_t now = now_ns();
        if (now >= deadline) {
            stopped_at = now;
            for (job* j : jobs) {
                at_stop += j->completed;
            }
            break;
        }
    }
    while (q.in_flight() > 0) {
        q.wait(q.in_flight(), 1'000'000'000);
    }
    return at_stop;
}

struct measurement {
    double iops = 0;
    double mib_s = 0;
    uint64_t errors = 0;
    int first_error = 0;
    uint64_t allocations = 0;
};

// `workers[q]` drives queue q >= 1 (queue 0: the calling thread).
measurement run(device& d, const workload& w, unsigned queues, double seconds,
                std::vector<std::unique_ptr<queue_worker>>& workers)
{
    const uint64_t zone_bytes = d.limits().zone_size_bytes;
    const uint32_t nr_zones = static_cast<uint32_t>(zone_count(d.limits()));
    // Every zone empty (reset all is one request).
    bio all = make_bio(io_op::zone_reset_all, 0, 0, nullptr);
    if (const int rc = d.queue(0).run(all); rc < 0) {
        fmt::print(stderr, "softblk-bench-zoned: reset all: {}\n", std::strerror(-rc));
        std::exit(1);
    }
    std::vector<std::unique_ptr<job>> jobs;
    for (unsigned i = 0; i < w.jobs; ++i) {
        auto j = std::make_unique<job>();
        j->queue = &d.queue(i % queues);
        j->zone_bytes = zone_bytes;
        j->block = w.block;
        j->sequential = w.sequential;
        j->rng.s += i * 0x51ED27u;
        for (uint32_t z = i; z < nr_zones; z += w.jobs) {
            j->zones.push_back(z);
        }
        j->written.assign(j->zones.size(), 0);
        j->inflight.assign(j->zones.size(), 0);
        j->full.assign(j->zones.size(), 0);
        j->slots.resize(w.depth + 1);
        for (auto& s : j->slots) {
            s.owner = j.get();
        }
        for (unsigned k = 0; k < w.depth; ++k) {
            j->free_slots.push_back(&j->slots[k]);
        }
        j->reset_slot = &j->slots[w.depth];
        j->reset_slot->reset = true;
        j->free_slots.reserve(w.depth);
        j->buffer.assign(w.block, static_cast<char>(0x5a + i));
        jobs.push_back(std::move(j));
    }
    // One thread per queue that has jobs.
    std::vector<std::vector<job*>> per_queue(queues);
    for (auto& j : jobs) {
        per_queue[static_cast<size_t>(j->queue->index())].push_back(j.get());
    }
    std::vector<uint64_t> done(queues, 0);
    std::vector<uint64_t> stopped(queues, 0);
    const uint64_t alloc_before = bench::allocations();
    const uint64_t start = now_ns();
    const uint64_t deadline = start + static_cast<uint64_t>(seconds * 1e9);
    for (unsigned q = 1; q < queues; ++q) {
        if (!per_queue[q].empty()) {
            workers[q]->start(&per_queue[q], deadline);
        }
    }
    if (!per_queue[0].empty()) {
        done[0] = drive(d.queue(0), per_queue[0], deadline, stopped[0]);
    }
    for (unsigned q = 1; q < queues; ++q) {
        if (!per_queue[q].empty()) {
            std::tie(done[q], stopped[q]) = workers[q]->collect();
        }
    }
    const uint64_t allocations = bench::allocations() - alloc_before;
    measurement m;
    uint64_t ios = 0;
    uint64_t end = start;
    for (unsigned q = 0; q < queues; ++q) {
        ios += done[q];
        end = std::max(end, stopped[q]);
    }
    const double secs = static_cast<double>(end - start) / 1e9;
    m.iops = static_cast<double>(ios) / secs;
    m.mib_s = m.iops * w.block / static_cast<double>(k_mib);
    for (auto& j : jobs) {
        m.errors += j->errors;
        m.first_error = m.first_error != 0 ? m.first_error : j->first_error;
    }
    m.allocations = allocations;
    return m;
}

std::unique_ptr<device> make_device(const system_def& s, unsigned queues)
{
    std::vector<std::string> o;
    if (s.type == "null") {
        o = {"zoned=1",
             fmt::format("size={}", k_capacity_mb),
             fmt::format("zone_size={}", k_zone_mb),
             "zone_nr_conv=0",
             "bs=4096",
             "memory_backed=1",
             fmt::format("submit_queues={}", queues),
             fmt::format("hw_queue_depth={}", k_depth)};
    } else {
        o = {fmt::format("capacity_mb={}", k_capacity_mb),
             fmt::format("zone_size_mb={}", k_zone_mb), "conv_zones=0",
             fmt::format("nr_queues={}", queues), fmt::format("queue_depth={}", k_depth)};
        if (!s.dir.empty()) {
            const std::string dir = fmt::format("{}/{}", s.dir, s.id);
            std::filesystem::remove_all(dir);
            std::filesystem::create_directories(dir);
            o.push_back("base_dir=" + s.dir);
            o.push_back(fmt::format("id={}", s.id));
        }
    }
    o.push_back("irqmode=0");
    o.push_back("poll_queues=0");
    auto d = device::create("bench-" + s.name, s.type, o);
    if (!d) {
        fmt::print(stderr, "softblk-bench-zoned: {}: {}\n", s.name, d.error().message);
        if (!s.dir.empty()) {
            std::filesystem::remove_all(s.dir);
        }
        std::exit(1);
    }
    return std::move(*d);
}

double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n == 0 ? 0 : (n % 2 != 0 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2);
}

}  // namespace

int main(int argc, char** argv)
{
    double seconds = 3;
    unsigned rounds = 3;
    std::vector<unsigned> queue_counts{1, 2};
    std::string only;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--seconds" && i + 1 < argc) {
            seconds = std::atof(argv[++i]);
        } else if (a == "--rounds" && i + 1 < argc) {
            rounds = static_cast<unsigned>(std::atoi(argv[++i]));
        } else if (a == "--queues" && i + 1 < argc) {
            const std::string q = argv[++i];
            queue_counts.clear();
            for (char c : q) {
                if (c == '1' || c == '2') {
                    queue_counts.push_back(static_cast<unsigned>(c - '0'));
                }
            }
        } else if (a == "--only" && i + 1 < argc) {
            only = argv[++i];
        } else {
            fmt::print(stderr,
                       "usage: softblk-bench-zoned [--seconds S] [--rounds N] [--queues "
                       "1|2|12] [--only NAME[,NAME...]]\n");
            return 2;
        }
    }
    if (seconds <= 0 || rounds == 0 || queue_counts.empty()) {
        fmt::print(stderr,
                   "softblk-bench-zoned: --seconds, --rounds and --queues must be "
                   "positive\n");
        return 2;
    }
    const std::string tag = fmt::format("softblk-bench-zoned.{}", ::getpid());
    std::vector<system_def> systems{{"null", "null", ""},
                                    {"zloop-shm", "zloop", "/dev/shm/" + tag, 0},
                                    {"zloop-tmp", "zloop", "/var/tmp/" + tag, 1},
                                    {"zloop-ram", "zloop-ram", ""}};
    if (!only.empty()) {
        std::erase_if(systems, [&](const system_def& s) {
            return ("," + only + ",").find("," + s.name + ",") == std::string::npos;
        });
    }
    fmt::print(
        "softblk-bench-zoned: {} s per run, {} rounds; devices of {} MiB in {} MiB zones, "
        "depth {}, irqmode=0\n",
        seconds, rounds, k_capacity_mb, k_zone_mb, k_depth);
    for (unsigned queues : queue_counts) {
        std::vector<std::unique_ptr<device>> devs;
        // workers[device][queue], queue 0 left to this thread.
        std::vector<std::vector<std::unique_ptr<queue_worker>>> workers;
        for (const system_def& s : systems) {
            devs.push_back(make_device(s, queues));
            workers.emplace_back(queues);
            for (unsigned q = 1; q < queues; ++q) {
                workers.back()[q] = std::make_unique<queue_worker>(devs.back()->queue(q));
            }
            nlohmann::json j;
            devs.back()->describe(j);
            const auto& t = j["target"];
            if (t.contains("notice")) {
                fmt::print("  {}: {}\n", s.name, t["notice"].get<std::string>());
            } else if (t.contains("direct_io")) {
                fmt::print("  {}: {} (direct I/O {})\n", s.name, t["dir"].get<std::string>(),
                           t["direct_io"].get<bool>() ? "on" : "off");
            }
        }
        // results[workload][system]: per-round IOPS and MiB/s.
        std::map<std::pair<size_t, size_t>, std::vector<measurement>> results;
        for (unsigned round = 0; round < rounds; ++round) {
            for (size_t w = 0; w < std::size(k_workloads); ++w) {
                for (size_t s = 0; s < systems.size(); ++s) {
                    const measurement m =
                        run(*devs[s], k_workloads[w], queues, seconds, workers[s]);
                    results[{w, s}].push_back(m);
                    fmt::print(
                        "round {} q{} {:<10} {:<24} {:>9.0f} IOPS {:>8.1f} MiB/s  {} "
                        "errors{}  {} allocations\n",
                        round + 1, queues, systems[s].name, k_workloads[w].name, m.iops, m.mib_s,
                        m.errors,
                        m.errors != 0 ? fmt::format(" (first: {})", std::strerror(-m.first_error))
                                      : "",
                        m.allocations);
                }
            }
        }
        fmt::print(
            "\nqueues {}: median IOPS (MiB/s); ratio = median of the per-round ratios "
            "to null\n",
            queues);
        fmt::print("| workload |");
        for (const system_def& s : systems) {
            fmt::print(" {} |", s.name);
        }
        for (size_t s = 1; s < systems.size(); ++s) {
            fmt::print(" {}/{} |", systems[s].name, systems[0].name);
        }
        fmt::print("\n|---|");
        for (size_t s = 0; s < 2 * systems.size() - 1; ++s) {
            fmt::print("---:|");
        }
        fmt::print("\n");
        for (size_t w = 0; w < std::size(k_workloads); ++w) {
            fmt::print("| {} |", k_workloads[w].name);
            for (size_t s = 0; s < systems.size(); ++s) {
                std::vector<double> iops;
                std::vector<double> bw;
                for (const measurement& m : results[{w, s}]) {
                    iops.push_back(m.iops);
                    bw.push_back(m.mib_s);
                }
                fmt::print(" {:.0f} ({:.1f}) |", median(iops), median(bw));
            }
            for (size_t s = 1; s < systems.size(); ++s) {
                std::vector<double> ratios;
                for (unsigned r = 0; r < rounds; ++r) {
                    const double base = results[{w, 0}][r].iops;
                    ratios.push_back(base > 0 ? results[{w, s}][r].iops / base : 0);
                }
                fmt::print(" {:.2f} |", median(ratios));
            }
            fmt::print("\n");
        }
        fmt::print("\n");
        workers.clear();
        devs.clear();
        for (const system_def& s : systems) {
            if (!s.dir.empty()) {
                std::filesystem::remove_all(s.dir);
            }
        }
    }
    return 0;
}
