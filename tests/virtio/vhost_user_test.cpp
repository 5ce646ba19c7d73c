// vhost-user messages (src/virtio/vhost_user.cpp): every request is
// checked against the protocol before a back end acts on it (sizes,
// descriptor counts, indices, regions), and messages with descriptors
// cross a socket whole; truncated, oversized and descriptor-flooded
// messages are refused without leaking descriptors.
#include <softblk/virtio/vhost_user.hpp>

#include <gtest/gtest.h>

#include <cstring>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

using namespace softblk::virtio::vhost_user;

namespace {

message make_request(uint32_t type, uint32_t size)
{
    message m;
    m.hdr.request = type;
    m.hdr.flags = k_version;
    m.hdr.size = size;
    return m;
}

int open_fds()
{
    int n = 0;
    for (int fd = 0; fd < 1024; ++fd) {
        if (::fcntl(fd, F_GETFD) >= 0) {
            ++n;
        }
    }
    return n;
}

}  // namespace

TEST(vhost_user_check, sizes_and_versions)
{
    EXPECT_EQ(check_request(make_request(k_get_features, 0), 2), nullptr);
    EXPECT_NE(check_request(make_request(k_get_features, 8), 2), nullptr);
    message m = make_request(k_get_features, 0);
    m.hdr.flags = 2;
    EXPECT_NE(check_request(m, 2), nullptr) << "version 2";
    m.hdr.flags = k_version | k_flag_reply;
    EXPECT_NE(check_request(m, 2), nullptr) << "a reply from the front end";
    EXPECT_NE(check_request(make_request(k_set_features, 4), 2), nullptr);
    EXPECT_EQ(check_request(make_request(k_set_features, 8), 2), nullptr);
    EXPECT_NE(check_request(make_request(12345, 4096), 2), nullptr) << "larger than any payload";
    EXPECT_EQ(check_request(make_request(12345, 16), 2), nullptr)
        << "unknown: answered as unsupported";
}

TEST(vhost_user_check, vring_indices)
{
    message m = make_request(k_set_vring_num, sizeof(vhost_vring_state));
    m.body.state = {1, 128};
    EXPECT_EQ(check_request(m, 2), nullptr);
    m.body.state.index = 2;
    EXPECT_NE(check_request(m, 2), nullptr);
    m = make_request(k_set_vring_addr, sizeof(vhost_vring_addr));
    m.body.addr.index = 7;
    EXPECT_NE(check_request(m, 2), nullptr);
}

TEST(vhost_user_check, kick_and_call_descriptors)
{
    message m = make_request(k_set_vring_kick, 8);
    m.body.u64 = 1;
    EXPECT_NE(check_request(m, 2), nullptr) << "no descriptor and no flag";
    m.nfds = 1;
    EXPECT_EQ(check_request(m, 2), nullptr);
    m.body.u64 = 1 | k_vring_nofd;
    EXPECT_NE(check_request(m, 2), nullptr) << "descriptor and the no-descriptor flag";
    m.nfds = 0;
    EXPECT_EQ(check_request(m, 2), nullptr);
    m.body.u64 = 1 | (1u << 9);
    EXPECT_NE(check_request(m, 2), nullptr) << "unknown bits";
    m.body.u64 = 5;
    m.nfds = 1;
    EXPECT_NE(check_request(m, 2), nullptr) << "vring 5 of 2";
}

TEST(vhost_user_check, memory_tables)
{
    message m = make_request(k_set_mem_table, 8 + 2 * sizeof(region_desc));
    m.body.table.nregions = 2;
    m.body.table.regions[0] = {0, 1 << 20, 0x7f0000000000, 0};
    m.body.table.regions[1] = {1 << 20, 1 << 20, 0x7f0000100000, 0};
    m.nfds = 2;
    EXPECT_EQ(check_request(m, 1), nullptr);
    m.nfds = 1;
    EXPECT_NE(check_request(m, 1), nullptr) << "one descriptor for two regions";
    m.nfds = 2;
    m.hdr.size = 8 + sizeof(region_desc);
    EXPECT_NE(check_request(m, 1), nullptr) << "shorter than its regions";
    m.hdr.size = 8 + 2 * sizeof(region_desc);
    m.body.table.regions[1].size = 0;
    EXPECT_NE(check_request(m, 1), nullptr) << "empty region";
    m.body.table.regions[1] = {~uint64_t{0} - 10, 1 << 20, 0x7f0000100000, 0};
    EXPECT_NE(check_request(m, 1), nullptr) << "wraps around";
    m.body.table.nregions = 9;
    EXPECT_NE(check_request(m, 1), nullptr) << "9 regions";

    message add = make_request(k_add_mem_reg, sizeof(single_region));
    add.body.region.region = {0, 4096, 0x1000, 0};
    EXPECT_NE(check_request(add, 1), nullptr) << "ADD_MEM_REG without its descriptor";
    add.nfds = 1;
    EXPECT_EQ(check_request(add, 1), nullptr);
    message rem = make_request(k_rem_mem_reg, sizeof(single_region));
    rem.body.region.region = {0, 4096, 0x1000, 0};
    EXPECT_EQ(check_request(rem, 1), nullptr);
    rem.nfds = 1;
    EXPECT_EQ(check_request(rem, 1), nullptr) << "tolerated (and closed) as the spec says";
}

TEST(vhost_user_check, config_and_inflight)
{
    message m = make_request(k_get_config, k_config_header_bytes + 60);
    m.body.config = {0, 60, 0, {}};
    EXPECT_EQ(check_request(m, 1), nullptr);
    m.body.config.size = 61;
    EXPECT_NE(check_request(m, 1), nullptr) << "size field and payload disagree";
    m.body.config = {250, 60, 0, {}};
    EXPECT_NE(check_request(m, 1), nullptr) << "beyond 256 bytes";

    message g = make_request(k_get_inflight_fd, sizeof(inflight_info));
    g.body.inflight = {0, 0, 2, 128};
    EXPECT_EQ(check_request(g, 2), nullptr);
    g.body.inflight.num_queues = 3;
    EXPECT_NE(check_request(g, 2), nullptr);
    g.body.inflight = {0, 0, 2, 4096};
    EXPECT_NE(check_request(g, 2), nullptr);
    message s = make_request(k_set_inflight_fd, sizeof(inflight_info));
    s.body.inflight = {8192, 0, 2, 128};
    EXPECT_NE(check_request(s, 2), nullptr) << "no descriptor";
    s.nfds = 1;
    EXPECT_EQ(check_request(s, 2), nullptr);
}

TEST(vhost_user_socket, messages_with_descriptors_cross_whole)
{
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    const int before = open_fds();
    message m = make_request(k_set_mem_table, 8 + 2 * sizeof(region_desc));
    m.body.table.nregions = 2;
    m.body.table.regions[0] = {0, 4096, 0x1000, 0};
    m.body.table.regions[1] = {4096, 4096, 0x2000, 0};
    m.fds[0] = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    m.fds[1] = ::open("/dev/zero", O_RDONLY | O_CLOEXEC);
    m.nfds = 2;
    ASSERT_EQ(send(sv[0], m), 0);
    message r;
    ASSERT_EQ(receive(sv[1], r), 1);
    EXPECT_EQ(r.hdr.request, k_set_mem_table);
    EXPECT_EQ(r.nfds, 2u);
    EXPECT_EQ(r.body.table.regions[1].user_addr, 0x2000u);
    EXPECT_EQ(check_request(r, 1), nullptr);
    char c;
    EXPECT_EQ(::read(r.fds[1], &c, 1), 1) << "the second descriptor is /dev/zero";
    close_fds(r);
    close_fds(m);
    EXPECT_EQ(open_fds(), before);

    ::close(sv[0]);
    EXPECT_EQ(receive(sv[1], r), 0) << "end of stream between messages";
    ::close(sv[1]);
}

TEST(vhost_user_socket, truncated_and_oversized_messages)
{
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    const header h{k_set_features, k_version, 8};
    ASSERT_EQ(::write(sv[0], &h, sizeof h), static_cast<ssize_t>(sizeof h));
    ASSERT_EQ(::write(sv[0], "abc", 3), 3);
    ::shutdown(sv[0], SHUT_WR);
    message r;
    EXPECT_EQ(receive(sv[1], r), -EPROTO) << "payload cut short";
    ::close(sv[0]);
    ::close(sv[1]);

    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    const header big{k_set_features, k_version, 1u << 20};
    ASSERT_EQ(::write(sv[0], &big, sizeof big), static_cast<ssize_t>(sizeof big));
    EXPECT_EQ(receive(sv[1], r), -EPROTO) << "a megabyte of payload";
    ::close(sv[0]);
    ::close(sv[1]);

    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    ASSERT_EQ(::write(sv[0], &h, 5), 5);
    ::shutdown(sv[0], SHUT_WR);
    EXPECT_EQ(receive(sv[1], r), -EPROTO) << "header cut short";
    ::close(sv[0]);
    ::close(sv[1]);
}

TEST(vhost_user_socket, too_many_descriptors_are_closed)
{
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    const int before = open_fds();
    // 12 descriptors in one message: more than any request carries.
    int fds[12];
    for (int& f : fds) {
        f = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    header h{k_set_owner, k_version, 0};
    iovec iov{&h, sizeof h};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof fds)];
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = control;
    mh.msg_controllen = sizeof control;
    cmsghdr* cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof fds);
    std::memcpy(CMSG_DATA(cm), fds, sizeof fds);
    ASSERT_EQ(::sendmsg(sv[0], &mh, 0), static_cast<ssize_t>(sizeof h));
    for (int f : fds) {
        ::close(f);
    }
    message r;
    EXPECT_EQ(receive(sv[1], r), -EMSGSIZE);
    EXPECT_EQ(r.nfds, 0u);
    EXPECT_EQ(open_fds(), before);
    ::close(sv[0]);
    ::close(sv[1]);
}
