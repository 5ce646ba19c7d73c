// The NBD server's output: replies and handshake bytes gathered into a
// connection's iovecs (or through its TLS session), sent at once where the
// socket takes them and posted to the ring where it does not, and what a
// send completed frees. See loop.hpp.
#include "loop.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sys/socket.h>

namespace softblk::nbd {

void event_loop::mark_dirty(connection& c)
{
    if (!c.dirty) {
        c.dirty = true;
        c.next_dirty = _dirty;
        _dirty = &c;
    }
}

void event_loop::flush(connection& c)
{
    if (c.send_posted || c.fd < 0) {
        return;
    }
    if (c.closing) {
        return;
    }
    if (c.tls && c.ph == phase::transmission && !c.replies.empty()) {
        // Encrypt every waiting reply into one batch of records.
        gnutls_record_cork(c.session);
        while (nbd_op* o = c.replies.pop()) {
            auto send_all = [&](const uint8_t* p, size_t n) {
                while (n > 0) {
                    const ssize_t w = gnutls_record_send(c.session, p, n);
                    if (w == GNUTLS_E_AGAIN || w == GNUTLS_E_INTERRUPTED) {
                        continue;
                    }
                    if (w < 0) {
                        return false;
                    }
                    p += w;
                    n -= static_cast<size_t>(w);
                }
                return true;
            };
            bool ok = send_all(o->hdr, o->hdr_len);
            if (ok && o->data_len != 0) {
                ok = send_all(o->buf, o->data_len);
            }
            if (ok && !o->extra.empty()) {
                ok = send_all(o->extra.data(), o->extra.size());
            }
            release_op(*o);
            if (!ok) {
                begin_close(c);
                return;
            }
        }
        while (gnutls_record_uncork(c.session, GNUTLS_RECORD_WAIT) == GNUTLS_E_AGAIN) {
        }
    }
    if (c.tls && !c.pipe.out.empty()) {
        c.out_bytes.insert(c.out_bytes.end(), c.pipe.out.begin(), c.pipe.out.end());
        c.pipe.out.clear();
    }
    // Batches of up to k_max_iov iovecs, each sent at once while the socket
    // takes them; the rest of one it does not take goes to the ring.
    while (!c.closing) {
        if (c.iov_first == c.iov_count) {
            fill_iov(c);
        }
        if (c.iov_first == c.iov_count || !send_direct(c)) {
            break;
        }
    }
    if (!c.closing && !c.send_posted && c.close_after_send) {
        begin_close(c);
    }
}

// Takes the next batch into c.iov: pending bytes (handshake replies, TLS
// records) or, in plain transmission, the replies that fit.
void event_loop::fill_iov(connection& c)
{
    c.iov_first = 0;
    c.iov_count = 0;
    if (!c.out_bytes.empty()) {
        c.out_inflight.swap(c.out_bytes);
        c.out_bytes.clear();
        c.iov[0] = {c.out_inflight.data(), c.out_inflight.size()};
        c.iov_op[0] = nullptr;
        c.iov_count = 1;
        return;
    }
    if (c.tls) {
        return;
    }
    unsigned n = 0;
    while (!c.replies.empty() && n + 3 <= k_max_iov) {
        nbd_op* o = c.replies.pop();
        c.iov[n] = {o->hdr, o->hdr_len};
        c.iov_op[n] = nullptr;
        ++n;
        if (o->data_len != 0) {
            c.iov[n] = {o->buf, o->data_len};
            c.iov_op[n] = nullptr;
            ++n;
        }
        if (!o->extra.empty()) {
            c.iov[n] = {o->extra.data(), o->extra.size()};
            c.iov_op[n] = nullptr;
            ++n;
        }
        c.iov_op[n - 1] = o;
    }
    c.iov_count = n;
}

// Sends c.iov[iov_first, iov_count) with one sendmsg that does not wait,
// which for a peer that reads takes all of it: no completion to wait for,
// no timer. True when all of it went out; otherwise the rest is posted to
// the ring (MSG_WAITALL, completed by on_send) or the connection is closing.
bool event_loop::send_direct(connection& c)
{
    msghdr m{};
    m.msg_iov = c.iov + c.iov_first;
    m.msg_iovlen = c.iov_count - c.iov_first;
    const ssize_t n = ::sendmsg(c.fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            post_send(c);  // the socket is full: the ring waits for room
            return false;
        }
        c.read_eof = true;  // nothing more can go out
        begin_close(c);
        return false;
    }
    sent(c, static_cast<size_t>(n));
    if (c.iov_first < c.iov_count) {
        post_send(c);
        return false;
    }
    return !c.closing;
}

void event_loop::post_send(connection& c)
{
    c.msg = {};
    c.msg.msg_iov = c.iov + c.iov_first;
    c.msg.msg_iovlen = c.iov_count - c.iov_first;
    io_uring_sqe* s = sqe();
    // MSG_WAITALL: io_uring completes the send once all of it is out (it
    // waits for room itself), so a completion never leaves a tail to post.
    io_uring_prep_sendmsg(s, c.fd, &c.msg, MSG_NOSIGNAL | MSG_WAITALL);
    io_uring_sqe_set_data(s, make_user_data(&c, k_token_send));
    c.send_posted = true;
}

// `n` bytes of c.iov went out: releases the ops whose replies are all
// sent, and once the batch is done, what waited for it.
void event_loop::sent(connection& c, size_t n)
{
    ++c.progress;
    size_t left = n;
    while (c.iov_first < c.iov_count) {
        iovec& v = c.iov[c.iov_first];
        if (left < v.iov_len) {
            v.iov_base = static_cast<uint8_t*>(v.iov_base) + left;
            v.iov_len -= left;
            break;
        }
        left -= v.iov_len;
        if (c.iov_op[c.iov_first] != nullptr) {
            release_op(*c.iov_op[c.iov_first]);
            c.iov_op[c.iov_first] = nullptr;
        }
        ++c.iov_first;
    }
    if (c.iov_first < c.iov_count) {
        return;
    }
    c.iov_first = c.iov_count = 0;
    c.out_inflight.clear();
    if (c.disc && c.ops_in_device == 0 && c.replies.empty() && c.out_bytes.empty() &&
        c.free_ops.size() == k_max_ops) {
        begin_close(c);
    }
    if (c.input_blocked && !c.closing) {
        // Its replies went out: it may take requests again.
        c.input_blocked = false;
        pump_input(c);
    }
}

void event_loop::on_send(connection& c, int res)
{
    c.send_posted = false;
    if (res < 0) {
        if (res == -EINTR || res == -EAGAIN) {
            post_send(c);
            return;
        }
        c.read_eof = true;  // nothing more can go out
        begin_close(c);
        // Ops of the failed batch are released by maybe_free.
        maybe_free(c);
        return;
    }
    sent(c, static_cast<size_t>(res));
    if (c.iov_first < c.iov_count) {
        post_send(c);
    } else {
        mark_dirty(c);  // what queued meanwhile goes out in the next flush
    }
    maybe_free(c);
}

}  // namespace softblk::nbd
