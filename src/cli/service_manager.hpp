// The daemon under a service manager (systemd's softblk.service,
// docs/install.md): readiness and stop notices through sd_notify, and log
// lines the journal files at their level.
#pragma once

#include <memory>
#include <string_view>

#include <spdlog/common.h>

namespace softblk::cli {

// Sends `state` ("READY=1", "STOPPING=1", "STATUS=...", lines joined by
// '\n') to the service manager through libsystemd's sd_notify. Nothing
// happens when the daemon was not started with $NOTIFY_SOCKET (by hand, by
// a command that started it on demand); a manager that cannot be reached
// is logged once, never fatal: the daemon serves all the same.
void notify_service_manager(std::string_view state);

// True when stderr is the journal's stream for this process: $JOURNAL_STREAM
// ("DEVICE:INODE", set by systemd for StandardError=journal) names stderr's
// device and inode. A stderr redirected elsewhere by the unit or a shell
// (2>file) does not match, so lines then stay as they are.
bool stderr_is_journal();

// A sink that writes each message to stderr as one line with the syslog
// level prefix systemd parses on a journal stream ("<3>" error, "<4>"
// warning, "<6>" info, "<7>" debug; sd-daemon.h's SD_ERR ...), without a
// time stamp (the journal keeps its own). For stderr_is_journal().
spdlog::sink_ptr make_journal_stream_sink();

}  // namespace softblk::cli
