// A ublk queue thread's zero-copy entries: where the kernel puts a
// request's pages (AUTO_BUF_REG) or the register and unregister entries
// that put them in the queue's ring's table (SUPPORT_ZERO_COPY), which the
// file ring submits around a write (kernel_buffer, external_data.hpp). The
// thread itself is queue_runner.cpp.
#include "queue_runner.hpp"

#include <cstring>

namespace softblk::ublk {

void queue_runner::set_auto_buf_reg(io_uring_sqe& sqe, const tag_slot& slot) const
{
    if (_cfg.auto_buf_reg) {
        // Where the kernel puts the tag's next request's pages: the tag's
        // slot, no flags (without AUTO_BUF_REG_FALLBACK a registration that
        // fails ends the request with an error: nothing of ours to undo).
        sqe.addr = auto_buf_reg_addr(slot.tag);
    }
}

namespace {

void prep_buffer_command(io_uring_sqe& sqe, const kernel_buffer& kb, uint8_t nr)
{
    std::memset(&sqe, 0, sizeof(sqe));
    sqe.opcode = IORING_OP_URING_CMD;
    sqe.fd = kb.fd;
    // Only kernels with ioctl-encoded commands have these.
    sqe.cmd_op = io_op_code(nr, true);
    io_cmd cmd{.q_id = kb.queue, .tag = kb.tag, .result = 0, .addr = kb.index};
    std::memcpy(sqe.cmd, &cmd, sizeof(cmd));
}

}  // namespace

void queue_runner::prep_register_buffer(io_uring_sqe& sqe, const kernel_buffer& kb)
{
    static_cast<queue_runner*>(kb.owner)->_buffer_registers.fetch_add(1, std::memory_order_relaxed);
    prep_buffer_command(sqe, kb, k_io_register_io_buf);
}

void queue_runner::prep_unregister_buffer(io_uring_sqe& sqe, const kernel_buffer& kb)
{
    prep_buffer_command(sqe, kb, k_io_unregister_io_buf);
}

}  // namespace softblk::ublk
