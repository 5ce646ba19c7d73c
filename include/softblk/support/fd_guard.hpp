// A file descriptor closed when its scope ends (unless released). Shared by
// the core (the file engine) and the front ends (the FUSE export's loop
// device set-up). Any thread; the guard owns the descriptor.
#pragma once

#include <unistd.h>

namespace softblk {

struct fd_guard {
    int fd = -1;
    ~fd_guard()
    {
        if (fd >= 0) {
            ::close(fd);
        }
    }
    // Gives the descriptor up to the caller, who then owns it.
    int release()
    {
        const int f = fd;
        fd = -1;
        return f;
    }
};

}  // namespace softblk
