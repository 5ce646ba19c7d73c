// The NBD server's handshake on a connection: the option haggling
// (codec.hpp's state machine fed from the receive buffer), the TLS
// handshake after STARTTLS, and the way into transmission (the loop's
// queue binding, the connection's ops). See loop.hpp.
#include "loop.hpp"

#include <cerrno>
#include <cstring>

#include <fmt/core.h>

#include <softblk/support/clock.hpp>

namespace softblk::nbd {

bool event_loop::parse_input(connection& c)
{
    if (c.ph == phase::handshake) {
        return parse_handshake(c);
    }
    return parse_requests(c);
}

bool event_loop::parse_handshake(connection& c)
{
    std::vector<uint8_t> plain;
    const handshake_step step =
        c.hs->feed({c.rbuf + c.rstart, c.rend - c.rstart}, c.tls ? plain : c.out_bytes);
    c.rstart += step.consumed;
    if (c.tls && !plain.empty()) {
        // Options after STARTTLS are answered inside the session.
        size_t off = 0;
        while (off < plain.size()) {
            const ssize_t w = gnutls_record_send(c.session, plain.data() + off, plain.size() - off);
            if (w == GNUTLS_E_AGAIN || w == GNUTLS_E_INTERRUPTED) {
                continue;
            }
            if (w < 0) {
                begin_close(c);
                return false;
            }
            off += static_cast<size_t>(w);
        }
    }
    switch (step.action) {
    case handshake_action::need_more:
        mark_dirty(c);
        return true;
    case handshake_action::close:
        mark_dirty(c);
        begin_close(c, true);
        return false;
    case handshake_action::start_tls: {
        const tls_credentials* creds = _srv.tls();
        c.pipe.in.resize(k_tls_in_buffer);
        // The client may already have sent its first TLS bytes.
        const size_t early = c.rend - c.rstart;
        if (early > c.pipe.in.size()) {
            begin_close(c);
            return false;
        }
        std::memcpy(c.pipe.in.data(), c.rbuf + c.rstart, early);
        c.pipe.in_start = 0;
        c.pipe.in_end = early;
        c.rstart = c.rend = 0;
        // The ACK goes out in clear before anything the session writes.
        c.session = creds != nullptr ? creds->new_session(c.pipe) : nullptr;
        if (c.session == nullptr) {
            begin_close(c);
            return false;
        }
        c.tls = true;
        c.ph = phase::tls_handshake;
        mark_dirty(c);
        return true;
    }
    case handshake_action::transmission:
        c.neg = c.hs->result();
        c.hs.reset();
        c.exp = const_cast<server_export*>(static_cast<const server_export*>(c.neg.exp.get()));
        c.exp->connections.fetch_add(1);
        c.counted = true;
        if (c.exp->removed.load()) {
            begin_close(c);
            return false;
        }
        c.ph = phase::transmission;
        c.last_progress_ns = monotonic_ns();
        if (_idle_timeout_ns != 0) {
            post_timer();  // for the idle timeout (also while it waits to be handed off)
        }
        mark_dirty(c);
        {
            // Loop i drives queue i; a device with fewer queues than loops
            // is served by its first loops only.
            const unsigned queues = c.exp->dev->info().queues.submit_queues;
            const unsigned serving = std::min(queues, _srv.loop_count());
            unsigned target = _index;
            if (_index >= serving) {
                static std::atomic<unsigned> spread{0};
                target = spread.fetch_add(1) % serving;
            } else if (serving > 1) {
                static std::atomic<unsigned> spread{0};
                target = spread.fetch_add(1) % serving;
            }
            if (target != _index) {
                c.handoff = true;
                c.handoff_to = target;
                return false;
            }
        }
        enter_transmission(c);
        return !c.closing;
    }
    return false;
}

void event_loop::run_tls_handshake(connection& c)
{
    const int rc = gnutls_handshake(c.session);
    mark_dirty(c);  // whatever it wrote goes out
    if (rc == GNUTLS_E_SUCCESS) {
        if (std::string why = _srv.tls()->check_peer(c.session); !why.empty()) {
            log_client(c, fmt::format("refused after the TLS handshake: {}", why));
            gnutls_alert_send(c.session, GNUTLS_AL_FATAL, GNUTLS_A_BAD_CERTIFICATE);
            begin_close(c, true);
            return;
        }
        c.hs->tls_established();
        c.ph = phase::handshake;
        return;
    }
    if (rc == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED || gnutls_error_is_fatal(rc) == 0) {
        return;
    }
    // Tell the client why (an alert), then hang up once that is sent.
    log_client(c, fmt::format("TLS handshake failed: {}",
                              tls_credentials::describe_failure(c.session, rc)));
    gnutls_alert_send_appropriate(c.session, rc);
    begin_close(c, true);
}

void event_loop::enter_transmission(connection& c)
{
    c.binding = bind(*c.exp);
    if (c.binding == nullptr) {
        begin_close(c);
        return;
    }
    c.ops.resize(k_max_ops);
    c.free_ops.reserve(k_max_ops);
    for (unsigned i = k_max_ops; i > 0; --i) {
        c.ops[i - 1].conn = &c;
        c.free_ops.push_back(&c.ops[i - 1]);
    }
    c.last_progress_ns = monotonic_ns();
    if (_idle_timeout_ns != 0) {
        post_timer();
    }
    mark_dirty(c);
    pump_input(c);
}

}  // namespace softblk::nbd
