// libFuzzer target: the vhost-user message layer a back end runs on every
// message from a front end. The input is cut into a byte count of
// descriptors, a queue count and a byte stream that goes through a socket
// pair into vhost_user::receive() (framing: short headers, oversized
// payloads, cut-off payloads, several messages), and every message it
// returns goes through check_request(). Invariants: receive() never
// returns more descriptors than k_max_fds, never a payload larger than
// the union, and a message that passes check_request() has the sizes its
// request needs.
#include <softblk/virtio/vhost_user.hpp>

#include <cassert>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace softblk::virtio::vhost_user;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    if (size < 2) {
        return 0;
    }
    const unsigned fds_to_send = data[0] % 10;
    const uint32_t max_queues = 1 + data[1] % 8;
    data += 2;
    size -= 2;
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        return 0;
    }
    // The first chunk carries descriptors, as a front end's sendmsg does.
    const size_t first = size < 12 ? size : 12;
    int fds[10];
    for (unsigned i = 0; i < fds_to_send; ++i) {
        fds[i] = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    iovec iov{const_cast<uint8_t*>(data), first};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof fds)];
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (fds_to_send > 0 && first > 0) {
        mh.msg_control = control;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * fds_to_send);
        cmsghdr* c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * fds_to_send);
        std::memcpy(CMSG_DATA(c), fds, sizeof(int) * fds_to_send);
    }
    if (first > 0) {
        (void)::sendmsg(sv[0], &mh, MSG_NOSIGNAL);
    }
    for (unsigned i = 0; i < fds_to_send; ++i) {
        ::close(fds[i]);
    }
    if (size > first) {
        size_t off = first;
        while (off < size) {
            const ssize_t n = ::send(sv[0], data + off, size - off, MSG_NOSIGNAL);
            if (n <= 0) {
                break;
            }
            off += static_cast<size_t>(n);
        }
    }
    ::shutdown(sv[0], SHUT_WR);
    for (int i = 0; i < 64; ++i) {
        message m;
        const int rc = receive(sv[1], m);
        if (rc <= 0) {
            assert(m.nfds == 0);
            break;
        }
        assert(m.nfds <= k_max_fds);
        assert(m.hdr.size <= sizeof(payload));
        if (check_request(m, max_queues) == nullptr) {
            switch (m.hdr.request) {
            case k_set_mem_table:
                assert(m.body.table.nregions >= 1 && m.body.table.nregions <= k_max_table_regions);
                assert(m.nfds == m.body.table.nregions);
                for (uint32_t r = 0; r < m.body.table.nregions; ++r) {
                    const region_desc& d = m.body.table.regions[r];
                    assert(d.size != 0 && d.guest_addr + d.size > d.guest_addr);
                }
                break;
            case k_set_vring_num:
            case k_set_vring_base:
            case k_get_vring_base:
                assert(m.body.state.index < max_queues);
                break;
            case k_get_config:
            case k_set_config:
                assert(m.body.config.offset + m.body.config.size <= k_max_config);
                break;
            default:
                break;
            }
        }
        close_fds(m);
    }
    ::close(sv[0]);
    ::close(sv[1]);
    return 0;
}
