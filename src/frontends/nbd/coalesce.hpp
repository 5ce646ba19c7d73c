// The receive-coalescing policy of one NBD connection (docs/nbd.md,
// "Receive coalescing"): fed with how many requests each receive brought
// and the clock, it says how long the next receive is held back.
// event_loop::coalesce_receive (coalesce.cpp) applies it; the unit tests
// drive it with made-up clients.
//
// Holding a receive back saves wake-ups and system calls, and lets one
// sendmsg carry several replies, but a client that waits for its replies
// may then idle. How long helps depends on the client and the machine (on
// a quiet 2-CPU VM with fio at queue depth 32, 10-20 us raised the request
// rate by a fifth and 50 us lowered it), so the window is chosen as the
// front ends' poll windows are (level_chooser): measured at 0, 5, 10, 20
// ... us up to coalesce-us, and the longest window that keeps 98% of the
// best request rate is kept (a longer hold costs less CPU per request).
// Only a connection that pipelines is held or measured: one that sends a
// request at a time gains nothing and would only wait.
#pragma once

#include <cstdint>
#include <optional>

#include <nlohmann/json.hpp>

#include <softblk/support/level_chooser.hpp>

namespace softblk::nbd {

class coalesce_policy {
public:
    // `max_window_ns`: coalesce-us in ns; 0 never holds.
    explicit coalesce_policy(uint64_t max_window_ns = 0);

    // After a receive (or an unblocked input) parsed `got` requests at
    // `now` (ns): how long to hold the next receive back, 0 for not at all.
    uint64_t next_hold(uint64_t got, uint64_t now);

    // The client sends several requests before it waits for replies.
    bool pipelining() const { return _pipelining; }
    uint64_t window_ns() const { return _pipelining && _chooser ? _chooser->level() * 1'000 : 0; }
    // The chooser's description (level_chooser::describe), or null.
    nlohmann::json describe() const;

private:
    std::optional<level_chooser> _chooser;  // none: coalesce-us=0
    bool _pipelining = false;
};

}  // namespace softblk::nbd
