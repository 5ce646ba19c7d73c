// The work device_host runs off the control thread (device_host.hpp): the
// event that wakes the control thread, a teardown and a job. Private to
// device_host.cpp and device_jobs.cpp.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <sys/eventfd.h>
#include <unistd.h>

#include "device_host.hpp"

namespace softblk::host {

// Tells the control thread that a teardown or a job ended. Shared with
// their threads, so that one the daemon gave up on can still signal safely.
struct device_host::wake_event {
    int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    ~wake_event()
    {
        if (fd >= 0) {
            ::close(fd);
        }
    }
    void notify() const
    {
        const uint64_t one = 1;
        (void)!::write(fd, &one, sizeof one);
    }
};

// One device being removed: its export and device, moved here from the
// table, are stopped and destroyed on `thread`. The thread writes `outcome`
// (and, when the export refused, leaves `exp` and `dev` alive) before it
// sets `finished`; the control thread reads them only after that.
struct device_host::teardown {
    std::unique_ptr<device_export> exp;
    std::unique_ptr<device> dev;
    bool keep_state = false;
    bool force = false;
    // An add that did not complete (deleted while being made, its state not
    // written): what making the target created on disk goes too
    // (device::undo_create).
    bool undo_create = false;
    std::chrono::steady_clock::time_point started;
    std::thread thread;
    std::atomic<bool> finished{false};
    result<void> outcome;

    // The teardown thread's body.
    void run(const std::string& name, const std::string& export_type, const wake_event& wake);
};

// Work on one device that may wait for it: creating it (add, recovery: a
// back end to connect to, an export to start) or a set that powers it on
// or off or re-makes its queues (its export stopped and started). Runs on
// `thread` (add, set) or on the host's recovery thread, never on the
// control thread. `work` is the job's own copy of the entry (with the
// device and export for a set) and `ctx` its own copy of the context, so a
// job the daemon gave up on touches nothing of the host. The thread writes
// `work`, `outcome` and `notes`, then sets `finished`; the control thread
// reads them only after that.
struct device_host::job {
    enum class kind : uint8_t { add, recover, set };
    kind what = kind::add;
    std::string label;  // what `list` shows meanwhile: "adding" ...
    hosted_device work;
    export_context ctx;
    std::vector<std::string> writes;  // set: "key=value" in order
    bool force = false;               // set: power=0 while in use
    std::chrono::steady_clock::time_point started;
    std::thread thread;
    // Set by the control thread when the device goes before the job began
    // (a recovery waiting its turn): the job then does nothing.
    std::atomic<bool> cancelled{false};
    std::atomic<bool> finished{false};
    result<void> outcome;
    std::vector<std::string> notes;

    // A job of `what` on `entry`, which it marks busy (a set takes its
    // device and export). Control thread.
    static std::shared_ptr<job> make(kind what, std::string label, hosted_device& entry,
                                     const export_context& ctx);
    // Runs `self` on a thread of its own. Control thread.
    static void start(std::shared_ptr<job> self, std::shared_ptr<wake_event> wake);
    // The job's body, on its thread; never throws (an allocation that
    // fails is ENOMEM naming the device). Ends by setting `finished` and
    // waking the control thread.
    void run(const wake_event& wake);
    // "add", "recover" or "set" (completion::method).
    const char* method_name() const;
};

}  // namespace softblk::host
