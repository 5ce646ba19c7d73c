// A vhost-user-blk back end of the tests' own that misbehaves on purpose,
// for the driver's (target "virtio") time-outs: one virtqueue (no event
// index), a RAM disk of 16 MiB whose byte i is i % 251, REPLY_ACK, config
// space with a 4 KiB block size. It serves one connection at a time on a
// thread of its own; what it does wrong is chosen per connection
// (`plan(n)`, n = 1 for the first):
//   silent          reads messages and never answers;
//   reply_delay_ms  answers every message that late;
//   hold_reads      takes read requests and never completes them;
//   before_request  runs (on the serving thread) before it serves the
//                   connection's n-th request (n = 1 for the first).
// When a connection ends, its memory stays mapped here, and
// complete_held_late() returns its held reads at any later time as a back
// end that wakes up late would: it fills their buffers with a byte and
// marks them done in that connection's used ring.
#pragma once

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <poll.h>
#include <string>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <linux/virtio_config.h>

#include <softblk/virtio/blk.hpp>
#include <softblk/virtio/split_ring.hpp>
#include <softblk/virtio/vhost_user.hpp>

namespace softblk::test {

struct fake_behaviour {
    bool silent = false;
    uint32_t reply_delay_ms = 0;
    bool hold_reads = false;
    std::function<void(unsigned)> before_request;
};

class fake_backend {
public:
    static constexpr uint64_t k_capacity = 16 << 20;

    fake_backend(std::string socket, std::function<fake_behaviour(unsigned)> plan)
        : _socket(std::move(socket)), _plan(std::move(plan)), _disk(k_capacity)
    {
        for (size_t i = 0; i < _disk.size(); ++i) {
            _disk[i] = static_cast<uint8_t>(i % 251);
        }
        _listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        std::strncpy(a.sun_path, _socket.c_str(), sizeof a.sun_path - 1);
        ::unlink(_socket.c_str());
        if (::bind(_listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
            ::listen(_listener, 4) != 0) {
            ::close(_listener);
            _listener = -1;
            return;
        }
        _stop = ::eventfd(0, EFD_CLOEXEC);
        _thread = std::thread([this] { serve(); });
    }
    ~fake_backend() { stop(); }

    // Ends the serving thread and every connection (the driver sees its
    // back end go).
    void stop()
    {
        if (_thread.joinable()) {
            const uint64_t one = 1;
            [[maybe_unused]] ssize_t n = ::write(_stop, &one, sizeof one);
            _thread.join();
        }
        if (_listener >= 0) {
            ::close(_listener);
            _listener = -1;
            ::unlink(_socket.c_str());
        }
        if (_stop >= 0) {
            ::close(_stop);
            _stop = -1;
        }
        std::lock_guard lock(_mutex);
        _retired.clear();
    }

    bool ok() const { return _listener >= 0; }
    unsigned connections() const { return _connections.load(); }
    unsigned held() const { return _held.load(); }
    const uint8_t* disk() const { return _disk.data(); }

    // Returns the held reads of connections that ended, each buffer filled
    // with `byte`, status OK, in their own used ring; signals their call
    // eventfd. Returns how many.
    unsigned complete_held_late(uint8_t byte)
    {
        std::lock_guard lock(_mutex);
        unsigned n = 0;
        for (auto& c : _retired) {
            for (const held_read& h : c->held) {
                std::memset(h.data, byte, h.len);
                *h.status = VIRTIO_BLK_S_OK;
                c->ring.push_used(h.head, h.len + 1);
                ++n;
            }
            c->held.clear();
            c->ring.publish_used();
            if (c->call >= 0) {
                const uint64_t one = 1;
                [[maybe_unused]] ssize_t w = ::write(c->call, &one, sizeof one);
            }
        }
        return n;
    }

private:
    struct held_read {
        uint16_t head;
        uint8_t* data;
        uint32_t len;
        uint8_t* status;
    };
    struct session {
        ~session()
        {
            for (auto& [p, n] : maps) {
                ::munmap(p, n);
            }
            for (int fd : {sock, kick, call}) {
                if (fd >= 0) {
                    ::close(fd);
                }
            }
        }
        int sock = -1;
        int kick = -1;
        int call = -1;
        fake_behaviour how;
        unsigned requests = 0;
        virtio::guest_memory mem;
        std::vector<std::pair<void*, size_t>> maps;
        virtio::device_ring ring;
        uint32_t num = 0;
        vhost_vring_addr addr{};
        std::vector<held_read> held;
    };

    void serve()
    {
        for (;;) {
            pollfd p[2] = {{_listener, POLLIN, 0}, {_stop, POLLIN, 0}};
            if (::poll(p, 2, -1) < 0) {
                continue;
            }
            if ((p[1].revents & POLLIN) != 0) {
                return;
            }
            const int fd = ::accept4(_listener, nullptr, nullptr, SOCK_CLOEXEC);
            if (fd < 0) {
                continue;
            }
            auto s = std::make_unique<session>();
            s->sock = fd;
            s->how = _plan(++_connections);
            if (!run(*s)) {
                return;  // stopped
            }
            ::close(s->sock);
            s->sock = -1;
            std::lock_guard lock(_mutex);
            _retired.push_back(std::move(s));
        }
    }

    // Serves `s` until its front end goes (true) or the test stops (false).
    bool run(session& s)
    {
        for (;;) {
            pollfd p[3] = {{s.sock, POLLIN, 0}, {_stop, POLLIN, 0}, {s.kick, POLLIN, 0}};
            ::poll(p, s.kick >= 0 ? 3 : 2, 1);
            if ((p[1].revents & POLLIN) != 0) {
                return false;
            }
            if ((p[0].revents & (POLLIN | POLLHUP)) != 0) {
                virtio::vhost_user::message m;
                if (virtio::vhost_user::receive(s.sock, m) <= 0) {
                    return true;
                }
                handle(s, m);
            }
            if (s.ring.attached() && !s.how.silent) {
                serve_ring(s);
            }
        }
    }

    void reply(session& s, virtio::vhost_user::message& m, uint32_t size)
    {
        if (s.how.silent) {
            return;
        }
        if (s.how.reply_delay_ms != 0) {
            pollfd p{_stop, POLLIN, 0};
            ::poll(&p, 1, static_cast<int>(s.how.reply_delay_ms));
        }
        m.hdr.flags = virtio::vhost_user::k_version | virtio::vhost_user::k_flag_reply;
        m.hdr.size = size;
        m.nfds = 0;
        virtio::vhost_user::send(s.sock, m);
    }

    void handle(session& s, virtio::vhost_user::message& m)
    {
        namespace vu = virtio::vhost_user;
        const bool ack = (m.hdr.flags & vu::k_flag_need_reply) != 0;
        switch (m.hdr.request) {
        case vu::k_get_features:
            m.body.u64 = vu::feature_bit(VIRTIO_F_VERSION_1) |
                         vu::feature_bit(vu::k_f_protocol_features) |
                         vu::feature_bit(VIRTIO_BLK_F_BLK_SIZE);
            reply(s, m, 8);
            return;
        case vu::k_get_protocol_features:
            m.body.u64 = vu::feature_bit(vu::k_pf_mq) | vu::feature_bit(vu::k_pf_reply_ack) |
                         vu::feature_bit(vu::k_pf_config);
            reply(s, m, 8);
            return;
        case vu::k_get_queue_num:
            m.body.u64 = 1;
            reply(s, m, 8);
            return;
        case vu::k_get_config: {
            const uint32_t size = m.body.config.size;
            virtio::blk_config c;
            std::memset(&c, 0, sizeof c);
            c.base.capacity = k_capacity / 512;
            c.base.blk_size = 4096;
            std::memset(m.body.config.payload, 0, sizeof m.body.config.payload);
            std::memcpy(m.body.config.payload, &c, std::min<size_t>(size, sizeof c));
            reply(s, m, vu::k_config_header_bytes + size);
            return;
        }
        case vu::k_set_mem_table:
            for (uint32_t i = 0; i < m.body.table.nregions && i < m.nfds; ++i) {
                const vu::region_desc& r = m.body.table.regions[i];
                void* p = ::mmap(nullptr, r.size + r.mmap_offset, PROT_READ | PROT_WRITE,
                                 MAP_SHARED, m.fds[i], 0);
                if (p != MAP_FAILED) {
                    s.maps.emplace_back(p, r.size + r.mmap_offset);
                    s.mem.add(virtio::memory_region{r.guest_addr, r.user_addr, r.size,
                                                    static_cast<uint8_t*>(p) + r.mmap_offset});
                }
            }
            break;
        case vu::k_set_vring_num:
            s.num = m.body.state.num;
            break;
        case vu::k_set_vring_addr:
            s.addr = m.body.addr;
            break;
        case vu::k_set_vring_kick:
            std::swap(s.kick, m.fds[0]);
            break;
        case vu::k_set_vring_call:
            std::swap(s.call, m.fds[0]);
            break;
        case vu::k_set_vring_enable:
            s.ring.attach(s.mem, s.addr.desc_user_addr, s.addr.avail_user_addr,
                          s.addr.used_user_addr, s.num, false, false);
            s.ring.set_last_avail(0);
            break;
        default:
            break;
        }
        vu::close_fds(m);
        if (ack) {
            m.body.u64 = 0;
            reply(s, m, 8);
        }
    }

    void serve_ring(session& s)
    {
        if (s.kick >= 0) {
            uint64_t v;
            [[maybe_unused]] ssize_t n = ::read(s.kick, &v, sizeof v);  // (non-blocking)
        }
        uint16_t head;
        bool any = false;
        while (s.ring.pop(head) == 1) {
            if (s.how.before_request) {
                s.how.before_request(++s.requests);
            }
            virtio::segment storage[8];
            virtio::chain c{.storage = storage};
            if (s.ring.walk(s.mem, head, c) != virtio::chain_error::none || c.readable == 0 ||
                c.count == c.readable || storage[0].len < sizeof(virtio_blk_outhdr)) {
                s.ring.push_used(head, 0);
                any = true;
                continue;
            }
            virtio_blk_outhdr h;
            std::memcpy(&h, storage[0].ptr, sizeof h);
            const virtio::segment& last = storage[c.count - 1];
            uint8_t* status = last.ptr + last.len - 1;
            const uint64_t at = h.sector * 512;
            uint32_t written = 1;
            uint8_t result = VIRTIO_BLK_S_OK;
            if (h.type == VIRTIO_BLK_T_IN && c.count - c.readable == 2 &&
                at + storage[c.readable].len <= k_capacity) {
                if (s.how.hold_reads) {
                    s.held.push_back(
                        {head, storage[c.readable].ptr, storage[c.readable].len, status});
                    ++_held;
                    continue;
                }
                std::memcpy(storage[c.readable].ptr, _disk.data() + at, storage[c.readable].len);
                written += storage[c.readable].len;
            } else if (h.type == VIRTIO_BLK_T_OUT && c.readable == 2 &&
                       at + storage[1].len <= k_capacity) {
                std::memcpy(_disk.data() + at, storage[1].ptr, storage[1].len);
            } else if (h.type != VIRTIO_BLK_T_FLUSH) {
                result = VIRTIO_BLK_S_UNSUPP;
            }
            *status = result;
            s.ring.push_used(head, written);
            any = true;
        }
        if (any && s.ring.publish_used() && s.call >= 0) {
            const uint64_t one = 1;
            [[maybe_unused]] ssize_t n = ::write(s.call, &one, sizeof one);
        }
    }

    std::string _socket;
    std::function<fake_behaviour(unsigned)> _plan;
    std::vector<uint8_t> _disk;  // the serving thread's
    int _listener = -1;
    int _stop = -1;
    std::thread _thread;
    std::atomic<unsigned> _connections{0};
    std::atomic<unsigned> _held{0};
    std::mutex _mutex;
    std::vector<std::unique_ptr<session>> _retired;
};

}  // namespace softblk::test
