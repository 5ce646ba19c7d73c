// Unix stream sockets that exports listen on (NBD, vhost-user-blk): taking
// a path safely, binding it with its permissions set before anyone can
// connect, and removing only the socket that was bound. Control thread of
// the export that calls them; nothing here is on the I/O path.
#pragma once

#include <cstdint>
#include <string>
#include <sys/types.h>

#include <softblk/options.hpp>
#include <softblk/types.hpp>

namespace softblk {

// The `mode=` and `group=` options of an export's unix socket, for the
// export's option table; parse them with parse_socket_mode/_group.
inline constexpr option_def k_socket_mode_option{
    .name = "mode",
    .kind = option_kind::text,
    .default_value = "0600",
    .unit = "octal",
    .help =
        "permissions of the unix socket, set before it listens whatever the umask (0600: the "
        "daemon's user only; 0660 with group= for a group)"};
inline constexpr option_def k_socket_group_option{.name = "group",
                                                  .kind = option_kind::text,
                                                  .default_value = "",
                                                  .unit = "name or gid",
                                                  .help =
                                                      "group of the unix socket (default: the "
                                                      "daemon's)"};

// Why `path` cannot be bound as a unix socket, or "" when it may: nothing
// is there, or a socket of this user that nobody listens on (connect() is
// refused: a server that ended without cleaning up left it), which is then
// removed. Anything else (a file of another type, a symbolic link, another
// user's socket, a socket a server listens on, a path too long) is left
// alone, and the message names `socket=PATH` and the cause.
std::string claim_socket_path(const std::string& path);

// A listening unix socket and the identity of the file bind() created.
struct unix_listener {
    int fd = -1;  // owned by the caller
    dev_t dev = 0;
    ino_t ino = 0;
};

// Claims `path` (claim_socket_path), binds it, sets `group` (a gid, or -1
// to keep the process's) and `mode` (the permissions, whatever the umask)
// before listen(), so nobody can connect while it has other permissions.
// `socket_flags` are or-ed into socket()'s type (SOCK_NONBLOCK). Returns
// the listener (the caller owns its descriptor and removes the file with
// remove_socket_file), or an error naming `socket=PATH` and the cause; on
// error nothing stays behind.
result<unix_listener> listen_unix_socket(const std::string& path, unsigned mode, int64_t group,
                                         int backlog, int socket_flags = 0);

// Removes `path` only while it is still the socket `listener` bound (same
// device and inode): a file someone put there since stays.
void remove_socket_file(const std::string& path, const unix_listener& listener);

// The `mode=` option of a socket: octal permissions 0000..0777. Errors
// name the option and the valid range.
result<unsigned> parse_socket_mode(const std::string& value);

// The `group=` option of a socket: a group name or number as a gid, -1 for
// "" (the process's group). Errors name the option.
result<int64_t> parse_socket_group(const std::string& value);

}  // namespace softblk
