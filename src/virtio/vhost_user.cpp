#include <softblk/virtio/vhost_user.hpp>

#include <softblk/virtio/split_ring.hpp>

#include <cerrno>
#include <cstring>
#include <sys/socket.h>
#include <unistd.h>

namespace softblk::virtio::vhost_user {

namespace {

bool region_ok(const region_desc& r)
{
    return r.size != 0 && r.guest_addr + r.size > r.guest_addr &&
           r.user_addr + r.size > r.user_addr && r.mmap_offset + r.size > r.mmap_offset;
}

// What a request needs: payload size (exact), and descriptors.
enum class fds_rule : uint8_t { none, one, vring_flag, table, optional_one };

}  // namespace

const char* request_name(uint32_t request)
{
    switch (request) {
    case k_get_features:
        return "GET_FEATURES";
    case k_set_features:
        return "SET_FEATURES";
    case k_set_owner:
        return "SET_OWNER";
    case k_reset_owner:
        return "RESET_OWNER";
    case k_set_mem_table:
        return "SET_MEM_TABLE";
    case k_set_log_base:
        return "SET_LOG_BASE";
    case k_set_log_fd:
        return "SET_LOG_FD";
    case k_set_vring_num:
        return "SET_VRING_NUM";
    case k_set_vring_addr:
        return "SET_VRING_ADDR";
    case k_set_vring_base:
        return "SET_VRING_BASE";
    case k_get_vring_base:
        return "GET_VRING_BASE";
    case k_set_vring_kick:
        return "SET_VRING_KICK";
    case k_set_vring_call:
        return "SET_VRING_CALL";
    case k_set_vring_err:
        return "SET_VRING_ERR";
    case k_get_protocol_features:
        return "GET_PROTOCOL_FEATURES";
    case k_set_protocol_features:
        return "SET_PROTOCOL_FEATURES";
    case k_get_queue_num:
        return "GET_QUEUE_NUM";
    case k_set_vring_enable:
        return "SET_VRING_ENABLE";
    case k_set_backend_req_fd:
        return "SET_BACKEND_REQ_FD";
    case k_iotlb_msg:
        return "IOTLB_MSG";
    case k_set_vring_endian:
        return "SET_VRING_ENDIAN";
    case k_get_config:
        return "GET_CONFIG";
    case k_set_config:
        return "SET_CONFIG";
    case k_get_inflight_fd:
        return "GET_INFLIGHT_FD";
    case k_set_inflight_fd:
        return "SET_INFLIGHT_FD";
    case k_reset_device:
        return "RESET_DEVICE";
    case k_vring_kick:
        return "VRING_KICK";
    case k_get_max_mem_slots:
        return "GET_MAX_MEM_SLOTS";
    case k_add_mem_reg:
        return "ADD_MEM_REG";
    case k_rem_mem_reg:
        return "REM_MEM_REG";
    case k_set_status:
        return "SET_STATUS";
    case k_get_status:
        return "GET_STATUS";
    default:
        return "unknown";
    }
}

void close_fds(message& m)
{
    for (unsigned i = 0; i < k_max_fds; ++i) {
        if (m.fds[i] >= 0) {
            ::close(m.fds[i]);
            m.fds[i] = -1;
        }
    }
    m.nfds = 0;
}

const char* check_request(const message& m, uint32_t max_queues)
{
    const header& h = m.hdr;
    if ((h.flags & k_version_mask) != k_version) {
        return "protocol version is not 1";
    }
    if ((h.flags & k_flag_reply) != 0) {
        return "reply flag set on a request";
    }
    if (h.size > sizeof(payload)) {
        return "payload larger than any request's";
    }
    if (m.nfds > k_max_fds) {
        return "too many descriptors";
    }
    const payload& b = m.body;
    fds_rule fds = fds_rule::none;
    switch (h.request) {
    case k_get_features:
    case k_get_protocol_features:
    case k_set_owner:
    case k_reset_owner:
    case k_get_queue_num:
    case k_get_max_mem_slots:
    case k_reset_device:
    case k_get_status:
        if (h.size != 0) {
            return "request takes no payload";
        }
        break;
    case k_set_features:
    case k_set_protocol_features:
    case k_set_status:
        if (h.size != sizeof(uint64_t)) {
            return "payload is not one u64";
        }
        break;
    case k_set_vring_num:
    case k_set_vring_base:
    case k_get_vring_base:
    case k_set_vring_enable:
    case k_set_vring_endian:
    case k_vring_kick:
        if (h.size != sizeof(vhost_vring_state)) {
            return "payload is not a vring state";
        }
        if (b.state.index >= max_queues) {
            return "vring index beyond the queues";
        }
        break;
    case k_set_vring_addr:
        if (h.size != sizeof(vhost_vring_addr)) {
            return "payload is not a vring address";
        }
        if (b.addr.index >= max_queues) {
            return "vring index beyond the queues";
        }
        break;
    case k_set_vring_kick:
    case k_set_vring_call:
    case k_set_vring_err:
        if (h.size != sizeof(uint64_t)) {
            return "payload is not one u64";
        }
        if ((b.u64 & ~(k_vring_index_mask | k_vring_nofd)) != 0) {
            return "unknown bits in the vring descriptor payload";
        }
        if ((b.u64 & k_vring_index_mask) >= max_queues) {
            return "vring index beyond the queues";
        }
        fds = fds_rule::vring_flag;
        break;
    case k_set_mem_table: {
        if (h.size < 8) {
            return "memory table too short";
        }
        const uint32_t n = b.table.nregions;
        if (n == 0 || n > k_max_table_regions) {
            return "memory table with 0 or more than 8 regions";
        }
        if (h.size < 8 + n * sizeof(region_desc)) {
            return "memory table shorter than its regions";
        }
        for (uint32_t i = 0; i < n; ++i) {
            if (!region_ok(b.table.regions[i])) {
                return "memory region empty or wrapping around";
            }
        }
        fds = fds_rule::table;
        break;
    }
    case k_add_mem_reg:
    case k_rem_mem_reg:
        if (h.size != sizeof(single_region)) {
            return "payload is not a single memory region";
        }
        if (!region_ok(b.region.region)) {
            return "memory region empty or wrapping around";
        }
        fds = h.request == k_add_mem_reg ? fds_rule::one : fds_rule::optional_one;
        break;
    case k_get_config:
    case k_set_config:
        if (h.size < k_config_header_bytes) {
            return "config access too short";
        }
        if (b.config.size > k_max_config || h.size != k_config_header_bytes + b.config.size) {
            return "config access size wrong or beyond 256 bytes";
        }
        if (b.config.offset > k_max_config || b.config.size > k_max_config - b.config.offset) {
            return "config access beyond 256 bytes";
        }
        break;
    case k_get_inflight_fd:
    case k_set_inflight_fd:
        if (h.size < k_inflight_min_bytes || h.size > sizeof(inflight_info)) {
            return "payload is not an inflight description";
        }
        if (b.inflight.num_queues == 0 || b.inflight.num_queues > max_queues) {
            return "inflight queue count 0 or beyond the queues";
        }
        if (b.inflight.queue_size == 0 || b.inflight.queue_size > k_max_queue_size) {
            return "inflight queue size 0 or beyond 1024";
        }
        if (h.request == k_set_inflight_fd) {
            if (b.inflight.mmap_size == 0 ||
                b.inflight.mmap_offset + b.inflight.mmap_size < b.inflight.mmap_offset) {
                return "inflight region empty or wrapping around";
            }
            fds = fds_rule::one;
        }
        break;
    case k_set_backend_req_fd:
        fds = fds_rule::one;
        break;
    case k_set_log_base:
    case k_set_log_fd:
    case k_gpu_set_socket:
        // Not offered; the back end answers them as unsupported and closes
        // what they carry.
        fds = fds_rule::optional_one;
        break;
    default:
        break;
    }
    switch (fds) {
    case fds_rule::none:
        if (m.nfds != 0) {
            return "descriptors on a request that takes none";
        }
        break;
    case fds_rule::one:
        if (m.nfds != 1) {
            return "request needs exactly one descriptor";
        }
        break;
    case fds_rule::optional_one:
        if (m.nfds > 1) {
            return "more than one descriptor";
        }
        break;
    case fds_rule::vring_flag:
        if ((b.u64 & k_vring_nofd) != 0 ? m.nfds != 0 : m.nfds != 1) {
            return "descriptor count does not match the no-descriptor flag";
        }
        break;
    case fds_rule::table:
        if (m.nfds != b.table.nregions) {
            return "not one descriptor per memory region";
        }
        break;
    }
    return nullptr;
}

const char* check_reply(const message& m, uint32_t request, uint32_t size)
{
    if ((m.hdr.flags & k_version_mask) != k_version) {
        return "protocol version is not 1";
    }
    if ((m.hdr.flags & k_flag_reply) == 0) {
        return "reply flag missing";
    }
    if (m.hdr.request != request) {
        return "reply to another request";
    }
    if (size != 0 && m.hdr.size != size) {
        return "reply payload of the wrong size";
    }
    return nullptr;
}

namespace {

// Reads exactly `len` bytes. Returns 1, 0 at end of stream before the
// first byte, -EPROTO at end of stream after it, or -errno.
int read_full(int fd, void* buf, size_t len, size_t already)
{
    auto* p = static_cast<uint8_t*>(buf);
    size_t done = already;
    while (done < len) {
        const ssize_t n = ::recv(fd, p + done, len - done, 0);
        if (n > 0) {
            done += static_cast<size_t>(n);
            continue;
        }
        if (n == 0) {
            return done == 0 ? 0 : -EPROTO;
        }
        if (errno == EINTR) {
            continue;
        }
        return -errno;
    }
    return 1;
}

}  // namespace

int receive(int fd, message& m)
{
    m.nfds = 0;
    for (int& f : m.fds) {
        f = -1;
    }
    iovec iov{&m.hdr, sizeof m.hdr};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * k_max_fds)];
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    ssize_t n;
    do {
        n = ::recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        return -errno;
    }
    if (n == 0) {
        return 0;
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
            continue;
        }
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
            int received;
            std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (m.nfds < k_max_fds) {
                m.fds[m.nfds++] = received;
            } else {
                ::close(received);
            }
        }
    }
    if ((mh.msg_flags & MSG_CTRUNC) != 0) {
        close_fds(m);
        return -EMSGSIZE;
    }
    int rc = read_full(fd, &m.hdr, sizeof m.hdr, static_cast<size_t>(n));
    if (rc <= 0) {
        close_fds(m);
        return rc == 0 ? -EPROTO : rc;
    }
    if (m.hdr.size > sizeof(payload)) {
        close_fds(m);
        return -EPROTO;
    }
    if (m.hdr.size > 0) {
        rc = read_full(fd, &m.body, m.hdr.size, 0);
        if (rc <= 0) {
            close_fds(m);
            return rc == 0 ? -EPROTO : rc;
        }
    }
    return 1;
}

int send(int fd, const message& m)
{
    if (m.hdr.size > sizeof(payload) || m.nfds > k_max_fds) {
        return -EINVAL;
    }
    iovec iov[2] = {{const_cast<header*>(&m.hdr), sizeof m.hdr},
                    {const_cast<payload*>(&m.body), m.hdr.size}};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * k_max_fds)];
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = m.hdr.size > 0 ? 2 : 1;
    if (m.nfds > 0) {
        std::memset(control, 0, sizeof control);
        mh.msg_control = control;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * m.nfds);
        cmsghdr* c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * m.nfds);
        std::memcpy(CMSG_DATA(c), m.fds, sizeof(int) * m.nfds);
    }
    size_t total = sizeof m.hdr + m.hdr.size;
    size_t done = 0;
    while (done < total) {
        ssize_t n = ::sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -errno;
        }
        done += static_cast<size_t>(n);
        if (done == total) {
            break;
        }
        // A short send: the rest goes without the descriptors.
        mh.msg_control = nullptr;
        mh.msg_controllen = 0;
        size_t skip = static_cast<size_t>(n);
        while (skip > 0 && mh.msg_iovlen > 0) {
            if (skip >= mh.msg_iov[0].iov_len) {
                skip -= mh.msg_iov[0].iov_len;
                ++mh.msg_iov;
                --mh.msg_iovlen;
            } else {
                mh.msg_iov[0].iov_base = static_cast<uint8_t*>(mh.msg_iov[0].iov_base) + skip;
                mh.msg_iov[0].iov_len -= skip;
                skip = 0;
            }
        }
    }
    return 0;
}

}  // namespace softblk::virtio::vhost_user
