// softblk-bench-core: in-process benchmarks of the null target.
//
//   1. null target without memory, 4 KiB random reads, QD 32, one queue, one
//      thread: IOPS and ns per I/O, for irqmode=0 (inline) and irqmode=1
//      (deferred, null_blk's default).
//   2. memory-backed 4 KiB random writes, QD 32: IOPS, and the ratio to this
//      machine's single-core 4 KiB memcpy rate measured in the same run into
//      a buffer of the same size as the device, advised for huge pages as
//      the store's chunks are (the line "transparent huge pages" says what
//      each got), and, for reference, into one hot 4 KiB buffer; on a 1 GiB
//      device (memory-bound) and a 16 MiB one (mostly in cache, so the
//      store's own cost shows). The allocated device's writes and reads,
//      the memcpy and a copy with streaming stores (the store's copy for
//      a store twice the last-level cache: src/core/stream_copy.hpp) run
//      interleaved in slices of about 0.25 s; the JSON records carry the
//      slices' ratios (wall clock and thread CPU time), which compare
//      store and copy under the same load.
//      Before those, the time to write a fresh device of that size in full
//      with 1 MiB writes in order (what mkfs or a first fio job meets: every
//      chunk of the store is populated on the way), and the chunks its
//      store took (huge_pages, docs/null.md).
//   3. memory use of a memory-backed device: bytes of RAM per GiB written and
//      per GiB of capacity, from memory_bytes() and from the process RSS.
//
// Every measured loop counts heap allocations (operator new) and prints
// them: the hot path must show 0.
//
// Usage: softblk-bench-core [--seconds S] [--only null|memory|fill|ram]
//                           [--huge-pages auto|0|1] [--memory-mib N] [--json]
//        softblk-bench-core --seconds S --random read|write --depth N [--bs BYTES]
//                           --opts "k=v ..."
//   --huge-pages    the memory-backed devices' huge_pages (default: theirs)
//   --only fill     the 1 GiB fill of 2. alone, to repeat run after run
//   --memory-mib N  part 2 on one device of N MiB (default: 1024 and 16)
//   --json          one JSON object per measurement on stdout ({"case",
//                   "system", "iops", "extra"}), for `softblk bench core`;
//                   the text goes to stderr
// The second form runs one workload, random I/O of --bs bytes (default 4 KiB)
// at queue depth N on a null device made from the options, and prints `iops N`: the in-process
// side of bench/fio/compare.sh.
#include <softblk/device.hpp>

#include "bench_support.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <thread>
#include <new>
#include <string>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace {

using namespace softblk;
using bench::now_ns;
using bench::xorshift;

// AnonHugePages of the process (transparent huge pages), in bytes.
uint64_t anon_huge_bytes()
{
    FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
    if (f == nullptr) {
        return 0;
    }
    char line[256];
    unsigned long kib = 0;
    while (std::fgets(line, sizeof(line), f) != nullptr) {
        if (std::sscanf(line, "AnonHugePages: %lu kB", &kib) == 1) {
            break;
        }
    }
    std::fclose(f);
    return uint64_t{kib} << 10;
}

// CPU time of the calling thread: what a slice cost while it ran, which on
// a loaded machine is steadier than the wall clock.
uint64_t thread_cpu_ns()
{
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(t.tv_nsec);
}

// Where the text goes: stdout, or stderr when stdout carries JSON lines.
FILE* g_text = stdout;
bool g_json = false;

void emit(const nlohmann::json& record)
{
    if (g_json) {
        fmt::print("{}\n", record.dump());
        std::fflush(stdout);
    }
}

uint64_t rss_bytes()
{
    FILE* f = std::fopen("/proc/self/statm", "r");
    if (f == nullptr) {
        return 0;
    }
    unsigned long size = 0;
    unsigned long resident = 0;
    if (std::fscanf(f, "%lu %lu", &size, &resident) != 2) {
        resident = 0;
    }
    std::fclose(f);
    return uint64_t{resident} * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// --huge-pages: huge_pages=... for every memory-backed device, or empty.
std::string g_huge_pages;

std::unique_ptr<device> create(std::vector<std::string> options)
{
    if (!g_huge_pages.empty() &&
        std::find(options.begin(), options.end(), "memory_backed=1") != options.end()) {
        options.push_back("huge_pages=" + g_huge_pages);
    }
    auto d = device::create("bench", "null", options);
    if (!d) {
        fmt::print(stderr, "softblk-bench-core: {}\n", d.error().message);
        std::exit(1);
    }
    return std::move(*d);
}

// Random I/O of `bs` bytes (4 KiB but for bench_one's --bs) at a fixed
// queue depth on one queue; every completion resubmits its request at a new
// random offset.
struct random_io {
    io_queue* queue = nullptr;
    io_op op = io_op::read;
    uint32_t bs = 4096;
    uint64_t blocks = 0;  // blocks of `bs` in the device
    xorshift rng{0x9E3779B97F4A7C15ull};
    uint64_t completed = 0;
    uint64_t errors = 0;
    uint64_t deadline_ns = UINT64_MAX;
    uint64_t stopped_at = 0;
    uint64_t stopped_cpu = 0;
    uint64_t completed_at_stop = 0;
    bool stop = false;

    static void on_complete(io_request& r, int result)
    {
        auto* self = static_cast<random_io*>(r.user_data);
        ++self->completed;
        if (result < 0) {
            ++self->errors;
        }
        // With irqmode=0 completions run inside submit() and this chain
        // never returns to the driving loop: look at the clock here too.
        if ((self->completed & 1023) == 0 && !self->stop && now_ns() >= self->deadline_ns) {
            self->stop = true;
            self->stopped_at = now_ns();
            self->stopped_cpu = thread_cpu_ns();
            self->completed_at_stop = self->completed;
        }
        if (!self->stop) {
            r.offset = (self->rng.next() % self->blocks) * self->bs;
            self->queue->submit(r);
        }
    }
};

struct io_result {
    uint64_t ios = 0;
    uint64_t ns = 0;
    uint64_t errors = 0;
    uint64_t allocations = 0;
    uint64_t cpu_ns = 0;  // the driving thread's CPU time over `ns`
};

io_result run_random(device& d, io_op op, unsigned depth, double seconds, unsigned queue_index = 0,
                     uint32_t bs = 4096)
{
    io_queue& q = d.queue(queue_index);
    random_io ctx;
    ctx.rng.s += queue_index * 0x51ED27u;
    ctx.queue = &q;
    ctx.op = op;
    ctx.bs = bs;
    ctx.blocks = d.limits().capacity_bytes / bs;
    std::vector<std::vector<char>> buffers(depth, std::vector<char>(bs, 'b'));
    std::vector<io_request*> requests;
    for (unsigned i = 0; i < depth; ++i) {
        io_request* r = q.get_request();
        if (r == nullptr) {
            fmt::print(stderr,
                       "softblk-bench-core: queue depth {} is more than the device's tags\n",
                       depth);
            std::exit(1);
        }
        r->op = op;
        r->length = bs;
        r->buffer = buffers[i].data();
        r->on_complete = random_io::on_complete;
        r->user_data = &ctx;
        requests.push_back(r);
    }
    const uint64_t alloc_before = bench::allocations();
    const uint64_t cpu_start = thread_cpu_ns();
    const uint64_t start = now_ns();
    ctx.deadline_ns = start + static_cast<uint64_t>(seconds * 1e9);
    for (io_request* r : requests) {
        r->offset = (ctx.rng.next() % ctx.blocks) * bs;
        q.submit(*r);
    }
    while (!ctx.stop) {
        for (int i = 0; i < 256; ++i) {
            q.process();
        }
        if (!ctx.stop && now_ns() >= ctx.deadline_ns) {
            ctx.stop = true;
            ctx.stopped_at = now_ns();
            ctx.stopped_cpu = thread_cpu_ns();
            ctx.completed_at_stop = ctx.completed;
        }
    }
    const uint64_t stop_at = ctx.stopped_at;
    const uint64_t done = ctx.completed_at_stop;
    const uint64_t alloc_after = bench::allocations();
    while (q.in_flight() > 0) {
        q.wait(q.in_flight(), 1'000'000'000);
    }
    return io_result{done, stop_at - start, ctx.errors, alloc_after - alloc_before,
                     ctx.stopped_cpu - cpu_start};
}

void print_io(const char* what, const io_result& r, nlohmann::json c,
              const nlohmann::json& more = nlohmann::json::object())
{
    const double iops = static_cast<double>(r.ios) * 1e9 / static_cast<double>(r.ns);
    c["bs"] = 4096;
    c["qd"] = 32;
    nlohmann::json extra = {{"ns_per_io", static_cast<double>(r.ns) / static_cast<double>(r.ios)},
                            {"ios", r.ios},
                            {"errors", r.errors},
                            {"allocations", r.allocations}};
    extra.update(more);
    emit({{"case", c},
          {"system", "softblk"},
          {"iops", iops},
          {"mib_s", iops * 4096 / (1 << 20)},
          {"extra", extra}});
    fmt::print(g_text,
               "  {:<44} {:>8.2f} M IOPS  {:>7.1f} ns/IO  ({} I/Os, {} errors, {} allocations)\n",
               what, iops / 1e6, static_cast<double>(r.ns) / static_cast<double>(r.ios), r.ios,
               r.errors, r.allocations);
}

// 4 KiB streaming (non-temporal) copy, then a fence: what the memory
// store does for a store much larger than the last-level cache
// (src/core/stream_copy.hpp), here as the machine's bound for that copy.
void stream_copy_4k(char* dst, const char* src)
{
#if defined(__x86_64__)
    for (size_t i = 0; i < 4096; i += 16) {
        _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i),
                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    }
    _mm_sfence();
#else
    std::memcpy(dst, src, 4096);
#endif
}

struct copy_result {
    uint64_t copies = 0;
    uint64_t ns = 0;
    uint64_t cpu_ns = 0;
    double rate() const { return static_cast<double>(copies) * 1e9 / static_cast<double>(ns); }
};

// 4 KiB copies from one source to random 4 KiB slots of `dst` (`bytes`
// long, already written once), with memcpy or with streaming stores, for
// `seconds`.
copy_result memcpy_run(char* dst, uint64_t bytes, double seconds, bool streaming = false)
{
    alignas(64) static char src[4096];
    std::memset(src, 's', sizeof(src));
    static xorshift rng{0x1234567ull};
    const uint64_t slots = bytes / 4096;
    uint64_t copies = 0;
    const uint64_t cpu_start = thread_cpu_ns();
    const uint64_t start = now_ns();
    const uint64_t end = start + static_cast<uint64_t>(seconds * 1e9);
    uint64_t t = start;
    while (t < end) {
        for (int i = 0; i < 1024; ++i) {
            char* to = dst + (rng.next() % slots) * 4096;
            if (streaming) {
                stream_copy_4k(to, src);
            } else {
                std::memcpy(to, src, 4096);
            }
            // Keep the compiler from dropping copies into memory it never reads.
            asm volatile("" : : "r"(dst) : "memory");
        }
        copies += 1024;
        t = now_ns();
    }
    return {copies, t - start, thread_cpu_ns() - cpu_start};
}

double memcpy_rate(char* dst, uint64_t bytes, double seconds)
{
    return memcpy_run(dst, bytes, seconds).rate();
}

// The median of `v` (not empty); sorts it.
double median(std::vector<double>& v)
{
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void bench_null(double seconds)
{
    fmt::print(
        g_text,
        "1. null target, memory_backed=0, 4 KiB random read, QD 32, one queue, one thread\n");
    for (const char* mode : {"0", "1"}) {
        auto d = create({"irqmode=" + std::string(mode), "submit_queues=1", "poll_queues=0"});
        run_random(*d, io_op::read, 32, 0.2);  // warm up
        const io_result r = run_random(*d, io_op::read, 32, seconds);
        print_io(
            fmt::format("irqmode={} ({})", mode, mode[0] == '0' ? "inline" : "deferred, default")
                .c_str(),
            r,
            {{"test", "null"},
             {"workload", "randread"},
             {"irqmode", std::atoi(mode)},
             {"queues", 1}});
    }
}

// The object `key` of a device's describe "target" (empty where it has none).
nlohmann::json target_described(const device& d, const char* key)
{
    nlohmann::json j;
    d.describe(j);
    return j["target"].value(key, nlohmann::json::object());
}

// The describe "chunks" of a memory-backed device: "{huge} huge and
// {small} small chunks, {why}", or "" where the store has none to show.
std::string chunks_text(const device& d)
{
    const nlohmann::json chunks = target_described(d, "chunks");
    if (!chunks.contains("why")) {
        return "";
    }
    return fmt::format("{} huge and {} small chunks; {}", chunks.value("huge_chunks", uint64_t{0}),
                       chunks.value("small_chunks", uint64_t{0}),
                       chunks.value("why", std::string()));
}

// The describe "writes" of a memory-backed device: how it copies writes
// now and why, or "" where the store has none to show.
std::string writes_text(const device& d)
{
    const nlohmann::json writes = target_described(d, "writes");
    if (!writes.contains("copy")) {
        return "";
    }
    return fmt::format("{} copies; {}", writes.value("copy", std::string()),
                       writes.value("why", std::string()));
}

// A fresh device written in full with 1 MiB writes in order, timed.
void bench_fill(uint64_t k_size_mib)
{
    auto d = create({"memory_backed=1", "bs=4096", fmt::format("size={}", k_size_mib), "irqmode=0",
                     "submit_queues=1", "poll_queues=0"});
    std::vector<char> chunk(1 << 20, 'f');
    const uint64_t start = now_ns();
    uint64_t errors = 0;
    for (uint64_t off = 0; off < (k_size_mib << 20); off += chunk.size()) {
        errors +=
            d->execute(io_op::write, off, static_cast<uint32_t>(chunk.size()), chunk.data()) < 0
                ? 1
                : 0;
    }
    const double s = static_cast<double>(now_ns() - start) / 1e9;
    emit({{"case", {{"test", "memory"}, {"size_mib", k_size_mib}, {"workload", "fill"}}},
          {"system", "softblk"},
          {"iops", static_cast<double>(k_size_mib) / s},
          {"mib_s", static_cast<double>(k_size_mib) / s},
          {"extra", {{"seconds", s}, {"errors", errors}, {"chunks", chunks_text(*d)}}}});
    fmt::print(g_text,
               "  fill a fresh device, 1 MiB writes in order   {:>8.3f} s     {:>7.0f} MiB/s  ({} "
               "errors)\n",
               s, static_cast<double>(k_size_mib) / s, errors);
    if (const std::string text = chunks_text(*d); !text.empty()) {
        fmt::print(g_text, "    {}\n", text);
    }
}

void bench_memory(double seconds, uint64_t k_size_mib, bool two_queues)
{
    const uint64_t k_bytes = k_size_mib << 20;
    fmt::print(g_text,
               "2. memory_backed=1, bs=4096, size={} MiB, 4 KiB random write, QD 32, one queue\n",
               k_size_mib);
    bench_fill(k_size_mib);
    const uint64_t huge_before = anon_huge_bytes();
    auto d = create({"memory_backed=1", "bs=4096", fmt::format("size={}", k_size_mib), "irqmode=0",
                     "submit_queues=1", "poll_queues=0"});
    const io_result cold = run_random(*d, io_op::write, 32, seconds);
    const nlohmann::json mem_case = {{"test", "memory"}, {"size_mib", k_size_mib}, {"queues", 1}};
    auto with = [&](const char* workload, const char* state) {
        nlohmann::json c = mem_case;
        c["workload"] = workload;
        c["state"] = state;
        return c;
    };
    print_io("fresh device (pages allocated as written)", cold, with("randwrite", "fresh"));
    // Fill every page so the next run measures the store, not allocation.
    {
        std::vector<char> chunk(1 << 20, 'f');
        for (uint64_t off = 0; off < k_bytes; off += chunk.size()) {
            d->execute(io_op::write, off, static_cast<uint32_t>(chunk.size()), chunk.data());
        }
    }
    const uint64_t device_huge = anon_huge_bytes() - huge_before;
    const std::string device_chunks = chunks_text(*d);
    // Two queues driven by two threads on the same store: the lock stripes'
    // contention.
    if (two_queues) {
        auto d2 = create({"memory_backed=1", "bs=4096", fmt::format("size={}", k_size_mib),
                          "irqmode=0", "submit_queues=2", "poll_queues=0"});
        std::vector<char> chunk(1 << 20, 'f');
        for (uint64_t off = 0; off < k_bytes; off += chunk.size()) {
            d2->execute(io_op::write, off, static_cast<uint32_t>(chunk.size()), chunk.data());
        }
        nlohmann::json before;
        d2->describe(before);
        io_result other;
        std::thread t([&] { other = run_random(*d2, io_op::write, 32, seconds, 1); });
        const io_result mine = run_random(*d2, io_op::write, 32, seconds, 0);
        t.join();
        nlohmann::json after;
        d2->describe(after);
        const uint64_t contended = after["target"]["store_lock_contended"].get<uint64_t>() -
                                   before["target"]["store_lock_contended"].get<uint64_t>();
        const uint64_t ios = mine.ios + other.ios;
        const double iops = static_cast<double>(mine.ios) * 1e9 / static_cast<double>(mine.ns) +
                            static_cast<double>(other.ios) * 1e9 / static_cast<double>(other.ns);
        emit({{"case",
               {{"test", "memory"},
                {"size_mib", k_size_mib},
                {"queues", 2},
                {"workload", "randwrite"},
                {"state", "allocated"},
                {"bs", 4096},
                {"qd", 32}}},
              {"system", "softblk"},
              {"iops", iops},
              {"mib_s", iops * 4096 / (1 << 20)},
              {"extra", {{"ios", ios}, {"lock_waits", contended}}}});
        fmt::print(
            g_text,
            "  two queues, two threads, random write       {:>8.2f} M IOPS  lock waits {} of {} "
            "I/Os "
            "({:.4f}%)\n",
            iops / 1e6, contended, ios,
            100.0 * static_cast<double>(contended) / static_cast<double>(ios));
    }

    // memcpy reference, same run: into a buffer the size of the device,
    // with the page size the store's data has. The store advises its huge
    // chunks for transparent huge pages and the rest not
    // (src/core/page_pool.cpp), so the buffer is aligned and advised as
    // most of the device's data is: where it got huge pages the buffer
    // does, where it did not (small chunks, or THP off) neither has (on a
    // machine with THP "always" a plain buffer would have them and chunks
    // of small pages would not, a TLB difference rather than the store's
    // cost).
    const uint64_t align = uint64_t{2} << 20;
    char* area = static_cast<char*>(
        mmap(nullptr, k_bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (area == MAP_FAILED) {
        fmt::print(stderr, "softblk-bench-core: mmap of {} MiB failed\n", k_size_mib);
        std::exit(1);
    }
    char* dst = area + (-reinterpret_cast<uintptr_t>(area) & (align - 1));
    madvise(dst, k_bytes, device_huge * 2 >= k_bytes ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    const uint64_t huge_before_copy = anon_huge_bytes();
    // Touch every page first, as the prefill did for the device: in a VM the
    // first write to guest memory can cost microseconds per page.
    std::memset(dst, 1, k_bytes);
    const uint64_t copy_huge = anon_huge_bytes() - huge_before_copy;
    // The device's random writes and reads and the copies to random slots,
    // interleaved in slices of about 0.25 s (write, memcpy, streaming
    // copy, read), `seconds` of each in all: on a shared machine the load
    // changes within seconds, and each slice's ratio compares the store
    // with the copy under the same load. The totals give the IOPS; the
    // slices' ratios their median and spread.
    const unsigned slices = std::max(1u, static_cast<unsigned>(std::lround(seconds / 0.25)));
    const double slice_s = seconds / slices;
    io_result warm;
    io_result reads;
    copy_result copy;
    copy_result streamed;
    std::vector<double> write_ratios;
    std::vector<double> read_ratios;
    std::vector<double> stream_ratios;
    std::vector<double> cpu_ratios;  // writes / memcpy, per CPU second
    auto add = [](io_result& sum, const io_result& r) {
        sum.ios += r.ios;
        sum.ns += r.ns;
        sum.errors += r.errors;
        sum.allocations += r.allocations;
        sum.cpu_ns += r.cpu_ns;
    };
    auto rate_of = [](const io_result& r) {
        return static_cast<double>(r.ios) * 1e9 / static_cast<double>(r.ns);
    };
    run_random(*d, io_op::write, 32, 0.1);  // warm up
    for (unsigned i = 0; i < slices; ++i) {
        const io_result w = run_random(*d, io_op::write, 32, slice_s);
        const copy_result c = memcpy_run(dst, k_bytes, slice_s);
        const copy_result sc = memcpy_run(dst, k_bytes, slice_s, true);
        const io_result r = run_random(*d, io_op::read, 32, slice_s);
        add(warm, w);
        add(reads, r);
        copy.copies += c.copies;
        copy.ns += c.ns;
        streamed.copies += sc.copies;
        streamed.ns += sc.ns;
        write_ratios.push_back(rate_of(w) / c.rate());
        read_ratios.push_back(rate_of(r) / c.rate());
        stream_ratios.push_back(rate_of(w) / sc.rate());
        cpu_ratios.push_back((static_cast<double>(w.ios) / static_cast<double>(w.cpu_ns)) /
                             (static_cast<double>(c.copies) / static_cast<double>(c.cpu_ns)));
    }
    auto spread = [&](std::vector<double> v) {
        const double m = median(v);
        return nlohmann::json{{"median", m}, {"min", v.front()}, {"max", v.back()}};
    };
    const nlohmann::json slice_info = {{"slices", slices}, {"slice_s", slice_s}};
    nlohmann::json write_more = slice_info;
    write_more["memcpy_ratio"] = spread(write_ratios);
    write_more["streaming_copy_ratio"] = spread(stream_ratios);
    write_more["memcpy_ratio_cpu_time"] = spread(cpu_ratios);
    nlohmann::json read_more = slice_info;
    read_more["memcpy_ratio"] = spread(read_ratios);
    print_io("every page allocated", warm, with("randwrite", "allocated"), write_more);
    print_io("random read, same device", reads, with("randread", "allocated"), read_more);
    const double cold_copy = copy.rate();
    const double stream_copy = streamed.rate();
    const double hot_copy = memcpy_rate(dst, 4096, seconds);
    munmap(area, k_bytes + align);
    const double warm_iops = static_cast<double>(warm.ios) * 1e9 / static_cast<double>(warm.ns);
    const double cold_iops = static_cast<double>(cold.ios) * 1e9 / static_cast<double>(cold.ns);
    // "streaming ..." does not start with "random": the report takes the
    // first memcpy case whose "into" does as the store's bound.
    const std::pair<const char*, double> copies[] = {
        {"random slots of the device's size", cold_copy},
        {"streaming stores to random slots of the device's size", stream_copy},
        {"one hot buffer", hot_copy}};
    for (const auto& [where, rate] : copies) {
        nlohmann::json c = {
            {"test", "memory"}, {"size_mib", k_size_mib}, {"workload", "memcpy"}, {"bs", 4096}};
        c["into"] = where;
        emit({{"case", c},
              {"system", "memcpy"},
              {"iops", rate},
              {"mib_s", rate * 4096 / (1 << 20)},
              {"extra", nlohmann::json::object()}});
    }
    fmt::print(g_text, "  4 KiB memcpy to random slots of {} MiB      {:>8.2f} M/s\n", k_size_mib,
               cold_copy / 1e6);
    fmt::print(g_text, "  4 KiB streaming copies to random slots      {:>8.2f} M/s\n",
               stream_copy / 1e6);
    fmt::print(g_text, "  4 KiB memcpy to one hot 4 KiB buffer         {:>8.2f} M/s\n",
               hot_copy / 1e6);
    fmt::print(g_text,
               "  transparent huge pages: device {} of {} MiB, memcpy buffer {} of {} MiB\n",
               device_huge >> 20, k_size_mib, copy_huge >> 20, k_size_mib);
    if (!device_chunks.empty()) {
        fmt::print(g_text, "    device: {}\n", device_chunks);
    }
    if (const std::string text = writes_text(*d); !text.empty()) {
        fmt::print(g_text, "    device's writes: {}\n", text);
    }
    fmt::print(g_text,
               "  ratio, allocated device / memcpy same size   {:>8.2f}  (slices: median {:.2f}, "
               "{:.2f}-{:.2f})\n",
               warm_iops / cold_copy, write_more["memcpy_ratio"]["median"].get<double>(),
               write_more["memcpy_ratio"]["min"].get<double>(),
               write_more["memcpy_ratio"]["max"].get<double>());
    fmt::print(g_text,
               "  same, per thread CPU second (slices' median)  {:>8.2f}  ({:.2f}-{:.2f})\n",
               write_more["memcpy_ratio_cpu_time"]["median"].get<double>(),
               write_more["memcpy_ratio_cpu_time"]["min"].get<double>(),
               write_more["memcpy_ratio_cpu_time"]["max"].get<double>());
    fmt::print(g_text,
               "  ratio, random read / memcpy same size        {:>8.2f}  (slices: median {:.2f})\n",
               rate_of(reads) / cold_copy, read_more["memcpy_ratio"]["median"].get<double>());
    fmt::print(g_text,
               "  ratio, allocated device / streaming copy     {:>8.2f}  (slices: median {:.2f})\n",
               warm_iops / stream_copy, write_more["streaming_copy_ratio"]["median"].get<double>());
    fmt::print(g_text, "  ratio, fresh device / memcpy same size       {:>8.2f}\n",
               cold_iops / cold_copy);
    fmt::print(g_text, "  ratio, allocated device / hot memcpy         {:>8.2f}\n",
               warm_iops / hot_copy);
}

void bench_ram()
{
    constexpr uint64_t k_tib = uint64_t{1} << 40;
    constexpr uint64_t k_gib = uint64_t{1} << 30;
    fmt::print(g_text,
               "3. memory use of a memory_backed=1 device of 1 TiB (size=1048576), bs=4096\n");
    const uint64_t rss0 = rss_bytes();
    auto d = create({"memory_backed=1", "bs=4096", "size=1048576", "discard=1", "irqmode=0"});
    const uint64_t empty = d->memory_bytes();
    const uint64_t rss_empty = rss_bytes() - rss0;
    fmt::print(g_text,
               "  empty: memory_bytes {} B = {:.1f} B per GiB of capacity (RSS grew {} KiB)\n",
               empty, static_cast<double>(empty) / 1024.0, rss_empty >> 10);

    // 1 GiB written sequentially at the start.
    std::vector<char> chunk(1 << 20, 'w');
    for (uint64_t off = 0; off < k_gib; off += chunk.size()) {
        d->execute(io_op::write, off, static_cast<uint32_t>(chunk.size()), chunk.data());
    }
    const uint64_t seq = d->memory_bytes();
    const uint64_t rss_seq = rss_bytes() - rss0;
    fmt::print(
        g_text,
        "  1 GiB written sequentially: {:.4f} GiB of RAM per GiB written ({} B; RSS {:.4f} GiB), "
        "{:.1f} B per GiB of capacity\n",
        static_cast<double>(seq) / k_gib, seq, static_cast<double>(rss_seq) / k_gib,
        static_cast<double>(seq) / 1024.0);

    // 256 MiB more, as 4 KiB writes at random places of the whole terabyte.
    xorshift rng{42};
    std::vector<char> block(4096, 'r');
    const uint64_t count = (256u << 20) / 4096;
    for (uint64_t i = 0; i < count; ++i) {
        d->execute(io_op::write, (rng.next() % (k_tib / 4096)) * 4096, 4096, block.data());
    }
    const uint64_t mixed = d->memory_bytes();
    const double written = static_cast<double>(k_gib + (256u << 20));
    fmt::print(
        g_text,
        "  + 256 MiB of 4 KiB writes scattered over 1 TiB: {:.4f} GiB of RAM per GiB written "
        "({} B; RSS {:.4f} GiB)\n",
        static_cast<double>(mixed) / written, mixed,
        static_cast<double>(rss_bytes() - rss0) / written);

    // Discard everything: memory goes back, but for the page-table nodes and
    // the free pages the store keeps for reuse (256 MiB at most).
    for (uint64_t off = 0; off < k_tib; off += uint64_t{1} << 31) {
        d->execute(io_op::discard, off, 1u << 31, nullptr);
    }
    emit({{"case", {{"test", "ram"}, {"workload", "memory-use"}, {"size_mib", 1048576}}},
          {"system", "softblk"},
          {"iops", nullptr},
          {"mib_s", nullptr},
          {"extra",
           {{"empty_bytes_per_gib", static_cast<double>(empty) / 1024.0},
            {"ram_per_gib_written_sequential", static_cast<double>(seq) / k_gib},
            {"ram_per_gib_written_scattered", static_cast<double>(mixed) / written},
            {"after_discard_bytes", d->memory_bytes()}}}});
    fmt::print(g_text,
               "  after discarding all: memory_bytes {} B (page-table nodes and kept free pages "
               "stay), RSS {:.1f} MiB above start\n",
               d->memory_bytes(), static_cast<double>(rss_bytes() - rss0) / (1 << 20));
}

// One workload on a device made from `opts` (blank-separated key=value).
int bench_one(double seconds, const std::string& op, unsigned depth, uint32_t bs,
              const std::string& opts)
{
    std::vector<std::string> options;
    size_t i = 0;
    while (i < opts.size()) {
        const size_t end = std::min(opts.find(' ', i), opts.size());
        if (end > i) {
            options.push_back(opts.substr(i, end - i));
        }
        i = end + 1;
    }
    auto d = create(options);
    const io_op io = op == "write" ? io_op::write : io_op::read;
    run_random(*d, io, depth, 0.2, 0, bs);  // warm up
    const io_result r = run_random(*d, io, depth, seconds, 0, bs);
    fmt::print("iops {:.0f} errors {} allocations {}\n",
               static_cast<double>(r.ios) * 1e9 / static_cast<double>(r.ns), r.errors,
               r.allocations);
    return r.errors == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv)
{
    double seconds = 2.0;
    std::string only;
    std::string random_op;
    unsigned depth = 32;
    uint32_t bs = 4096;
    std::string opts;
    uint64_t memory_mib = 0;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--seconds" && i + 1 < argc) {
            seconds = std::atof(argv[++i]);
        } else if (a == "--only" && i + 1 < argc) {
            only = argv[++i];
        } else if (a == "--random" && i + 1 < argc) {
            random_op = argv[++i];
        } else if (a == "--depth" && i + 1 < argc) {
            depth = static_cast<unsigned>(std::atoi(argv[++i]));
        } else if (a == "--bs" && i + 1 < argc) {
            bs = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
        } else if (a == "--opts" && i + 1 < argc) {
            opts = argv[++i];
        } else if (a == "--huge-pages" && i + 1 < argc) {
            g_huge_pages = argv[++i];
        } else if (a == "--memory-mib" && i + 1 < argc) {
            memory_mib = std::strtoull(argv[++i], nullptr, 10);
        } else if (a == "--json") {
            g_json = true;
            g_text = stderr;
        } else {
            fmt::print(stderr,
                       "usage: softblk-bench-core [--seconds S] [--only null|memory|fill|ram] "
                       "[--huge-pages auto|0|1] [--memory-mib N] [--json]\n"
                       "       softblk-bench-core --seconds S --random read|write --depth N "
                       "[--bs BYTES] --opts \"k=v ...\"\n");
            return 2;
        }
    }
    if (!random_op.empty()) {
        if ((random_op != "read" && random_op != "write") || depth == 0 || bs < 512 ||
            bs % 512 != 0) {
            fmt::print(stderr,
                       "softblk-bench-core: --random read|write, --depth N > 0 and --bs a "
                       "multiple of 512\n");
            return 2;
        }
        return bench_one(seconds, random_op, depth, bs, opts);
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    fmt::print(g_text, "softblk-bench-core: {} s per measurement, {} CPUs online\n", seconds, cpus);
    if (only.empty() || only == "null") {
        bench_null(seconds);
    }
    if (only.empty() || only == "memory") {
        if (memory_mib > 0) {
            bench_memory(seconds, memory_mib, true);
        } else {
            bench_memory(seconds, 1024, true);
            bench_memory(seconds, 16, false);
        }
    }
    if (only == "fill") {
        // The fill alone (it is part of "memory"): quick to repeat, to
        // compare builds or huge_pages settings run after run.
        fmt::print(g_text, "fill: memory_backed=1, bs=4096, size=1024 MiB\n");
        bench_fill(1024);
    }
    if (only.empty() || only == "ram") {
        bench_ram();
    }
    return 0;
}
