// Loop devices over a file, through the kernel's ioctl interface (no
// losetup): attach with LOOP_CTL_GET_FREE + LOOP_CONFIGURE (direct I/O,
// a chosen logical block size), detach with LOOP_CLR_FD, and find the loop
// devices whose backing file lies under a directory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <softblk/types.hpp>

namespace softblk::fuse {

struct loop_attachment {
    std::string path;        // "/dev/loop3"
    unsigned number = 0;     // 3
    bool direct_io = false;  // /sys/block/loopN/loop/dio reads 1
};

// Attaches `file` to a free loop device with LO_FLAGS_DIRECT_IO and the
// given block size (autoclear off, no partition scan). `read_only` opens
// the file read-only and sets LO_FLAGS_READ_ONLY. Control thread; needs
// CAP_SYS_ADMIN. Returns the device and whether the kernel really uses
// direct I/O (it silently falls back to buffered I/O when it cannot).
result<loop_attachment> attach_loop(const std::string& file, uint32_t block_size, bool read_only);

// Detaches loop device `number` (LOOP_CLR_FD) and waits up to `timeout_ms`
// until the kernel has released the backing file. Fails with EBUSY when the
// device is held exclusively (a mounted file system; the message says
// where, see loop_holder) or still open when the time is up; then the
// kernel detaches it on its last close (autoclear). `even_if_held` skips
// the refusal: a held device is set to detach itself on its last close (a
// forced stop leaves nothing attached once the file system is unmounted).
// Returns success if it is not attached at all. Any thread.
result<void> detach_loop(unsigned number, unsigned timeout_ms = 5000, bool even_if_held = false);

// Makes loop device `number` take its backing file's size as it is now
// (LOOP_SET_CAPACITY, `losetup -c`). Any thread; needs CAP_SYS_ADMIN.
result<void> set_loop_capacity(unsigned number);

// What holds loop device `number` exclusively, e.g. "/dev/loop3 is mounted
// on /mnt (ext4)" or "/dev/loop3 is held exclusively by another program";
// empty when nothing does (it could be detached). Any thread; no waiting.
std::string loop_holder(unsigned number);

// The backing file of loop device `number` as the kernel reports it, or ""
// when the device is not attached.
std::string loop_backing_file(unsigned number);

// Every attached loop device whose backing file path starts with `prefix`.
std::vector<unsigned> loops_backed_under(const std::string& prefix);

}  // namespace softblk::fuse
