// Provider API: the file engine that persistent targets (the `file`
// target, later the zone-per-file `zloop` target) stand on. Front ends never
// include this header; targets do, next to target.hpp.
//
// Two halves, as the rest of the provider API:
//   backing_file  a file or block device opened for the engine (control
//                 path): O_DIRECT with a fall-back to buffered I/O where the
//                 file system refuses it, an flock so that two devices do not
//                 share one image, its size and block sizes.
//   file_ring     one io_uring per device queue (hot path), owned by the
//                 target_queue and driven only by that queue's thread:
//                 read, write (FUA as RWF_DSYNC), fdatasync, fallocate
//                 (punch, zero range), block-device discard. It completes
//                 requests through a completion_sink, finishing short
//                 transfers and retrying EAGAIN/EINTR first.
// file_engine::map_extents is the allocation map (SEEK_DATA/SEEK_HOLE).
//
// docs/file.md describes the rules (what FLUSH and FUA promise, which
// errors are retried) and why each choice was made.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <softblk/external_data.hpp>
#include <softblk/ring_sharing.hpp>
#include <softblk/target.hpp>
#include <softblk/support/trusted_dir.hpp>
#include <softblk/types.hpp>

struct io_uring;
struct io_uring_sqe;

namespace softblk {

class backing_file;

// How to open a backing file.
struct backing_file_options {
    bool read_only = false;
    // buffered_io=1: never O_DIRECT (the page cache serves the data).
    bool buffered_io = false;
    // create=1: create a missing regular file (never truncates one).
    bool create = false;
    // Minimum size in bytes a regular file is grown to (sparsely) when
    // `create` is set; 0: keep the size it has. Growing happens last, after
    // every check passed.
    uint64_t grow_to = 0;
    // The directory that holds `path`, opened and checked by the caller
    // (zloop's BASE_DIR/ID), or -1. The file is then opened as `path`'s
    // last component relative to it, so that a directory swapped in after
    // the caller's check cannot redirect the open.
    int dir_fd = -1;
    // A file softblk names itself (a zone file), not one its user chose: a
    // symbolic link there was planted, and is refused (O_NOFOLLOW), as is
    // anything but a regular file.
    bool own_file = false;
};

// The caller's checks of an opened file (block size, size), run after it is
// opened and measured (sizes and block sizes; not yet its descriptors) and
// before it is grown. An error is returned from open() and undoes the
// creation.
using backing_file_check = std::function<result<void>(const backing_file&)>;

// A file or block device opened for the engine. Owns its descriptors and
// its flock; closing (destruction) releases both. Not copyable.
class backing_file {
public:
    // Opens `path` (absolute) as `options` say, refusing a directory, a
    // special file, a file on a pseudo file system (proc, sysfs, debugfs,
    // configfs, cgroup ...: kernel interfaces, not storage), a path locked
    // by another device (flock: exclusive when writable, shared when
    // read-only) and, on a file system that refuses O_DIRECT, nothing: it
    // falls back to buffered I/O and says why in direct_refused(). Both
    // descriptors are checked to be the file first looked at (device and
    // inode). A file it creates is created with O_EXCL (never through a
    // link) and mode 0600. Errors name the path and the cause; on error
    // nothing was created, grown or truncated. `check` (optional) vets the
    // file before it is grown. Control thread.
    static result<std::unique_ptr<backing_file>> open(const std::string& path,
                                                      const backing_file_options& options,
                                                      const backing_file_check& check = {});
    ~backing_file();
    backing_file(const backing_file&) = delete;
    backing_file& operator=(const backing_file&) = delete;

    const std::string& path() const { return _path; }
    // The descriptor I/O goes to: O_DIRECT unless buffered.
    int fd() const { return _fd; }
    // The same file without O_DIRECT, for requests whose buffer is not
    // aligned for direct I/O (the same descriptor as fd() when buffered).
    int buffered_fd() const { return _buffered_fd; }
    bool direct() const { return _direct; }
    // Why O_DIRECT is not used though buffered_io=0 was asked ("" when it is,
    // or when buffered_io=1).
    const std::string& direct_refused() const { return _direct_refused; }
    bool block_device() const { return _block_device; }
    // This open created the file (create=1 and it was missing).
    bool created() const { return _created; }
    // The file's device and inode (for remove_if_same: undoing a creation
    // removes the file only if it is still this one).
    const file_identity& identity() const { return _identity; }
    // The file lives in RAM (tmpfs, ramfs): such files have no
    // FMODE_NOWAIT, so io_uring would hand every request on them to a
    // worker thread; the ring copies their data with pread/pwrite instead.
    bool memory_file_system() const { return _memory_fs; }
    bool read_only() const { return _read_only; }
    // Size in bytes (after growing), for a block device its capacity, as
    // last measured (open, measure_size, grow). Any thread.
    uint64_t size() const { return _size.load(std::memory_order_relaxed); }
    // Measures the size again: a file that someone grew or shrank
    // (truncate, qemu-img resize), a block device resized underneath (what
    // loop's LOOP_SET_CAPACITY asks). Returns it; errors name the path.
    // Control thread.
    result<uint64_t> measure_size();
    // Grows a regular file sparsely to `bytes` (never shrinks: a smaller
    // `bytes` is a no-op). EINVAL for a block device, EROFS for a read-only
    // file; errors name the path and the cause. Control thread.
    result<void> grow(uint64_t bytes);
    // The smallest block that direct I/O accepts (statx dio_offset_align,
    // the block device's logical block size), 512 when unknown or buffered.
    uint32_t min_block_size() const { return _min_block; }
    // Physical block size of the block device underneath (or the file
    // system's block size for a file), for block_limits::physical_block_size.
    uint32_t physical_block_size() const { return _physical_block; }
    // Largest discard a block device accepts in one request (its
    // discard_max_bytes); 0: it has none. Regular files: UINT32_MAX.
    uint64_t max_discard_bytes() const { return _max_discard; }
    // Memory alignment direct I/O needs (statx dio_mem_align, else the
    // minimum block size).
    uint32_t memory_alignment() const { return _mem_align; }

private:
    backing_file() = default;

    std::string _path;
    int _fd = -1;
    int _buffered_fd = -1;
    bool _direct = false;
    std::string _direct_refused;
    bool _block_device = false;
    bool _created = false;
    file_identity _identity;
    bool _memory_fs = false;
    bool _read_only = false;
    std::atomic<uint64_t> _size{0};
    uint32_t _min_block = 512;
    uint32_t _physical_block = 512;
    uint64_t _max_discard = 0;
    uint32_t _mem_align = 512;
};

// Counters of rare events, shared by the rings of one target (relaxed
// atomics, touched only off the fast path). For describe().
struct file_engine_stats {
    std::atomic<uint64_t> short_transfers{0};      // reads/writes finished by a resubmission
    std::atomic<uint64_t> retries{0};              // EAGAIN / EINTR resubmissions
    std::atomic<uint64_t> unaligned_buffered{0};   // requests sent to buffered_fd()
    std::atomic<uint64_t> zero_range_emulated{0};  // ZERO_RANGE refused: punch + allocate
    std::atomic<uint64_t> sync_discards{0};        // block-device discards run as a blocking ioctl
    std::atomic<uint64_t> memory_copies{0};   // reads/writes on tmpfs/ramfs done with pread/pwrite
    std::atomic<uint64_t> ring_handovers{0};  // single-issuer rings rebuilt for a new thread
    // Appends written by the queue's thread (append(); counted per write,
    // beside a system call that costs far more).
    std::atomic<uint64_t> held_appends{0};
    // Writes whose data stayed in the kernel (external_data.hpp), and
    // kernel buffers the kernel refused to register or unregister.
    std::atomic<uint64_t> kernel_buffer_writes{0};
    std::atomic<uint64_t> kernel_buffer_errors{0};
    // Rings rebuilt without DEFER_TASKRUN for their first kernel buffer.
    std::atomic<uint64_t> kernel_buffer_rings{0};
    // io_uring_enter refused the ring for good (EEXIST: a thread the kernel
    // did not bind it to): its queued and later requests failed.
    std::atomic<uint64_t> ring_errors{0};
    // Queue rings running on their front end's ring now (borrow_ring).
    std::atomic<uint64_t> borrowed_rings{0};
    std::atomic<bool> no_zero_range{false};     // the file system refused FALLOC_FL_ZERO_RANGE
    std::atomic<bool> no_uring_discard{false};  // the kernel has no BLOCK_URING_CMD_DISCARD
};

// How a ring was set up (for describe() and the tests).
enum class ring_mode : uint8_t {
    defer_taskrun,  // SINGLE_ISSUER | DEFER_TASKRUN | TASKRUN_FLAG
    coop_taskrun,   // COOP_TASKRUN | TASKRUN_FLAG
    plain,          // neither (kernels before 5.19)
};
const char* to_string(ring_mode mode);

// One io_uring for one device queue. Every call comes from the thread that
// drives the queue (the target_queue's thread); the ring is created on the
// control thread but bound to the first thread that submits. Requests carry
// their own state (io_request::target_scratch), so nothing is allocated per
// I/O. Completions go to the sink given at creation, from poll().
class file_ring {
public:
    // A ring for up to `depth` requests at once (more are accepted and
    // queued in the submission ring as it drains) over `files` (which must
    // outlive the ring), completing to `sink`. `stats` is shared by the
    // rings of one target. `best`: the most capable mode to try; the ring
    // falls back to the next ones the kernel has (defer_taskrun, then
    // coop_taskrun, then plain). Control thread.
    static result<std::unique_ptr<file_ring>> create(std::span<backing_file* const> files,
                                                     unsigned depth, completion_sink& sink,
                                                     file_engine_stats& stats,
                                                     ring_mode best = ring_mode::defer_taskrun);
    ~file_ring();
    file_ring(const file_ring&) = delete;
    file_ring& operator=(const file_ring&) = delete;

    // Operations on file number `file` (an index into the files given to
    // create) at byte `file_offset`. Each completes `r` exactly once with
    // the request's result: read/write return r.length (never less: short
    // transfers are finished, a read at the end of the file fills zeros),
    // the others 0, or a negative errno. Queue thread.
    void read(io_request& r, unsigned file, uint64_t file_offset);
    // `fua`: the data is durable when the write completes (RWF_DSYNC).
    void write(io_request& r, unsigned file, uint64_t file_offset, bool fua);
    // A write that extends the file (starts at its end: a zone file's
    // write pointer), completed as write() completes. File systems cannot
    // do such a direct write without blocking (ext4 and XFS refuse
    // IOCB_NOWAIT for it), so io_uring would hand it to an io-wq worker and
    // back: two thread switches. An append that is alone in the ring until
    // the owner's next poll() (nothing else in flight, queued or joining
    // it) is instead written by poll() itself with pwritev2, blocking the
    // queue's thread as the kernel's zloop blocks its worker on the same
    // write; with other requests in the ring it goes through the ring like
    // any write, so that the workers overlap them.
    void append(io_request& r, unsigned file, uint64_t file_offset, bool fua);
    // write() and append() also take a request whose data is in the kernel
    // (a kernel_buffer, external_data.hpp; never for read()): the pages
    // are registered in the ring's table of fixed buffers, written with
    // WRITE_FIXED (the ring's path, never held) and unregistered before
    // the request completes.

    // fdatasync(2) of the file.
    void flush(io_request& r, unsigned file);
    // The range reads as zeros afterwards. `unmap`: it may be deallocated
    // (PUNCH_HOLE; a block device's write-zeroes-with-unmap), otherwise it
    // stays allocated (ZERO_RANGE, emulated by punch + allocate where the
    // file system refuses it; a block device's BLKZEROOUT).
    // `fast_only` (NBD's FAST_ZERO): a block device that would write the
    // zeros itself fails the request with -EOPNOTSUPP instead (on a file,
    // fallocate is always metadata only).
    void write_zeroes(io_request& r, unsigned file, uint64_t file_offset, uint64_t length,
                      bool unmap, bool fast_only = false);
    // Discard: PUNCH_HOLE on a file, BLKDISCARD on a block device.
    void discard(io_request& r, unsigned file, uint64_t file_offset, uint64_t length);
    // fallocate(2) with any mode (for targets that need more than the above,
    // e.g. preallocation); completes with 0 or -errno.
    void fallocate(io_request& r, unsigned file, int mode, uint64_t file_offset, uint64_t length);

    // Completes `r` at once with `result` (bytes, entries or a negative
    // errno: an operation answered without the ring, or one the caller does
    // not serve), through the sink as every other completion.
    void complete_now(io_request& r, int result) { _sink.complete(r, result); }

    // Submits what was queued, reaps completions and completes their
    // requests through the sink. Returns how many requests it completed.
    // On a borrowed ring it only writes a held append: the ring's owner
    // submits and reaps.
    unsigned poll();

    // Runs the ring's entries on `ring` instead, the io_uring of the
    // queue's owner (a ublk queue thread's, which carries its commands):
    // the owner submits them with its own before it waits and passes their
    // completions to on_completion(), so a request costs no io_uring_enter
    // and no eventfd wake-up of its own. `ring` must have no fixed-file
    // table (the files are registered there, as in the own ring) and
    // entries' user_data below 2^63 are the file ring's (the owner marks
    // its own with bit 63). Only with nothing in flight, on the thread
    // that will drive the queue; false (nothing changed) otherwise or
    // where the kernel refuses the files. nullptr gives the ring back
    // (its files and buffers unregistered from it): true once nothing is
    // in flight. Owner thread.
    bool borrow_ring(io_uring* ring);
    bool borrowed() const { return _borrowed != nullptr; }
    // A completion from the borrowed ring whose user_data is the file
    // ring's. Owner thread.
    void on_completion(uint64_t user_data, int res);
    // Requests in the ring (submitted or queued) not completed yet.
    unsigned in_flight() const { return _in_flight; }
    // An eventfd registered with the ring: readable when poll() has
    // completions to reap. Stays the same for the ring's life; -1 while a
    // ring is borrowed (its owner sees the completions).
    int event_fd() const { return _borrowed != nullptr ? -1 : _event_fd; }
    // 0 when poll() has work now (requests queued but not submitted yet,
    // completions waiting), UINT64_MAX otherwise: then the owner sleeps on
    // event_fd(). Owners call it before each sleep (the queue's
    // next_event_ns and wait do); it resets the eventfd, so that a
    // level-triggered sleep does not wake for completions already reaped.
    uint64_t next_wakeup_ns() const;
    ring_mode mode() const { return _mode; }

private:
    file_ring(std::span<backing_file* const> files, unsigned depth, completion_sink& sink,
              file_engine_stats& stats);
    result<void> setup(ring_mode mode);
    void teardown();
    // The ring entries go to: the borrowed one, else the own.
    io_uring* ring() const { return _borrowed != nullptr ? _borrowed : _ring.get(); }
    // Makes room in a full submission ring: hands its entries to the kernel.
    void make_room();
    bool owner_ok();
    bool admit(io_request& r);
    void start_fsync(io_request& r);
    void start_discard(io_request& r, unsigned file, uint64_t file_offset, uint64_t length);
    // An entry for `r`'s next step, or nullptr after completing `r` with
    // the error when the ring takes none.
    io_uring_sqe* next_sqe(io_request& r);
    void start_rw(io_request& r);
    void start_kernel_write(io_request& r);
    // Rebuilds a DEFER_TASKRUN ring as COOP_TASKRUN once nothing but the
    // kernel-buffer writes waiting for it is in flight, then starts them.
    void leave_defer_taskrun();
    // Queues the entry that takes `r`'s kernel buffer out of the table.
    void release_kernel_buffer(io_request& r);
    // A register or unregister entry failed (its user_data is tagged).
    void on_buffer_note(uintptr_t data, int res);
    // Whether `r`'s rest can go to the O_DIRECT descriptor (counts
    // unaligned_buffered when the file is direct but `r` is not aligned).
    bool direct_ok(const io_request& r);
    // `r`'s rest with preadv2/pwritev2 on `fd`, on this thread.
    void copy_rw(io_request& r, int fd);
    void write_held();
    void start_fallocate(io_request& r, int mode, uint64_t offset, uint64_t length);
    void start_discard_bdev(io_request& r);
    void on_cqe(io_request& r, int res);
    void finish(io_request& r, int result);
    void submit_queued();
    void fail_unsubmitted();
    void drain_event_fd() const;

    std::vector<backing_file*> _files;
    std::vector<int> _registered;  // fixed-file table: [direct, buffered] per file
    unsigned _depth;
    completion_sink& _sink;
    file_engine_stats& _stats;
    std::unique_ptr<io_uring> _ring;
    bool _ring_ready = false;
    ring_mode _mode = ring_mode::plain;
    bool _enabled = false;  // R_DISABLED ring enabled by its owner thread
    uint64_t _owner = 0;    // the thread that enabled the ring (this_thread_id)
    // Non-zero: the kernel refused the ring to this thread for good; every
    // request fails with this (-EBUSY for EEXIST) until setup() again.
    int _broken = 0;
    int _submit_error = -EBUSY;     // the last io_uring_enter error
    unsigned _submit_failures = 0;  // transient submit errors in a row
    int _event_fd = -1;
    unsigned _in_flight = 0;
    unsigned _unsubmitted = 0;
    uint64_t _finished = 0;
    // An append alone in the ring, not in the submission ring: poll()
    // writes it, admit() of another request puts it in the ring.
    io_request* _held = nullptr;
    // Slots of the fixed-buffer table (registered sparse at the first
    // kernel buffer; 0: none yet).
    unsigned _buffer_slots = 0;
    // Kernel-buffer writes waiting for leave_defer_taskrun (FIFO through
    // io_request::next).
    io_request* _awaiting_head = nullptr;
    io_request* _awaiting_tail = nullptr;
    unsigned _awaiting = 0;
    // borrow_ring: the owner's ring and thread, and the own ring's
    // fixed-buffer slots while the borrowed one has its own.
    io_uring* _borrowed = nullptr;
    uint64_t _borrower = 0;
    unsigned _own_buffer_slots = 0;
};

// The target_queue half of a target whose queue runs its I/O on one
// file_ring (the file and zloop targets): waiting, ring sharing and
// timeouts are the ring's. `Base` is target_queue or a queue type derived
// from it; a template rather than a common base class because the zloop
// queue must also be a zloop_queue (whose submit() is final: the zone
// model's steps, then the data through virtual hooks): a plain base beside
// it would make target_queue a base twice (a diamond, needing virtual
// inheritance on the hot path), while the template puts the ring's answers
// on top of whichever queue type the target already is, one chain, no
// extra indirection. The derived queue sets ring() before I/O and
// implements submit() (or Base's hooks).
template <typename Base>
class file_ring_queue : public Base, public target_ring_sharing {
public:
    using Base::Base;

    unsigned poll() override { return _ring->poll(); }
    bool busy() const override { return _ring->in_flight() != 0; }
    int wait_fd() const override { return _ring->event_fd(); }
    uint64_t next_wakeup_ns() const override { return _ring->next_wakeup_ns(); }
    // Its ring may run in its owner's (ring_sharing.hpp).
    target_ring_sharing* ring_sharing() override { return this; }
    bool share_ring(io_uring* ring) override { return _ring->borrow_ring(ring); }
    bool ends_with_ring_write() const override { return true; }
    void ring_completion(uint64_t user_data, int result) override
    {
        _ring->on_completion(user_data, result);
    }
    // The kernel holds the request and may still write its buffer: it
    // cannot be let go before its completion arrives.
    bool timed_out(io_request&) override { return false; }

    void set_ring(std::unique_ptr<file_ring> ring) { _ring = std::move(ring); }

protected:
    file_ring& ring() { return *_ring; }

private:
    std::unique_ptr<file_ring> _ring;
};

// Shared helpers of the engine.
class file_engine {
public:
    // The allocation map of [offset, offset+length) of `fd` from SEEK_DATA /
    // SEEK_HOLE, appended to `out` in order with no gaps; holes are shrunk
    // to whole `block`s (a partial block counts as data), adjacent extents
    // of one kind merged. A file system without SEEK_DATA (or a block
    // device) reports data. Returns 0 or -errno. Any thread; safe against
    // concurrent I/O on the file (the result may be stale, never wrong
    // about data acknowledged before the call).
    static int map_extents(int fd, uint64_t offset, uint64_t length, uint32_t block,
                           std::vector<extent>& out);
};

}  // namespace softblk
