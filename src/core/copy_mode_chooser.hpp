// How the memory store copies written data into its pages, cached or
// streaming stores (stream_copy.hpp), decided at run time by timing the
// copies themselves. Internal to the core.
//
// Why measured: which copy is cheaper depends on whether a write's lines
// are still in the cache when it comes, which depends on the workload
// (random or in order, over how much of the store) and on the cache this
// process really gets (a guest's reported L3 is the host's, shared with
// other guests), not on the store's capacity alone. On the test machine
// (2-vCPU KVM guest, L3 reported as 480 MiB) 4 KiB copies to random slots
// took 176/268/417/439 ns cached at 32/64/128/256 MiB and 342-383 ns
// streaming at every size, so the crossover was between 64 and 128 MiB,
// not at twice the reported L3; and a FAT volume's sequential writes into
// a 512 MiB store never found their lines cached. The capacity rule
// (choose_copy) is only the first guess.
//
// Why not level_chooser: it compares the owner's rate of work over epochs
// of wall time, which the client's own time is part of; here the cost is
// one operation's, and that can be timed directly. Nor ublk's way_chooser,
// which times one thread's takes with lone explorations among them: a
// copy's cost here depends on what the store's last thousands of copies,
// from any thread, left in the cache, so a trial runs the whole store in
// one mode before it times it.
//
// How: the copies into pages whose index is a multiple of k_sample_every
// are the samples; their count drives trials. A trial runs the store in
// each mode in turn, the other mode first, for k_warm_samples samples (and
// all the copies between them: the cache then holds what that mode leaves
// in it) and then k_timed_samples timed ones: a clock read after a full
// fence on each side of the copy, so that what a copy leaves to drain (a
// cached store's read for ownership, a streaming store's write-combining
// buffers) is counted in it. The cheaper per byte wins; the mode in use
// before the trial stays unless the other is cheaper by k_margin. The next
// trial comes after k_first_exploit samples, twice as many as the last
// time when the choice stayed (up to k_max_exploit), k_first_exploit again
// when it changed. Outside trials only one sample in k_exploit_stride is
// counted (an atomic add, on a cache line of its own).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "stream_copy.hpp"

namespace softblk::core {

class copy_mode_chooser {
public:
    static constexpr uint64_t k_sample_every = 16;  // pages
    // Outside trials only one sample in this many is counted, as this many:
    // the count is shared by the store's writers, and a count per sample
    // cost two writers on one store 7% of their rate (its cache line
    // bouncing between their CPUs).
    static constexpr uint64_t k_exploit_stride = 16;
    static constexpr uint64_t k_warm_samples = 512;
    static constexpr uint64_t k_timed_samples = 64;
    static constexpr uint64_t k_first_exploit = 8'192;
    static constexpr uint64_t k_max_exploit = uint64_t{1} << 18;
    static constexpr double k_margin = 0.05;

    // Starts in `first`'s mode and measures from the first sample on; never
    // measures where this build cannot stream.
    explicit copy_mode_chooser(copy_choice first);

    // Copies `n` bytes of a write into page `index` at `dst`, in the mode
    // chosen, a streaming copy fenced (stream_copy.hpp). Hot path, any
    // thread.
    void copy(uint64_t index, char* dst, const char* src, size_t n)
    {
        if (k_can_stream && index % k_sample_every == 0) [[unlikely]] {
            copy_sample(index, dst, src, n);
            return;
        }
        copy_in(_streaming.load(std::memory_order_relaxed), dst, src, n);
    }

    // The mode in use now (in a trial, the mode being tried).
    bool streaming() const { return _streaming.load(std::memory_order_relaxed); }

    // {"copy": "streaming"|"cached", "why": "...", "trials": N, "in_trial":
    // bool, and once measured "ns_per_kib": {"cached": x, "streaming": y}}.
    // Any thread.
    void describe(nlohmann::json& out) const;

    // The trials' bookkeeping, which copy() runs and tests feed directly:
    // counts `weight` samples and says how to copy this one and whether to
    // time it.
    struct sample_plan {
        bool streaming = false;
        bool timed = false;
    };
    sample_plan next_sample(uint64_t weight = 1);
    // A timed sample's copy took `ns` for `bytes` in the mode given.
    void timed(bool streaming, uint64_t ns, uint64_t bytes);

private:
    // The phases of a trial, then exploit; a trial tries the mode in use
    // before it last.
    enum class phase : uint8_t { warm_other, timed_other, warm_kept, timed_kept, exploit };

    static void copy_in(bool streaming, char* dst, const char* src, size_t n)
    {
        if (streaming) {
            stream_copy(dst, src, n);
            stream_fence();  // the data before the unlock that publishes it
        } else {
            std::memcpy(dst, src, n);
        }
    }
    void copy_sample(uint64_t index, char* dst, const char* src, size_t n);
    // Enters the phases due at sample `s` (under _mutex).
    void advance(uint64_t s);
    void decide();

    // Read by every copy, written at phase changes only: a line of their
    // own, apart from the count every sample writes.
    alignas(64) std::atomic<bool> _streaming;
    std::atomic<phase> _phase{phase::exploit};
    std::atomic<uint64_t> _phase_end{0};  // the sample that starts the next phase
    alignas(64) std::atomic<uint64_t> _samples{0};
    alignas(64) mutable std::mutex _mutex;
    // Under _mutex:
    bool _kept = false;  // the mode in use before the trial
    uint64_t _ns[2] = {};
    uint64_t _bytes[2] = {};
    uint64_t _exploit = k_first_exploit;
    double _ns_per_kib[2] = {};  // the last trial's, by mode (0 cached, 1 streaming)
    unsigned _trials = 0;
    std::string _why;
};

}  // namespace softblk::core
