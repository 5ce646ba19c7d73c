// The zloop target: a zoned device with one file per zone, in the layout of
// the kernel's zoned loop driver (drivers/block/zloop.c), so that a
// directory made by the kernel's zloop opens here and back. The zone model
// is the zone engine's zloop flavour (include/softblk/zone_engine.hpp); the
// data goes through the file engine (include/softblk/file_engine.hpp): one
// io_uring per queue over every zone file, O_DIRECT unless buffered_io=1.
// zloop_layout.cpp opens the directory. docs/zoned.md has the options and
// the rules.
#include "zloop_common.hpp"
#include "zloop_layout.hpp"

#include <softblk/file_engine.hpp>
#include <softblk/target.hpp>
#include <softblk/zone_engine.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fmt/core.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

namespace softblk::targets {

namespace {

class zloop_target;

// Per-queue half: the shared zone logic (zloop_common.hpp) over one ring
// on every zone file, driven by the queue's thread. It is the ring's
// completion sink, to see failed writes first.
class zloop_file_queue final : public file_ring_queue<zloop::zloop_queue>, public completion_sink {
public:
    zloop_file_queue(zloop_target& t, completion_sink& sink);

    // completion_sink: a write that did not land makes the engine re-read
    // the zone's file before its next use.
    void complete(io_request& r, int result) override
    {
        note_result(r, result);
        _sink.complete(r, result);
    }

private:
    // Past the write pointer a zone file ends: the ring reads zeros.
    void read_data(io_request& r, uint32_t zone, uint64_t zone_offset) override
    {
        ring().read(r, zone, zone_offset);
    }
    // A sequential zone's write starts at its write pointer, its file's
    // end: an append (file_ring::append says what that changes).
    void write_data(io_request& r, uint32_t zone, uint64_t zone_offset) override;
    void complete_now(io_request& r, int result) override { ring().complete_now(r, result); }
    int flush() override;
    void zone_written(uint32_t zone) override;

    zloop_target& _t;
    completion_sink& _sink;
};

class zloop_target final : public target, public zone_backend {
public:
    zloop_target(zloop::zone_files files, const zloop::geometry& g, bool discard_cache,
                 bool ordered_append, unsigned depth, bool prealloc)
        : _files(std::move(files)),
          _geo(g),
          _discard_cache(discard_cache),
          _ordered_append(ordered_append),
          _prealloc(prealloc),
          _depth(depth),
          _flushed(std::make_unique<std::atomic<int64_t>[]>(g.nr_zones)),
          _dirty(std::make_unique<std::atomic<bool>[]>(g.nr_zones)),
          _pending(std::make_unique<std::atomic<int64_t>[]>(g.nr_zones)),
          _preallocated(std::make_unique<std::atomic<bool>[]>(g.nr_zones))
    {
        for (uint32_t i = 0; i < g.nr_zones; ++i) {
            _flushed[i].store(zloop::stored_bytes(fd(i), _geo), std::memory_order_relaxed);
            _dirty[i].store(false, std::memory_order_relaxed);
            _pending[i].store(-1, std::memory_order_relaxed);
            _preallocated[i].store(false, std::memory_order_relaxed);
        }
    }

    ~zloop_target() override
    {
        if (_discard_cache) {
            cut_to_flushed();
        }
    }

    // The add that made this device failed: the zone files it created go.
    void remove_created() override { _files.remove_created(); }

    result<void> init(const zone_engine_config& config, bool zone_append)
    {
        auto engine = zone_engine::create(config, this);
        if (!engine) {
            return std::unexpected(engine.error());
        }
        _zones = std::move(*engine);
        for (uint32_t i = _geo.conv_zones; i < _geo.nr_zones; ++i) {
            const int64_t stored = zloop::stored_bytes(fd(i), _geo);
            if (stored < 0) {
                return make_error(static_cast<int>(-stored),
                                  fmt::format("{}: fstat: {}", path(i), std::strerror(-stored)));
            }
            if (auto r = _zones->restore_zone(i, static_cast<uint64_t>(stored)); !r) {
                return make_error(EINVAL, fmt::format("{}: {}", path(i), r.error().message));
            }
        }
        // zloop: a volatile write cache (FLUSH syncs the file system), no FUA.
        _limits = zloop::device_limits(*_zones, config.block_size, zone_append, true);
        return {};
    }

    const block_limits& limits() const override { return _limits; }
    // Zone data goes only through the file ring, which takes data in the
    // kernel.
    external_data_support takes_external_data() const override { return {.kernel_buffers = true}; }
    // The zone descriptors, charged to the daemon's budget (the data is in
    // the files).
    uint64_t memory_bytes() const override { return _zones ? _zones->memory_bytes() : 0; }
    zone_engine& zones() { return *_zones; }
    int fd(uint32_t zone) const { return _files.files[zone]->buffered_fd(); }
    std::string path(uint32_t zone) const { return _files.files[zone]->path(); }
    void mark_dirty(uint32_t zone)
    {
        if (_discard_cache) {
            _dirty[zone].store(true, std::memory_order_relaxed);
        }
    }

    result<std::unique_ptr<target_queue>> open_queue(unsigned, completion_sink& sink) override
    {
        std::vector<backing_file*> files;
        files.reserve(_files.files.size());
        for (auto& f : _files.files) {
            files.push_back(f.get());
        }
        auto q = std::make_unique<zloop_file_queue>(*this, sink);
        auto ring = file_ring::create(files, _depth, *q, _stats);
        if (!ring) {
            return make_error(ring.error().code.value(),
                              fmt::format("{}: {}", _files.dir.path, ring.error().message));
        }
        q->set_ring(std::move(*ring));
        return q;
    }

    // zloop_flush: sync the whole file system that holds the zone files
    // (metadata included: a sequential zone's write pointer is its file's
    // size). Runs on the queue's thread and blocks it, as zloop's worker
    // blocks. Returns 0 or -errno.
    int flush()
    {
        // discard_write_cache: the sizes of the zones changed since the last
        // flush are read before the sync (what the flush covers: every
        // acknowledged write is in its file's size) and kept once it
        // succeeded. Preallocated: nothing is allocated per flush.
        if (_discard_cache) {
            for (uint32_t i = _geo.conv_zones; i < _geo.nr_zones; ++i) {
                if (_dirty[i].exchange(false, std::memory_order_relaxed)) {
                    _pending[i].store(zloop::stored_bytes(fd(i), _geo), std::memory_order_relaxed);
                }
            }
        }
        const int rc = ::syncfs(_files.dir.fd) == 0 ? 0 : -errno;
        if (_discard_cache) {
            for (uint32_t i = _geo.conv_zones; i < _geo.nr_zones; ++i) {
                const int64_t size = _pending[i].exchange(-1, std::memory_order_relaxed);
                if (size < 0) {
                    continue;
                }
                if (rc == 0) {
                    _flushed[i].store(size, std::memory_order_relaxed);
                } else {
                    _dirty[i].store(true, std::memory_order_relaxed);
                }
            }
        }
        return rc;
    }

    // zone_backend: reset truncates the zone's file to 0, finish extends it
    // to the zone capacity, as 7.3.4's zloop does (which refuses a larger
    // file; zloop_layout also reads a file of the zone size as full).
    // Queue thread, zone locked.
    int reset_zone(uint32_t zone) override
    {
        mark_dirty(zone);
        // (The truncation frees the zone's preallocated blocks too.)
        _preallocated[zone].store(false, std::memory_order_relaxed);
        return ::ftruncate(fd(zone), 0) == 0 ? 0 : -EIO;
    }
    int finish_zone(uint32_t zone) override
    {
        mark_dirty(zone);
        return ::ftruncate(fd(zone), static_cast<off_t>(_geo.zone_capacity)) == 0 ? 0 : -EIO;
    }
    int64_t stored_bytes(uint32_t zone) override { return zloop::stored_bytes(fd(zone), _geo); }

    // prealloc: before the first write of sequential zone `zone` since the
    // device opened or the zone was reset, the zone file's blocks from
    // `zone_offset` (that write's) to the zone capacity are allocated,
    // beyond the file's end: its size, the write pointer, stays. On XFS the
    // appends that follow then go without blocking
    // (preallocation_unblocks_appends). A failure (ENOSPC) only costs
    // that: the appends allocate as they go. Queue thread.
    void preallocate(uint32_t zone, uint64_t zone_offset)
    {
        // (Every append comes here: a load, and the exchange only once.)
        if (!_prealloc || zone_offset >= _geo.zone_capacity ||
            _preallocated[zone].load(std::memory_order_relaxed) ||
            _preallocated[zone].exchange(true, std::memory_order_relaxed)) {
            return;
        }
        if (::fallocate(fd(zone), FALLOC_FL_KEEP_SIZE, static_cast<off_t>(zone_offset),
                        static_cast<off_t>(_geo.zone_capacity - zone_offset)) == 0) {
            _stats_preallocated.fetch_add(1, std::memory_order_relaxed);
        } else {
            _stats_prealloc_failed.fetch_add(1, std::memory_order_relaxed);
        }
    }

    void describe(nlohmann::json& out) const override
    {
        out["dir"] = _files.dir.path;
        out["id"] = _files.dir.id;
        out["restored"] = _files.restored;
        out["torn_writes_cut"] = _files.torn_writes_cut;
        out["block_size"] = _files.block_size;
        out["direct_io"] = _files.files.front()->direct();
        out["ordered_zone_append"] = _ordered_append;
        out["discard_write_cache"] = _discard_cache;
        out["prealloc"] = _prealloc;
        out["preallocated_zones"] = _stats_preallocated.load(std::memory_order_relaxed);
        out["prealloc_failures"] = _stats_prealloc_failed.load(std::memory_order_relaxed);
        if (!_files.files.front()->direct_refused().empty()) {
            out["notice"] =
                fmt::format("{}: {}", _files.dir.path, _files.files.front()->direct_refused());
        }
        out["short_transfers"] = _stats.short_transfers.load(std::memory_order_relaxed);
        out["retries"] = _stats.retries.load(std::memory_order_relaxed);
        out["unaligned_buffered"] = _stats.unaligned_buffered.load(std::memory_order_relaxed);
        out["memory_copies"] = _stats.memory_copies.load(std::memory_order_relaxed);
        out["held_appends"] = _stats.held_appends.load(std::memory_order_relaxed);
        out["kernel_buffer_writes"] = _stats.kernel_buffer_writes.load(std::memory_order_relaxed);
        out["kernel_buffer_errors"] = _stats.kernel_buffer_errors.load(std::memory_order_relaxed);
        out["kernel_buffer_rings"] = _stats.kernel_buffer_rings.load(std::memory_order_relaxed);
        out["ring_errors"] = _stats.ring_errors.load(std::memory_order_relaxed);
        out["borrowed_rings"] = _stats.borrowed_rings.load(std::memory_order_relaxed);
        _zones->describe(out);
    }

private:
    // discard_write_cache on removal: each sequential zone file cut back to
    // the size it had at the last flush (a file that shrank since, by a
    // reset, stays: its old data cannot come back).
    void cut_to_flushed()
    {
        for (uint32_t i = _geo.conv_zones; i < _geo.nr_zones; ++i) {
            const int64_t now = zloop::stored_bytes(fd(i), _geo);
            const int64_t then = _flushed[i].load(std::memory_order_relaxed);
            if (now > then && then >= 0 && ::ftruncate(fd(i), then) != 0) {
                spdlog::warn("zloop {}: discard_write_cache: cannot cut {} back to {} bytes",
                             _files.dir.path, path(i), then);
            }
        }
    }

    zloop::zone_files _files;
    zloop::geometry _geo;
    bool _discard_cache;
    bool _ordered_append;
    bool _prealloc;
    unsigned _depth;
    block_limits _limits;
    std::unique_ptr<zone_engine> _zones;
    file_engine_stats _stats;
    // discard_write_cache: each zone's stored bytes at the last flush, and
    // whether it changed since, and the sizes a flush in progress covers.
    std::unique_ptr<std::atomic<int64_t>[]> _flushed;
    std::unique_ptr<std::atomic<bool>[]> _dirty;
    std::unique_ptr<std::atomic<int64_t>[]> _pending;
    // prealloc: whether each zone's rest is allocated (or was tried).
    std::unique_ptr<std::atomic<bool>[]> _preallocated;
    std::atomic<uint64_t> _stats_preallocated{0};
    std::atomic<uint64_t> _stats_prealloc_failed{0};
};

zloop_file_queue::zloop_file_queue(zloop_target& t, completion_sink& sink)
    : file_ring_queue(t.zones()), _t(t), _sink(sink)
{
}

int zloop_file_queue::flush()
{
    return _t.flush();
}

void zloop_file_queue::zone_written(uint32_t zone)
{
    _t.mark_dirty(zone);
}

void zloop_file_queue::write_data(io_request& r, uint32_t zone, uint64_t zone_offset)
{
    if (_t.zones().conventional(zone)) {
        ring().write(r, zone, zone_offset, false);
    } else {
        _t.preallocate(zone, zone_offset);
        ring().append(r, zone, zone_offset, false);
    }
}

// Room for two descriptors per zone file (O_DIRECT and buffered; the rings'
// fixed-file tables hold as many and are bounded by the same limit): raise
// the soft RLIMIT_NOFILE towards the hard one.
result<void> ensure_file_limit(uint64_t zone_files, const std::string& dir)
{
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        return {};
    }
    const uint64_t want = zone_files * 2 + 256;
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        rlimit raised = rl;
        raised.rlim_cur = std::min<rlim_t>(rl.rlim_max, want);
        ::setrlimit(RLIMIT_NOFILE, &raised);
        ::getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
        return make_error(EMFILE, fmt::format("{}: {} zone files need about {} descriptors; the "
                                              "daemon may open {} (ulimit -n)",
                                              dir, zone_files, want, rl.rlim_cur));
    }
    return {};
}

result<std::unique_ptr<target>> create_zloop(const option_set& o)
{
    const std::string& base = o.text("base_dir");
    if (base.empty()) {
        return make_error(EINVAL, "base_dir=: give the directory of the devices' directories");
    }
    auto settings = zloop::parse_zone_settings(o);
    if (!settings) {
        return std::unexpected(settings.error());
    }
    zloop::geometry g = settings->geo;
    g.buffered_io = o.flag("buffered_io");
    const std::string& prealloc = o.text("prealloc");
    if (prealloc != "auto" && prealloc != "0" && prealloc != "1") {
        return make_error(EINVAL, fmt::format("prealloc={}: auto, 0 or 1", prealloc));
    }
    const uint64_t nr_zones = g.nr_zones;
    if (auto r = ensure_file_limit(nr_zones, base); !r) {
        return std::unexpected(r.error());
    }

    auto dir = zloop::open_zone_dir(base, o.i64("id"));
    if (!dir) {
        return std::unexpected(dir.error());
    }
    auto files = zloop::open_zone_files(std::move(*dir), g);
    if (!files) {
        return std::unexpected(files.error());
    }
    const std::string& dir_path = files->dir.path;
    for (const uint32_t z : files->torn_writes_cut) {
        spdlog::warn(
            "zloop {}: {} ended in a partial block (a torn write), cut back to whole "
            "blocks",
            dir_path, zloop::zone_file_name(z, false));
    }
    if (!files->files.front()->direct_refused().empty()) {
        spdlog::warn("zloop {}: {}", dir_path, files->files.front()->direct_refused());
    }
    const zone_engine_config zc = zloop::engine_config(*settings, files->block_size);
    // (Buffered appends wait for no allocation: the page cache takes them.)
    const bool preallocate = prealloc == "1" || (prealloc == "auto" && !g.buffered_io &&
                                                 zloop::preallocation_unblocks_appends(
                                                     files->dir.fd, files->block_size));

    auto t = std::make_unique<zloop_target>(std::move(*files), g, o.flag("discard_write_cache"),
                                            settings->ordered_zone_append, settings->queue_depth,
                                            preallocate);
    if (auto r = t->init(zc, settings->zone_append); !r) {
        t->remove_created();
        return std::unexpected(r.error());
    }
    return t;
}

[[maybe_unused]] const bool k_zloop_registered = register_target_type(target_type{
    .name = "zloop",
    .description = "a zoned device with one file per zone in the kernel's zloop layout "
                   "(BASE_DIR/ID/cnv-NNNNNN, seq-NNNNNN); the zones persist",
    .options = zloop::file_options(),
    .create = create_zloop,
    .submit_queues = zloop::submit_queues,
    .queue_depth = zloop::queue_depth,
});

}  // namespace

}  // namespace softblk::targets
