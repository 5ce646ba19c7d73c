// The file target: a device whose data lives in an image file or a block
// device, as ublksrv's and rublk's `loop`, nbdkit's `file` plugin and
// qemu-storage-daemon's `file` driver serve it. It stands on the file
// engine (include/softblk/file_engine.hpp): one io_uring per queue,
// O_DIRECT by default. docs/file.md has the options and the rules.
//
// Built as the null target is (src/targets/null): an option table, a target
// (geometry, the backing file, the allocation map), a target_queue (the hot
// path, one file_ring) and a static registration object.
#include <softblk/file_engine.hpp>
#include <softblk/target.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <fcntl.h>
#include <fmt/core.h>
#include <functional>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace softblk::targets {

namespace {

// Largest read or write in one request: 512 KiB, ublksrv's default I/O
// buffer (the ublk front end sizes its per-tag buffers from it).
constexpr uint32_t k_max_transfer = 512u << 10;

constexpr option_def k_file_options[] = {
    {.name = "path",
     .kind = option_kind::text,
     .default_value = "",
     .unit = "absolute path",
     .help = "the image file or block device that holds the data (required)",
     .check = check_absolute_path},
    {.name = "size",
     .kind = option_kind::text,
     .default_value = "0",
     .unit = "bytes",
     .help = "device size, bytes with an optional binary suffix (64M, 1.5G); 0: the whole "
             "file (with create=1 too, when it exists); larger than the file needs create=1, "
             "which grows it sparsely. Live: written while powered on it resizes the device (0: "
             "to the file's size now, as losetup -c)",
     .update = option_update::live,
     .check = check_byte_size},
    {.name = "create",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "create a missing file (mode 0600) as a sparse file of size= bytes, or grow a "
             "smaller one; never truncates. A failed add removes a file it created"},
    {.name = "read_only",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "open the file read-only and refuse writes; read-only devices may share a file"},
    {.name = "buffered_io",
     .kind = option_kind::boolean,
     .default_value = "0",
     .unit = "",
     .help = "use the page cache instead of O_DIRECT (ublksrv's, rublk's and zloop's name)"},
    {.name = "blocksize",
     .kind = option_kind::integer,
     .default_value = "0",
     .unit = "bytes",
     .help = "logical block size: 512, 1024, 2048 or 4096; 0: the smallest direct I/O accepts "
             "(the file system's or block device's logical block size); refused below it",
     .min = 0,
     .max = 4096,
     .alias = "bs"},
    {.name = "io_uring_mode",
     .kind = option_kind::text,
     .default_value = "defer_taskrun",
     .unit = "",
     .help = "how each queue's io_uring runs completions: defer_taskrun (only when the queue's "
             "thread asks), coop_taskrun or plain; a mode the kernel lacks falls back to the "
             "next"},
};

// `size=` in bytes (a binary suffix allowed), a multiple of `block_size`:
// at creation (where the smallest block size is checked first) and when
// written live.
result<uint64_t> parse_size_option(const std::string& text, uint64_t block_size)
{
    auto size = parse_size(text);
    if (!size) {
        return make_error(size.error().code.value(),
                          fmt::format("size={}: {}", text, size.error().message));
    }
    if (*size % block_size != 0) {
        return make_error(
            EINVAL,
            fmt::format("size={}: not a multiple of the block size ({} bytes)", text, block_size));
    }
    return *size;
}

// Per-queue half: one ring, driven by the queue's thread.
class file_queue final : public file_ring_queue<target_queue> {
public:
    file_queue(target& file, std::unique_ptr<file_ring> ring) : _file(file)
    {
        set_ring(std::move(ring));
    }

    void submit(io_request& r) override;

private:
    target& _file;
};

class file_target final : public target {
public:
    file_target(std::unique_ptr<backing_file> file, const block_limits& limits, unsigned depth,
                bool buffered_io, ring_mode mode)
        : _file(std::move(file)),
          _limits(limits),
          _depth(depth),
          _buffered_io(buffered_io),
          _asked_mode(mode)
    {
    }

    const block_limits& limits() const override { return _limits; }
    // Every write goes to the file ring, which takes data in the kernel.
    external_data_support takes_external_data() const override { return {.kernel_buffers = true}; }

    void watch_capacity(std::function<void(uint64_t bytes)> resized) override
    {
        _resized = std::move(resized);
    }

    // `size` written while powered on: the device takes the new size.
    result<void> apply_option(const option_def& def, const option_set& options) override
    {
        if (def.name != "size") {
            return target::apply_option(def, options);
        }
        if (!_resized) {
            // The core gave no callback (a device that keeps its size).
            return make_error(EBUSY,
                              "size: this device cannot change its size while powered on; "
                              "write power=0 first");
        }
        auto capacity = resized_capacity(options);
        if (!capacity) {
            return std::unexpected(capacity.error());
        }
        set_capacity(_limits, *capacity);
        _resized(*capacity);  // the core tells the front ends
        return {};
    }

    result<std::unique_ptr<target_queue>> open_queue(unsigned, completion_sink& sink) override
    {
        backing_file* files[] = {_file.get()};
        auto ring = file_ring::create(files, _depth, sink, _stats, _asked_mode);
        if (!ring) {
            return make_error(ring.error().code.value(),
                              fmt::format("path={}: {}", _file->path(), ring.error().message));
        }
        _ring_mode.store(static_cast<uint8_t>((*ring)->mode()), std::memory_order_relaxed);
        return std::make_unique<file_queue>(*this, std::move(*ring));
    }

    int map_extents(uint64_t offset, uint64_t length, std::vector<extent>& out) override
    {
        const uint64_t end = std::min(current_capacity(_limits), offset + length);
        if (offset >= end) {
            return 0;
        }
        return file_engine::map_extents(_file->buffered_fd(), offset, end - offset,
                                        _limits.logical_block_size, out);
    }

    // The add that made this device failed: an image this target created
    // goes, if it is still that file.
    void remove_created() override
    {
        if (_file->created()) {
            remove_if_same(AT_FDCWD, _file->path(), _file->identity());
        }
    }

    void describe(nlohmann::json& out) const override
    {
        out["path"] = _file->path();
        out["block_device"] = _file->block_device();
        out["file_size"] = _file->size();
        out["direct_io"] = _file->direct();
        out["buffered_io"] = _buffered_io;
        if (!_file->direct_refused().empty()) {
            out["direct_io_refused"] = _file->direct_refused();
            // `softblk list` prints a target's notice under its row.
            out["notice"] = fmt::format("{}: {}", _file->path(), _file->direct_refused());
        }
        out["ring_mode"] = to_string(static_cast<ring_mode>(_ring_mode.load()));
        out["short_transfers"] = _stats.short_transfers.load(std::memory_order_relaxed);
        out["retries"] = _stats.retries.load(std::memory_order_relaxed);
        out["unaligned_buffered"] = _stats.unaligned_buffered.load(std::memory_order_relaxed);
        out["zero_range_emulated"] = _stats.zero_range_emulated.load(std::memory_order_relaxed);
        out["sync_discards"] = _stats.sync_discards.load(std::memory_order_relaxed);
        out["memory_copies"] = _stats.memory_copies.load(std::memory_order_relaxed);
        out["kernel_buffer_writes"] = _stats.kernel_buffer_writes.load(std::memory_order_relaxed);
        out["kernel_buffer_errors"] = _stats.kernel_buffer_errors.load(std::memory_order_relaxed);
        out["kernel_buffer_rings"] = _stats.kernel_buffer_rings.load(std::memory_order_relaxed);
        out["ring_handovers"] = _stats.ring_handovers.load(std::memory_order_relaxed);
        out["ring_errors"] = _stats.ring_errors.load(std::memory_order_relaxed);
        out["borrowed_rings"] = _stats.borrowed_rings.load(std::memory_order_relaxed);
    }

private:
    // The capacity `size` asks for, as at creation: 0 the whole file (as
    // it is now), more than the file grows it with create=1, less leaves
    // the file as it is. Refusals name the option and change nothing.
    result<uint64_t> resized_capacity(const option_set& options);

    std::unique_ptr<backing_file> _file;
    block_limits _limits;
    std::function<void(uint64_t)> _resized;
    unsigned _depth;
    bool _buffered_io;
    ring_mode _asked_mode;
    file_engine_stats _stats;
    std::atomic<uint8_t> _ring_mode{static_cast<uint8_t>(ring_mode::plain)};
};

result<uint64_t> file_target::resized_capacity(const option_set& options)
{
    const std::string& text = options.text("size");
    const uint32_t bs = _limits.logical_block_size;
    auto size = parse_size_option(text, bs);
    if (!size) {
        return std::unexpected(size.error());
    }
    auto file_bytes = _file->measure_size();
    if (!file_bytes) {
        return std::unexpected(file_bytes.error());
    }
    if (*size == 0) {
        // losetup -c: the whole file as it is now, in whole blocks.
        const uint64_t whole = *file_bytes / bs * bs;
        if (whole == 0) {
            return make_error(EINVAL, fmt::format("size=0: {} has {} bytes, less than one block "
                                                  "({} bytes)",
                                                  _file->path(), *file_bytes, bs));
        }
        return whole;
    }
    if (*size > *file_bytes) {
        if (!options.flag("create")) {
            return make_error(EINVAL, fmt::format("size={}: larger than {} ({} bytes); the device "
                                                  "grows its file only with create=1 (or grow the "
                                                  "file yourself and write size=0)",
                                                  text, _file->path(), *file_bytes));
        }
        if (auto grown = _file->grow(*size); !grown) {
            return std::unexpected(grown.error());
        }
    }
    return *size;
}

void file_queue::submit(io_request& r)
{
    switch (r.op) {
    case io_op::read:
        ring().read(r, 0, r.offset);
        return;
    case io_op::write:
        ring().write(r, 0, r.offset, (r.flags & k_io_fua) != 0);
        return;
    case io_op::flush:
        ring().flush(r, 0);
        return;
    case io_op::discard:
        ring().discard(r, 0, r.offset, r.length);
        return;
    case io_op::write_zeroes:
        ring().write_zeroes(r, 0, r.offset, r.length, (r.flags & k_io_no_unmap) == 0,
                            (r.flags & k_io_fast_zero) != 0);
        return;
    case io_op::report_extents:
        // SEEK_DATA/SEEK_HOLE on the queue's thread: a few system calls.
        ring().complete_now(r, answer_report_extents(_file, r));
        return;
    default:
        break;
    }
    // Zone operations: the core refuses them for a device that is not
    // zoned; here for a caller that skips its validation.
    ring().complete_now(r, -EOPNOTSUPP);
}

result<std::unique_ptr<target>> create_file(const option_set& o)
{
    const std::string& path = o.text("path");
    if (path.empty()) {
        return make_error(EINVAL,
                          "path: the file target needs path=IMAGE (an image file or a "
                          "block device)");
    }
    ring_mode mode = ring_mode::defer_taskrun;
    const std::string& mode_text = o.text("io_uring_mode");
    if (mode_text == "coop_taskrun") {
        mode = ring_mode::coop_taskrun;
    } else if (mode_text == "plain") {
        mode = ring_mode::plain;
    } else if (mode_text != "defer_taskrun") {
        return make_error(EINVAL, fmt::format("io_uring_mode={}: give defer_taskrun, coop_taskrun "
                                              "or plain",
                                              mode_text));
    }
    const uint64_t bs_given = o.u64("blocksize");
    if (bs_given != 0 && (bs_given < 512 || (bs_given & (bs_given - 1)) != 0)) {
        return make_error(EINVAL, fmt::format("blocksize={}: blocksize must be 0 (the file's "
                                              "own) or a power of two from 512 to 4096",
                                              bs_given));
    }
    // A size that is not whole blocks is refused before anything is
    // created (the block size of a new file is known only once it exists,
    // so the smallest, 512, is checked first and the real one below).
    auto size = parse_size_option(o.text("size"), std::max<uint64_t>(bs_given, 512));
    if (!size) {
        return std::unexpected(size.error());
    }
    backing_file_options fo{.read_only = o.flag("read_only"),
                            .buffered_io = o.flag("buffered_io"),
                            .create = o.flag("create"),
                            .grow_to = *size};
    // create=1 with size=0 takes an existing file whole, as without
    // create=1 (what `set size=0` leaves in the saved options, so that a
    // restart brings the device back); a missing file needs a size
    // (backing_file says so).
    // Everything that depends on the file is checked after it is opened
    // and before it is grown, so that a refusal creates or changes nothing.
    uint32_t bs = 0;
    uint64_t capacity = 0;
    auto check = [&](const backing_file& f) -> result<void> {
        bs = bs_given != 0 ? static_cast<uint32_t>(bs_given)
                           : std::max<uint32_t>(f.min_block_size(), 512);
        if (bs < f.min_block_size()) {
            return make_error(EINVAL,
                              fmt::format("blocksize={}: {} needs at least {} bytes per block for "
                                          "direct I/O (give buffered_io=1 for less)",
                                          bs, path, f.min_block_size()));
        }
        if (bs > 4096) {
            return make_error(EINVAL, fmt::format("path={}: its logical block size is {} bytes, "
                                                  "larger than the 4096 a device may have",
                                                  path, bs));
        }
        if (*size > f.size() && !fo.create) {
            return make_error(EINVAL, fmt::format("size={}: larger than {} ({} bytes); give "
                                                  "create=1 to grow the file",
                                                  *size, path, f.size()));
        }
        capacity = *size != 0 ? *size : f.size();
        if (capacity < bs) {
            return make_error(EINVAL, fmt::format("path={}: {} bytes is smaller than one block "
                                                  "({} bytes)",
                                                  path, capacity, bs));
        }
        if (capacity % bs != 0) {
            return make_error(EINVAL,
                              fmt::format("path={}: {} bytes is not a multiple of the block size "
                                          "({} bytes); give size= a multiple of it",
                                          path, capacity, bs));
        }
        return {};
    };
    auto file = backing_file::open(path, fo, check);
    if (!file) {
        return std::unexpected(file.error());
    }
    backing_file& f = **file;
    if (!f.direct_refused().empty()) {
        // Once per device, in the daemon's log; `softblk list` shows it too.
        spdlog::warn("file target {}", fmt::format("{}: {}", path, f.direct_refused()));
    }

    block_limits lim;
    lim.capacity_bytes = capacity;
    lim.logical_block_size = bs;
    lim.physical_block_size = std::clamp<uint32_t>(f.physical_block_size(), bs, 65536);
    lim.max_transfer_bytes = k_max_transfer;
    const uint32_t whole = (UINT32_MAX / bs) * bs;
    lim.max_discard_bytes =
        static_cast<uint32_t>(std::min<uint64_t>(f.max_discard_bytes() / bs * bs, whole));
    lim.max_write_zeroes_bytes = fo.read_only ? 0 : whole;
    // Data reaches the file's blocks at once (O_DIRECT) or the page cache,
    // but allocation metadata, the page cache and a disk's own cache are
    // durable only after fdatasync: the device has a volatile write cache,
    // as the kernel's loop device says, and FLUSH is fdatasync. FUA is
    // honoured with RWF_DSYNC.
    lim.volatile_write_cache = !fo.read_only;
    lim.fua = !fo.read_only;
    lim.read_only = fo.read_only;
    lim.rotational = false;
    return std::make_unique<file_target>(std::move(*file), lim,
                                         static_cast<unsigned>(o.u64("hw_queue_depth")),
                                         fo.buffered_io, mode);
}

[[maybe_unused]] const bool k_registered = register_target_type(target_type{
    .name = "file",
    .description = "an image file or a block device (loop): O_DIRECT through one io_uring per "
                   "queue; the data persists",
    .options = k_file_options,
    .create = create_file,
    .submit_queues = nullptr,
});

}  // namespace

}  // namespace softblk::targets
