// colocation (include/softblk/support/colocation.hpp).
#include <softblk/support/colocation.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <sys/resource.h>
#include <unistd.h>

#include <fmt/format.h>

namespace softblk {

namespace {

// processor: field 39 of /proc/PID/stat, the 37th after the ')' that ends
// the command name (which may itself hold blanks and parentheses).
constexpr int k_processor_after_name = 37;
constexpr int k_cap_sys_nice = 23;

// CAP_SYS_NICE in the calling thread's effective set.
bool has_cap_sys_nice()
{
    std::ifstream in("/proc/thread-self/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("CapEff:", 0) == 0) {
            const auto caps = std::stoull(line.substr(7), nullptr, 16);
            return ((caps >> k_cap_sys_nice) & 1) != 0;
        }
    }
    return false;
}

// The kernel lets a thread leave SCHED_IDLE for its nice value n when
// RLIMIT_NICE is at least 20 - n (or with CAP_SYS_NICE).
bool nice_limit_allows_return()
{
    rlimit lim{};
    if (::getrlimit(RLIMIT_NICE, &lim) != 0) {
        return false;
    }
    errno = 0;
    const int nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()));
    if (errno != 0) {
        return false;
    }
    return lim.rlim_cur == RLIM_INFINITY || static_cast<rlim_t>(20 - nice) <= lim.rlim_cur;
}

bool set_policy(int policy)
{
    sched_param none{};
    return ::sched_setscheduler(0, policy, &none) == 0;
}

}  // namespace

int last_cpu_of(pid_t tid)
{
    std::ifstream in(fmt::format("/proc/{}/stat", tid));
    std::string text;
    if (!std::getline(in, text)) {
        return -1;
    }
    const auto end_of_name = text.rfind(')');
    if (end_of_name == std::string::npos) {
        return -1;
    }
    std::istringstream fields(text.substr(end_of_name + 1));
    std::string field;
    for (int i = 0; i < k_processor_after_name; ++i) {
        if (!(fields >> field)) {
            return -1;
        }
    }
    try {
        return std::stoi(field);
    } catch (const std::exception&) {
        return -1;
    }
}

colocation::colocation()
{
    CPU_ZERO(&_allowed);
    if (::sched_getaffinity(0, sizeof _allowed, &_allowed) != 0) {
        CPU_ZERO(&_allowed);
    }
    _policy = ::sched_getscheduler(0) & ~SCHED_RESET_ON_FORK;
}

colocation::~colocation()
{
    reply_done();
    release();
}

result<void> colocation::check()
{
    const int policy = ::sched_getscheduler(0) & ~SCHED_RESET_ON_FORK;
    if (policy != SCHED_OTHER && policy != SCHED_BATCH) {
        return make_error(EPERM, fmt::format("the serving thread runs under a {} policy "
                                             "(placed by its priority, not moved)",
                                             policy == SCHED_IDLE ? "SCHED_IDLE" : "real-time"));
    }
    if (!has_cap_sys_nice() && !nice_limit_allows_return()) {
        return make_error(EPERM,
                          "it could not return from SCHED_IDLE: that needs "
                          "CAP_SYS_NICE or an RLIMIT_NICE of 20 (ulimit -e)");
    }
    if (!set_policy(SCHED_IDLE)) {
        return make_error(errno,
                          fmt::format("sched_setscheduler(SCHED_IDLE): {}", std::strerror(errno)));
    }
    if (!set_policy(policy)) {
        return make_error(errno, fmt::format("sched_setscheduler back from SCHED_IDLE: {}",
                                             std::strerror(errno)));
    }
    return {};
}

void colocation::pin_to(int cpu)
{
    if (cpu < 0 || cpu >= CPU_SETSIZE || cpu == _cpu || !CPU_ISSET(cpu, &_allowed)) {
        return;
    }
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (::sched_setaffinity(0, sizeof one, &one) == 0) {
        _cpu = cpu;
    }
}

void colocation::follow(pid_t client, uint64_t now)
{
    if (client <= 0 || (client == _client && now - _looked_ns < k_follow_client_ns)) {
        return;
    }
    _client = client;
    _looked_ns = now;
    pin_to(last_cpu_of(client));
}

void colocation::release()
{
    if (_cpu < 0) {
        return;
    }
    if (::sched_setaffinity(0, sizeof _allowed, &_allowed) == 0) {
        _cpu = -1;
        _client = 0;  // the next follow() looks again
    }
}

void colocation::reply_begins()
{
    if (!_idle && set_policy(SCHED_IDLE)) {
        _idle = true;
    }
}

void colocation::reply_done()
{
    if (_idle && set_policy(_policy)) {
        _idle = false;
    }
}

result<void> check_colocation(std::string_view text)
{
    if (text == "auto" || text == "0" || text == "1") {
        return {};
    }
    return make_error(EINVAL,
                      "auto (measured), 0 (serve from any CPU) or 1 (next to the "
                      "client)");
}

level_chooser::config colocation_config(std::string_view text)
{
    level_chooser::config c;
    c.unit = "colocated";
    // Serving from any CPU stays unless next to the client measures more
    // than 5% better: pinning is the change that must earn its keep.
    c.cost = level_chooser::cheaper::lower;
    // Longer than a whole sweep of the poll window (14 epochs of 10 ms),
    // which runs at the same time: each placement sees every window alike.
    c.epoch_ns = 200'000'000;
    c.idle_ns = 400'000'000;
    // A sweep is four epochs, and the placements' rates differ by 2-3x
    // where pinning pays: when its passes disagree (a load that changed in
    // mid-sweep), measure again after two epochs rather than serve apart
    // for 20 s. A FAT mount under softblk-bench-fat kept serving apart so
    // in 2 runs of 6, at a third of the rate (docs/fat.md).
    c.recheck_epochs = 2;
    if (text == "0") {
        c.levels = {0};
    } else if (text == "1") {
        c.levels = {1};
    } else {
        c.levels = {0, 1};
    }
    return c;
}

}  // namespace softblk
