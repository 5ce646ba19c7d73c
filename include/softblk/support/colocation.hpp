// Serving a client from the CPU it runs on. A client that waits for each
// reply (one request at a time) and its server alternate: one runs while
// the other sleeps. On two CPUs the kernel wakes each of them on the CPU
// the other left idle, so every request and every reply is a wake-up
// across CPUs, and on a virtual machine waking an idle vCPU costs more
// than the request itself (docs/fat.md: 33-42 us per file create through
// the FAT mount apart, 16 us with client and server on one CPU).
//
// A server cannot move its client, but it can go where the client is and
// make the client's wake-up stay there:
// - pin_to(cpu): the serving thread runs on the client's CPU only (its
//   own wake-up by a request is then a local one);
// - reply_begins() / reply_done(): the thread runs under SCHED_IDLE while
//   it works on a request and replies. The kernel places a woken task on a
//   CPU whose runnable tasks are all SCHED_IDLE as on an idle one, so the
//   client woken by the reply stays on this CPU (it preempts the server at
//   once, the server finishes when the client sleeps again). The thread
//   is back under its normal policy right after the reply: a busy program
//   on that CPU delays it for a few ms at most, never starves it.
// Whether that pays is measured, not assumed (level_chooser with
// colocation_config: level 0 serves from any CPU, level 1 next to the
// client): it does where cross-CPU wake-ups are dear and the client waits
// for every reply, and by CPU time per request it may where the client
// pipelines (its data no longer crosses CPUs: docs/nbd.md); with many
// clients or on a busy CPU it does not.
//
// Going back from SCHED_IDLE needs CAP_SYS_NICE or an RLIMIT_NICE of 20;
// a real-time thread is placed by its priority. check() says which is
// missing; the front end then serves from any CPU and says why.
// One thread's; not for sharing.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <cstdint>

#include <string>
#include <string_view>

#include <softblk/support/level_chooser.hpp>
#include <softblk/types.hpp>

namespace softblk {

// The CPU thread `tid` (of any process) last ran on, from
// /proc/TID/stat, or -1 when it is gone. About 10 us.
int last_cpu_of(pid_t tid);

// How often a thread serving next to its client looks where the client
// runs: the scheduler moves it now and then (the kernel's load balancing,
// another thread of the client waking on its CPU), and every request
// until the server follows is a wake-up across CPUs again. At 20 ms an
// NBD client at QD 1 spent half its time apart (46k requests/s at 15 us
// of server CPU each); at 2 ms 65k at 8.7 us, for a lookup that costs
// about 0.5% of a CPU.
inline constexpr uint64_t k_follow_client_ns = 2'000'000;

class colocation {
public:
    colocation();
    ~colocation();
    colocation(const colocation&) = delete;
    colocation& operator=(const colocation&) = delete;

    // Whether the calling thread may go to SCHED_IDLE and back: tried
    // once (both switches), an error that says what is missing otherwise.
    static result<void> check();

    // Runs the calling thread on `cpu` alone (nothing when it already
    // does, or when `cpu` is not among the CPUs it was allowed at start).
    void pin_to(int cpu);
    // Runs the calling thread on the CPU of thread `client` (of any
    // process), looked up when the client changes and every
    // k_follow_client_ns otherwise. `now`: monotonic ns.
    void follow(pid_t client, uint64_t now);
    // Back on every CPU it was allowed at start.
    void release();
    // The CPU pinned to, or -1.
    int cpu() const { return _cpu; }
    // Under SCHED_IDLE (between reply_begins() and reply_done()).
    bool replying() const { return _idle; }

    void reply_begins();
    void reply_done();

private:
    cpu_set_t _allowed;
    int _cpu = -1;
    pid_t _client = 0;          // followed by follow()
    uint64_t _looked_ns = 0;    // ... whose CPU was looked up then
    int _policy = SCHED_OTHER;  // at start: SCHED_OTHER or SCHED_BATCH
    bool _idle = false;
};

// The option that asks for it: "auto" (measured: levels 0 and 1, epochs
// of 200 ms), "0" (never) or "1" (always).
result<void> check_colocation(std::string_view text);
level_chooser::config colocation_config(std::string_view text);

}  // namespace softblk
