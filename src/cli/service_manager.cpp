#include "service_manager.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

namespace softblk::cli {

void notify_service_manager(std::string_view state)
{
    const std::string text(state);
    const int rc = ::sd_notify(0, text.c_str());
    static bool warned = false;
    if (rc < 0 && !warned) {
        warned = true;
        spdlog::warn(
            "cannot tell the service manager \"{}\" through $NOTIFY_SOCKET: {} (the "
            "daemon serves all the same; systemd may time its start out)",
            text.substr(0, text.find('\n')), std::strerror(-rc));
    }
}

bool stderr_is_journal()
{
    const char* stream = std::getenv("JOURNAL_STREAM");
    if (stream == nullptr) {
        return false;
    }
    unsigned long long dev = 0;
    unsigned long long ino = 0;
    if (std::sscanf(stream, "%llu:%llu", &dev, &ino) != 2) {
        return false;
    }
    struct stat st {};
    if (::fstat(STDERR_FILENO, &st) != 0) {
        return false;
    }
    return static_cast<unsigned long long>(st.st_dev) == dev &&
           static_cast<unsigned long long>(st.st_ino) == ino;
}

namespace {

// sd-daemon.h's prefixes are string literals ("<3>"); spdlog's levels map
// onto syslog's as spdlog's own systemd sink maps them.
const char* level_prefix(spdlog::level::level_enum level)
{
    switch (level) {
    case spdlog::level::trace:
    case spdlog::level::debug:
        return SD_DEBUG;
    case spdlog::level::info:
        return SD_INFO;
    case spdlog::level::warn:
        return SD_WARNING;
    case spdlog::level::err:
        return SD_ERR;
    case spdlog::level::critical:
        return SD_CRIT;
    default:
        return SD_INFO;
    }
}

class journal_stream_sink final : public spdlog::sinks::base_sink<std::mutex> {
protected:
    void sink_it_(const spdlog::details::log_msg& msg) override
    {
        // One journal entry per line: a message's own line breaks would
        // start entries without the prefix, at the default level.
        std::string line = level_prefix(msg.level);
        line.append(msg.payload.data(), msg.payload.size());
        for (char& c : line) {
            if (c == '\n') {
                c = ' ';
            }
        }
        line.push_back('\n');
        size_t done = 0;
        while (done < line.size()) {
            const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n <= 0) {
                return;  // a journal that is gone loses lines, not the daemon
            }
            done += static_cast<size_t>(n);
        }
    }
    void flush_() override {}
};

}  // namespace

spdlog::sink_ptr make_journal_stream_sink()
{
    return std::make_shared<journal_stream_sink>();
}

}  // namespace softblk::cli
