// A ublk queue with UBLK_F_BATCH_IO: the kernel keeps no daemon task per
// tag; the queue hands it every tag once (PREP_IO_CMDS), receives requests
// as lists of tags from one multishot FETCH_IO_CMDS into provided buffers,
// and returns results in lists (COMMIT_IO_CMDS) gathered while it handles
// a batch of completions and sent before it waits. A commit may come from
// any context, which lets a zero-copy write carry its own commit linked
// after it (prep_linked_commit): the io-wq worker that wrote the data then
// completes the request, without a wake-up of the queue's thread.
#include "queue_runner.hpp"

#include <cerrno>
#include <cstring>
#include <fmt/core.h>
#include <sys/mman.h>
#include <unistd.h>
#include <utility>

namespace softblk::ublk {

namespace {

// The provided buffers FETCH_IO_CMDS writes tag lists into, a tag list of
// the queue's depth each: the kernel takes one per completion and the
// thread gives it back once it has read it.
constexpr unsigned k_fetch_buffers = 4;
constexpr uint16_t k_fetch_group = 0;

}  // namespace

void queue_runner::prep_batch_cmd(io_uring_sqe& sqe, uint8_t nr, const void* elems, unsigned count,
                                  uint64_t data) const
{
    std::memset(&sqe, 0, sizeof(sqe));
    sqe.opcode = IORING_OP_URING_CMD;
    set_target(&sqe);
    sqe.cmd_op = io_op_code(nr, true);
    const batch_cmd cmd{.q_id = static_cast<uint16_t>(_cfg.q_id),
                        .flags = _batch_flags,
                        .nr_elem = static_cast<uint16_t>(count),
                        .elem_bytes = _elem_bytes,
                        .reserved = 0,
                        .reserved2 = 0};
    std::memcpy(sqe.cmd, &cmd, sizeof(cmd));
    sqe.addr = reinterpret_cast<uint64_t>(elems);
    sqe.len = count * _elem_bytes;
    io_uring_sqe_set_data64(&sqe, data);
}

result<void> queue_runner::setup_batch()
{
    const unsigned depth = _cfg.depth;
    // The file ring writes pages the kernel put in this ring's table only
    // through this ring.
    _cfg.zero_copy = _cfg.zero_copy && _ring_shared;
    _links = _cfg.zero_copy && _shared->links_completions();
    _batch_flags = _cfg.zoned ? k_batch_f_has_zone_lba : 0;
    _elem_bytes = static_cast<uint8_t>(k_batch_elem_header_bytes + (_cfg.zoned ? 8 : 0));
    // (With AUTO_BUF_REG, setup() made the fixed-buffer table: each
    // request's pages go at the index its tag's last PREP or COMMIT element
    // named, the tag's own.)

    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    _fetch_ring_len = (k_fetch_buffers * sizeof(io_uring_buf) + page - 1) / page * page;
    void* ring_mem = ::mmap(nullptr, _fetch_ring_len, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (ring_mem == MAP_FAILED) {
        const int e = errno;
        _fetch_ring_len = 0;
        return make_error(
            e, fmt::format("ublk queue {}: buffer ring: {}", _cfg.q_id, std::strerror(e)));
    }
    _fetch_ring = static_cast<io_uring_buf_ring*>(ring_mem);
    io_uring_buf_ring_init(_fetch_ring);
    io_uring_buf_reg reg{};
    reg.ring_addr = reinterpret_cast<uint64_t>(_fetch_ring);
    reg.ring_entries = k_fetch_buffers;
    reg.bgid = k_fetch_group;
    if (const int r = io_uring_register_buf_ring(&_ring, &reg, 0); r < 0) {
        return make_error(-r, fmt::format("ublk queue {}: registering the buffer ring: {}",
                                          _cfg.q_id, std::strerror(-r)));
    }
    _fetch_bufs = std::make_unique<uint16_t[]>(size_t{k_fetch_buffers} * depth);
    for (unsigned b = 0; b < k_fetch_buffers; ++b) {
        io_uring_buf_ring_add(_fetch_ring, &_fetch_bufs[size_t{b} * depth],
                              depth * sizeof(uint16_t), static_cast<uint16_t>(b),
                              io_uring_buf_ring_mask(k_fetch_buffers), static_cast<int>(b));
    }
    io_uring_buf_ring_advance(_fetch_ring, k_fetch_buffers);

    _linked_elems = std::make_unique<char[]>(size_t{depth} * _elem_bytes);
    auto prep = std::make_unique<char[]>(size_t{depth} * _elem_bytes);
    for (unsigned t = 0; t < depth; ++t) {
        const batch_elem e{.tag = static_cast<uint16_t>(t),
                           .buf_index = static_cast<uint16_t>(t),
                           .result = 0,
                           .zone_lba = 0};
        std::memcpy(&prep[size_t{t} * _elem_bytes], &e, _elem_bytes);
    }
    prep_batch_cmd(*next_sqe(), k_io_prep_io_cmds, prep.get(), depth, batch_data(k_batch_prep, 0));
    // START_DEV waits for every tag to be prepared: see the answer first.
    if (const int r = io_uring_submit_and_wait(&_ring, 1); r < 0) {
        return make_error(-r, fmt::format("ublk queue {}: submitting PREP_IO_CMDS: {}", _cfg.q_id,
                                          std::strerror(-r)));
    }
    io_uring_cqe* cqe = nullptr;
    if (const int r = io_uring_peek_cqe(&_ring, &cqe); r < 0) {
        return make_error(-r, fmt::format("ublk queue {}: no answer to PREP_IO_CMDS", _cfg.q_id));
    }
    const int prepared = cqe->res;
    io_uring_cqe_seen(&_ring, cqe);
    if (prepared < 0) {
        return make_error(-prepared, fmt::format("ublk queue {}: PREP_IO_CMDS: {}", _cfg.q_id,
                                                 std::strerror(-prepared)));
    }

    prep_batch_fetch();
    prep_wake_poll();
    if (const int r = io_uring_submit(&_ring); r < 0) {
        return make_error(-r, fmt::format("ublk queue {}: submitting FETCH_IO_CMDS: {}", _cfg.q_id,
                                          std::strerror(-r)));
    }
    // A fetch the kernel refuses completes at once.
    io_uring_get_events(&_ring);
    while (io_uring_peek_cqe(&_ring, &cqe) == 0) {
        const io_uring_cqe seen = *cqe;
        io_uring_cqe_seen(&_ring, cqe);
        if (seen.user_data == batch_data(k_batch_fetch, 0) && seen.res < 0 &&
            (seen.flags & IORING_CQE_F_MORE) == 0) {
            return make_error(-seen.res, fmt::format("ublk queue {}: FETCH_IO_CMDS: {}", _cfg.q_id,
                                                     std::strerror(-seen.res)));
        }
        handle_cqe(seen);
    }
    return {};
}

void queue_runner::teardown_batch()
{
    // The ring is closed by now, and its buffer ring with it.
    if (_fetch_ring != nullptr) {
        ::munmap(_fetch_ring, _fetch_ring_len);
        _fetch_ring = nullptr;
    }
}

void queue_runner::prep_batch_fetch()
{
    io_uring_sqe* sqe = next_sqe();
    // (elem_bytes is a tag's size here; the buffer comes from the group.)
    prep_batch_cmd(*sqe, k_io_fetch_io_cmds, nullptr, _cfg.depth, batch_data(k_batch_fetch, 0));
    auto* cmd = reinterpret_cast<batch_cmd*>(sqe->cmd);
    cmd->flags = 0;
    cmd->elem_bytes = sizeof(uint16_t);
    sqe->addr = 0;
    sqe->len = 0;
    sqe->uring_cmd_flags = k_uring_cmd_multishot;
    sqe->flags |= IOSQE_BUFFER_SELECT;
    sqe->buf_group = k_fetch_group;
}

void queue_runner::add_batch_commit(uint16_t tag, int result, uint64_t zone_lba)
{
    if (_commit_open >= 0 && _commit_count == _cfg.depth) {
        flush_batch_commits();  // (a tag is committed once a list: cannot happen)
    }
    if (_commit_open < 0) {
        unsigned i = 0;
        while (i < _commit_lists.size() && _commit_lists[i].in_kernel != 0) {
            ++i;
        }
        if (i == _commit_lists.size()) {
            // All lists are with the kernel still: one more (rare, bounded by
            // the lists in flight).
            _commit_lists.push_back(
                {.elems = std::make_unique<char[]>(size_t{_cfg.depth} * _elem_bytes)});
        }
        _commit_open = static_cast<int>(i);
        _commit_count = 0;
    }
    const batch_elem e{.tag = tag, .buf_index = tag, .result = result, .zone_lba = zone_lba};
    std::memcpy(&_commit_lists[_commit_open].elems[size_t{_commit_count} * _elem_bytes], &e,
                _elem_bytes);
    ++_commit_count;
}

void queue_runner::flush_batch_commits()
{
    if (_commit_open < 0) {
        return;
    }
    const auto i = static_cast<unsigned>(std::exchange(_commit_open, -1));
    _commit_lists[i].in_kernel = _commit_count;
    prep_batch_cmd(*next_sqe(), k_io_commit_io_cmds, _commit_lists[i].elems.get(), _commit_count,
                   batch_data(k_batch_commit, i));
}

void queue_runner::prep_linked_commit(io_uring_sqe& sqe, const kernel_buffer& kb)
{
    auto& self = *static_cast<queue_runner*>(kb.owner);
    tag_slot& slot = self._slots[kb.tag];
    slot.linked = true;
    char* elem = &self._linked_elems[size_t{kb.tag} * self._elem_bytes];
    const batch_elem e{.tag = kb.tag,
                       .buf_index = kb.tag,
                       .result = static_cast<int32_t>(slot.length),
                       .zone_lba = 0};
    std::memcpy(elem, &e, self._elem_bytes);
    self.prep_batch_cmd(sqe, k_io_commit_io_cmds, elem, 1, batch_data(k_batch_linked, kb.tag));
    // Its completion says nothing when it worked: on_complete knows then.
    sqe.flags |= IOSQE_CQE_SKIP_SUCCESS;
}

void queue_runner::handle_batch_cqe(const io_uring_cqe& cqe)
{
    const auto kind = static_cast<batch_kind>((cqe.user_data >> 32) & 0xff);
    const auto value = static_cast<uint32_t>(cqe.user_data);
    switch (kind) {
    case k_batch_fetch: {
        if ((cqe.flags & IORING_CQE_F_BUFFER) != 0) {
            const auto b = static_cast<uint16_t>(cqe.flags >> IORING_CQE_BUFFER_SHIFT);
            uint16_t* tags = &_fetch_bufs[size_t{b} * _cfg.depth];
            const unsigned n = cqe.res > 0 ? static_cast<unsigned>(cqe.res) / sizeof(uint16_t) : 0;
            for (unsigned i = 0; i < n; ++i) {
                if (tags[i] < _cfg.depth) {
                    start_request(_slots[tags[i]]);
                } else {
                    _errors.fetch_add(1, std::memory_order_relaxed);
                }
            }
            io_uring_buf_ring_add(_fetch_ring, tags, _cfg.depth * sizeof(uint16_t), b,
                                  io_uring_buf_ring_mask(k_fetch_buffers), 0);
            io_uring_buf_ring_advance(_fetch_ring, 1);
        }
        if ((cqe.flags & IORING_CQE_F_MORE) != 0) {
            return;
        }
        if ((cqe.res >= 0 || cqe.res == -ENOBUFS) &&
            !_exit_requested.load(std::memory_order_acquire)) {
            // Ended by itself (out of buffers, say): the kernel keeps new
            // tags until the next fetch arrives.
            prep_batch_fetch();
            return;
        }
        // The device is stopping (-ENODEV), or the kernel refused the
        // fetch: nothing more arrives, as when every tag was aborted.
        if (cqe.res != -ENODEV && cqe.res != -ECANCELED && cqe.res < 0) {
            _errors.fetch_add(1, std::memory_order_relaxed);
        }
        _aborted_count.fetch_add(_cfg.depth - _aborted, std::memory_order_relaxed);
        _aborted = _cfg.depth;
        return;
    }
    case k_batch_commit: {
        // The kernel commits a list in order and stops at the first element
        // it refuses (a negative result: the first): count that one and
        // send the rest again.
        commit_list& list = _commit_lists[value];
        const unsigned size = list.in_kernel;
        const unsigned handled = cqe.res < 0 ? 0 : static_cast<unsigned>(cqe.res) / _elem_bytes;
        if (handled >= size) {
            list.in_kernel = 0;
            return;
        }
        _errors.fetch_add(1, std::memory_order_relaxed);
        const unsigned rest = size - handled - 1;
        list.in_kernel = rest;
        if (rest == 0) {
            return;
        }
        char* elems = list.elems.get();
        std::memmove(elems, elems + size_t{handled + 1} * _elem_bytes, size_t{rest} * _elem_bytes);
        prep_batch_cmd(*next_sqe(), k_io_commit_io_cmds, elems, rest,
                       batch_data(k_batch_commit, value));
        return;
    }
    case k_batch_linked: {
        // Only failures complete (CQE_SKIP_SUCCESS). -ECANCELED: the write
        // before it did not end the request; on_complete commits instead.
        if (cqe.res == -ECANCELED) {
            return;
        }
        // The kernel refused the commit itself: the request is still ours.
        _errors.fetch_add(1, std::memory_order_relaxed);
        tag_slot& slot = _slots[static_cast<uint16_t>(value)];
        if (!std::exchange(slot.linked, false)) {
            // on_complete has been and took it for done.
            add_batch_commit(slot.tag, static_cast<int>(slot.length), 0);
        }
        return;
    }
    case k_batch_prep:
    default:
        return;
    }
}

}  // namespace softblk::ublk
