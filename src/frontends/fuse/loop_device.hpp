// Loop devices over a file, through the kernel's ioctl interface (no
// losetup): attach with LOOP_CTL_GET_FREE + LOOP_CONFIGURE (direct I/O,
// a chosen logical block size), detach with LOOP_CLR_FD, and find the loop
// devices whose backing file lies under a directory.
//
// A loop device number proves nothing: once detached (autoclear after a
// refused stop, or someone's losetup -d) anybody may attach their own file
// to the same /dev/loopN. So every act on a device softblk attached first
// checks, on the open device, that its backing file is still the one
// softblk attached (device and inode numbers, LOOP_GET_STATUS64), and
// leaves it alone otherwise (docs/reliability.md, "Ownership before
// destruction").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <softblk/types.hpp>

namespace softblk::fuse {

// Which file backs a loop device: the file system's device number
// (st_dev encoding) and the inode number, as the kernel reports them.
struct loop_backing {
    uint64_t device = 0;
    uint64_t inode = 0;
    bool operator==(const loop_backing&) const = default;
};

struct loop_attachment {
    std::string path;        // "/dev/loop3"
    unsigned number = 0;     // 3
    bool direct_io = false;  // /sys/block/loopN/loop/dio reads 1
    loop_backing backing;    // the file attached, read back right after attaching
};

// Attaches `file` to a free loop device with LO_FLAGS_DIRECT_IO and the
// given block size (autoclear off, no partition scan). `read_only` opens
// the file read-only and sets LO_FLAGS_READ_ONLY. Control thread; needs
// CAP_SYS_ADMIN. Returns the device and whether the kernel really uses
// direct I/O (it silently falls back to buffered I/O when it cannot).
result<loop_attachment> attach_loop(const std::string& file, uint32_t block_size, bool read_only);

// The file backing loop device `number` (LOOP_GET_STATUS64), or nullopt
// when it is not attached (or cannot be opened). Any thread.
std::optional<loop_backing> loop_backing_of(unsigned number);

// True while loop device `number` is attached to the file `backing`.
bool loop_backed_by(unsigned number, const loop_backing& backing);

// Detaches loop device `number` (LOOP_CLR_FD) if it is still attached to
// `expected`, and waits up to `timeout_ms` until the kernel has released
// that file. The check and the LOOP_CLR_FD use one open descriptor, which
// keeps the device from detaching and being re-attached in between.
// Returns success without touching the device when it is attached to
// another file or not at all (it is not ours any more). Fails with EBUSY
// when the device is held exclusively (a mounted file system; the message
// says where, see loop_holder) or still open when the time is up; then the
// kernel detaches it on its last close (autoclear). `even_if_held` skips
// the refusal: a held device is set to detach itself on its last close (a
// forced stop leaves nothing attached once the file system is unmounted).
// Any thread.
result<void> detach_loop(unsigned number, const loop_backing& expected, unsigned timeout_ms = 5000,
                         bool even_if_held = false);

// Makes loop device `number` take its backing file's size as it is now
// (LOOP_SET_CAPACITY, `losetup -c`), if it is still attached to `expected`
// (else nothing). Any thread; needs CAP_SYS_ADMIN.
result<void> set_loop_capacity(unsigned number, const loop_backing& expected);

// What holds loop device `number` exclusively, e.g. "/dev/loop3 is mounted
// on /mnt (ext4)" or "/dev/loop3 is held exclusively by another program";
// empty when nothing does (it could be detached). Any thread; no waiting.
std::string loop_holder(unsigned number);

// The backing file of loop device `number` as the kernel reports it, or ""
// when the device is not attached.
std::string loop_backing_file(unsigned number);

// Every attached loop device whose backing file path starts with `prefix`.
// A path is no proof of ownership (another mount namespace may have the
// same path): check loop_backed_by before acting on one.
std::vector<unsigned> loops_backed_under(const std::string& prefix);

}  // namespace softblk::fuse
