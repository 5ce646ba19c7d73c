// The NBD server's input: receives on a connection's socket (into its
// receive buffer, straight into a write's buffer, or into the TLS
// session's), the poll for a peer gone while input is blocked, and moving
// what arrived to the parser (handshake.cpp, request.cpp). See loop.hpp.
#include "loop.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <poll.h>

namespace softblk::nbd {

void event_loop::post_recv(connection& c)
{
    if (c.recv_posted || c.read_eof || c.closing) {
        return;
    }
    void* dst;
    size_t len;
    if (c.tls) {
        if (c.pipe.in_end == c.pipe.in.size()) {
            return;  // the session has not consumed what it has
        }
        dst = c.pipe.in.data() + c.pipe.in_end;
        len = c.pipe.in.size() - c.pipe.in_end;
        c.recv_direct = false;
    } else if (c.payload_left >= k_direct_recv && !c.payload_discard && c.rstart == c.rend) {
        dst = c.payload_op->buf + c.payload_pos;
        len = c.payload_left;
        c.recv_direct = true;
    } else {
        // Receives start at the buffer's start whenever what is left is
        // at most a partial header (28 bytes to move), so that they keep
        // to the same cache lines.
        if (c.rstart == c.rend) {
            c.rstart = c.rend = 0;
        } else if (c.rstart > 0 && (c.rend - c.rstart < k_request_size ||
                                    k_recv_buffer - c.rend < k_request_size * 4)) {
            std::memmove(c.rbuf, c.rbuf + c.rstart, c.rend - c.rstart);
            c.rend -= c.rstart;
            c.rstart = 0;
        }
        if (c.rend == k_recv_buffer) {
            return;  // full of unparsed bytes: parsing is blocked
        }
        dst = c.rbuf + c.rend;
        // Next to its client (colocate) the loop runs while the client
        // sleeps, so what the socket holds is the whole batch: a receive
        // takes all of it, for every part left to a later receive is a
        // switch to the client and back after its replies (fio at QD 32:
        // 0.03 switches per request instead of 0.11-0.13, 2.3 us of CPU per
        // request instead of 3.0-3.3). Apart, the client keeps sending
        // while the loop parses, and k_recv_chunk keeps to the L1 cache.
        len = k_recv_buffer - c.rend;
        if (_place->cpu() < 0) {
            len = std::min(len, std::max(k_recv_chunk, size_t{4} * c.request_bytes));
        }
        c.recv_direct = false;
    }
    io_uring_sqe* s = sqe();
    io_uring_prep_recv(s, c.fd, dst, len, 0);
    io_uring_sqe_set_data(s, make_user_data(&c, k_token_recv));
    c.recv_posted = true;
}

// While a connection's input is blocked (it takes no more requests until
// its replies go out) no recv would see its peer go: a poll does. It stays
// armed until the peer hangs up or the connection closes.
void event_loop::post_hup_poll(connection& c)
{
    if (c.hup_posted || c.closing) {
        return;
    }
    io_uring_sqe* s = sqe();
    io_uring_prep_poll_add(s, c.fd, POLLHUP | POLLERR);
    io_uring_sqe_set_data(s, make_user_data(&c, k_token_hup));
    c.hup_posted = true;
}

void event_loop::on_hup(connection& c, int res)
{
    c.hup_posted = false;
    if (!c.closing && res > 0 && (res & (POLLHUP | POLLERR)) != 0) {
        // Nobody will read the replies, nor send more: end it now rather
        // than at the idle timeout.
        c.read_eof = true;
        begin_close(c);
    }
    maybe_free(c);
}

void event_loop::on_recv(connection& c, int res)
{
    c.recv_posted = false;
    if (res <= 0) {
        if (res == -EINTR || res == -EAGAIN) {
            post_recv(c);
            return;
        }
        c.read_eof = true;
        begin_close(c);
        maybe_free(c);
        return;
    }
    const auto n = static_cast<size_t>(res);
    ++c.progress;
    if (c.tls) {
        c.pipe.in_end += n;
    } else if (c.recv_direct) {
        c.recv_direct = false;
        c.payload_pos += static_cast<uint32_t>(n);
        c.payload_left -= n;
    } else {
        c.rend += n;
    }
    pump_input(c);
    maybe_free(c);
}

// Moves plain text from the socket (or the TLS session) into the parser
// until it needs more bytes than are there or is blocked.
void event_loop::pump_input(connection& c)
{
    for (;;) {
        if (c.closing || c.close_after_send) {
            return;
        }
        if (c.ph == phase::tls_handshake) {
            run_tls_handshake(c);
            if (c.closing || c.close_after_send) {
                return;
            }
            if (c.ph == phase::tls_handshake) {
                post_recv(c);
                return;
            }
            continue;
        }
        if (!parse_input(c)) {
            return;  // blocked, handed off or closing
        }
        if (c.ph == phase::tls_handshake) {
            continue;  // STARTTLS: the session takes over the input
        }
        if (!c.tls) {
            if (!coalesce_receive(c)) {
                post_recv(c);
            }
            return;
        }
        // TLS: decrypt into the same place a plain recv would target.
        uint8_t* dst;
        size_t len;
        bool direct = false;
        if (c.payload_left >= k_direct_recv && !c.payload_discard && c.rstart == c.rend) {
            dst = c.payload_op->buf + c.payload_pos;
            len = c.payload_left;
            direct = true;
        } else {
            if (c.rstart == c.rend) {
                c.rstart = c.rend = 0;
            } else if (c.rstart > 0) {
                std::memmove(c.rbuf, c.rbuf + c.rstart, c.rend - c.rstart);
                c.rend -= c.rstart;
                c.rstart = 0;
            }
            if (c.rend == k_recv_buffer) {
                return;
            }
            dst = c.rbuf + c.rend;
            len = k_recv_buffer - c.rend;
        }
        const ssize_t n = gnutls_record_recv(c.session, dst, len);
        if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED) {
            post_recv(c);
            return;
        }
        if (n <= 0) {
            c.read_eof = true;
            begin_close(c);
            return;
        }
        if (!c.pipe.out.empty()) {
            mark_dirty(c);  // the session had something to say (key update)
        }
        if (direct) {
            c.payload_pos += static_cast<uint32_t>(n);
            c.payload_left -= static_cast<uint64_t>(n);
        } else {
            c.rend += static_cast<size_t>(n);
        }
    }
}

}  // namespace softblk::nbd
