// The pattern target: a read-only device whose every 8-byte word holds its
// own byte offset, big-endian (nbdkit's pattern plugin). A reader checks
// any block it reads without knowing anything else, so it tests a front
// end's offsets and data path end to end; it keeps no data and needs no
// memory.
//
// It is docs/architecture.md's example of "Adding a target": an option
// table, a target (geometry + queues), a target_queue (the hot path) and
// a static registration object; the folder builds an OBJECT library so
// the registration is always linked in. The device is read-only
// (block_limits::read_only): the core refuses writes, discards and write
// zeroes (EPERM, as the block layer's bio_check_ro) before they reach the
// target, and a kernel front end shows the disk read-only.
#include <softblk/target.hpp>

#include <endian.h>

#include <cerrno>
#include <cstring>
#include <fmt/core.h>
#include <memory>

namespace softblk::targets {

namespace {

// Requests of up to 1 MiB: the reads are a loop over the buffer, longer
// ones only make a front end split later.
constexpr uint32_t k_max_transfer = 1u << 20;

constexpr option_def k_pattern_options[] = {
    {.name = "size",
     .kind = option_kind::text,
     .default_value = "1G",
     .unit = "bytes",
     .help = "device size, bytes with an optional binary suffix (64M, 1.5G); whole blocks",
     .check = check_byte_size},
    {.name = "blocksize",
     .kind = option_kind::integer,
     .default_value = "512",
     .unit = "bytes",
     .help = "logical and physical block size: 512, 1024, 2048 or 4096",
     .min = 512,
     .max = 4096,
     .alias = "bs",
     .bits = 32},
};

// Fills `length` bytes of the device from `offset` into `buffer`. `offset`
// is a multiple of the block size, so of 8: every word starts on a word
// of the device. memcpy, since a front end's buffer need not be aligned.
void fill_pattern(uint64_t offset, uint32_t length, void* buffer)
{
    auto* out = static_cast<unsigned char*>(buffer);
    for (uint32_t i = 0; i < length; i += 8) {
        const uint64_t word = htobe64(offset + i);
        std::memcpy(out + i, &word, sizeof(word));
    }
}

class pattern_target;

class pattern_queue final : public target_queue {
public:
    pattern_queue(pattern_target& t, completion_sink& sink) : _target(t), _sink(sink) {}
    void submit(io_request& r) override;

private:
    pattern_target& _target;
    completion_sink& _sink;
};

class pattern_target final : public target {
public:
    explicit pattern_target(const block_limits& limits) : _limits(limits) {}

    const block_limits& limits() const override { return _limits; }
    result<std::unique_ptr<target_queue>> open_queue(unsigned index, completion_sink& sink) override
    {
        return std::make_unique<pattern_queue>(*this, sink);
    }

private:
    block_limits _limits;
};

void pattern_queue::submit(io_request& r)
{
    switch (r.op) {
    case io_op::read:
        fill_pattern(r.offset, r.length, r.buffer);
        _sink.complete(r, static_cast<int>(r.length));
        return;
    case io_op::flush:
        // Nothing is ever written: nothing to make durable.
        _sink.complete(r, 0);
        return;
    case io_op::report_extents:
        // Every block is data (the default map): nothing reads as a hole.
        _sink.complete(r, answer_report_extents(_target, r));
        return;
    default:
        // The core refuses what would change a read-only device (EPERM,
        // bio_check_ro) and zone operations on an unzoned one before they
        // get here: nothing else is an operation of this device.
        _sink.complete(r, -EOPNOTSUPP);
        return;
    }
}

result<std::unique_ptr<target>> create_pattern(const option_set& o)
{
    const uint64_t bs = o.u64("blocksize");
    if ((bs & (bs - 1)) != 0) {
        return make_error(EINVAL, fmt::format("blocksize={}: the block size must be 512, 1024, "
                                              "2048 or 4096",
                                              bs));
    }
    auto size = parse_size(o.text("size"));
    if (!size) {
        return make_error(size.error().code.value(),
                          fmt::format("size={}: {}", o.text("size"), size.error().message));
    }
    if (*size < bs) {
        return make_error(EINVAL, fmt::format("size={}: smaller than one block; give at least "
                                              "blocksize={} bytes",
                                              o.text("size"), bs));
    }
    if (*size % bs != 0) {
        return make_error(EINVAL, fmt::format("size={}: {} bytes is not a whole number of blocks "
                                              "of {} bytes; give a multiple of blocksize",
                                              o.text("size"), *size, bs));
    }
    block_limits lim;
    lim.capacity_bytes = *size;
    lim.logical_block_size = static_cast<uint32_t>(bs);
    lim.physical_block_size = static_cast<uint32_t>(bs);
    lim.max_transfer_bytes = k_max_transfer;
    lim.read_only = true;
    return std::make_unique<pattern_target>(lim);
}

[[maybe_unused]] const bool k_registered = register_target_type(target_type{
    .name = "pattern",
    .description = "read-only; each 8-byte word holds its own byte offset, big-endian (nbdkit's "
                   "pattern plugin): every read can be checked",
    .options = k_pattern_options,
    .create = create_pattern,
});

}  // namespace

}  // namespace softblk::targets
