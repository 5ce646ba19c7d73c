// The vhost-user-blk back end against a hostile or broken front end (a raw
// front end of this test, built on the virtio library's driver ring and
// the driver's vhost-user client): malformed messages end that connection
// and nothing else; malformed chains (loops, buffers outside the shared
// memory, short headers, no status byte) fail that request and the ring
// goes on; a driver that breaks the ring itself (heads out of range or
// twice in flight) loses its connection; memory that does not fit its
// file is refused; a second front end waits for the first; chains the
// inflight region says were in flight are resubmitted oldest first; and
// the export's socket is taken and removed safely.
#include "virtio_test_util.hpp"

#include <chrono>
#include <fcntl.h>
#include <fstream>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <thread>
#include <unistd.h>

#include <linux/virtio_config.h>

#include <softblk/virtio/blk.hpp>
#include <softblk/virtio/inflight.hpp>
#include <softblk/virtio/split_ring.hpp>
#include <softblk/virtio/vhost_user.hpp>

#include "vhost_user_client.hpp"

using namespace softblk;
using namespace softblk::test;
namespace vu = softblk::virtio::vhost_user;

namespace {

constexpr uint64_t bit(unsigned n)
{
    return uint64_t{1} << n;
}

// One ring of 8 on 1 MiB of shared memory; requests are built by hand.
struct raw_front_end {
    static constexpr uint32_t k_num = 8;
    static constexpr size_t k_bytes = 1 << 20;
    static constexpr size_t k_buffers = 64 << 10;  // buffers from here on

    explicit raw_front_end(const std::string& socket, bool start = true)
    {
        auto c = virtio_driver::vhost_user_client::connect(socket, 30000);
        EXPECT_TRUE(c) << (c ? "" : c.error().message);
        if (!c) {
            return;
        }
        client = std::move(*c);
        memfd = ::memfd_create("raw-front-end", MFD_CLOEXEC);
        EXPECT_EQ(::ftruncate(memfd, k_bytes), 0);
        mem = static_cast<uint8_t*>(
            ::mmap(nullptr, k_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0));
        ring.init(mem, k_num, true);
        kick = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        call = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        EXPECT_TRUE(client.set_u64(vu::k_set_protocol_features,
                                   bit(vu::k_pf_reply_ack) | bit(vu::k_pf_inflight_shmfd)));
        client.set_reply_ack(true);
        EXPECT_TRUE(client.set_owner());
        EXPECT_TRUE(client.set_u64(vu::k_set_features, bit(VIRTIO_F_VERSION_1) |
                                                           bit(VIRTIO_RING_F_EVENT_IDX) |
                                                           bit(VIRTIO_RING_F_INDIRECT_DESC) |
                                                           bit(vu::k_f_protocol_features)));
        EXPECT_TRUE(
            client.set_mem_table({vu::region_desc{addr(mem), k_bytes, addr(mem), 0}}, {memfd}));
        if (start) {
            start_ring();
        }
    }
    ~raw_front_end()
    {
        if (mem != nullptr) {
            ::munmap(mem, k_bytes);
        }
        for (int fd : {memfd, kick, call}) {
            if (fd >= 0) {
                ::close(fd);
            }
        }
    }
    void start_ring(uint16_t base = 0)
    {
        vhost_vring_addr a{};
        a.index = 0;
        a.desc_user_addr = addr(ring.desc_addr());
        a.avail_user_addr = addr(ring.avail_addr());
        a.used_user_addr = addr(ring.used_addr());
        EXPECT_TRUE(client.set_state(vu::k_set_vring_num, 0, k_num));
        EXPECT_TRUE(client.set_state(vu::k_set_vring_base, 0, base));
        EXPECT_TRUE(client.set_vring_addr(a));
        EXPECT_TRUE(client.set_vring_fd(vu::k_set_vring_call, 0, call));
        EXPECT_TRUE(client.set_vring_fd(vu::k_set_vring_kick, 0, kick));
        EXPECT_TRUE(client.set_state(vu::k_set_vring_enable, 0, 1));
    }
    static uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }
    uint8_t* buffer(size_t off) { return mem + k_buffers + off; }
    void set(uint16_t i, uint64_t a, uint32_t len, uint16_t flags, uint16_t next = 0)
    {
        ring.table()[i] = vring_desc{.addr = a, .len = len, .flags = flags, .next = next};
    }
    // A request: header (type, sector) at buffer(off), `data` bytes
    // (device-writable when `in`), status right after the header area.
    void request(uint16_t head, size_t off, uint32_t type, uint64_t sector, uint32_t data, bool in)
    {
        auto* h = reinterpret_cast<virtio_blk_outhdr*>(buffer(off));
        *h = virtio_blk_outhdr{type, 0, sector};
        *status(off) = 0xff;
        const uint16_t s = static_cast<uint16_t>(head + (data != 0 ? 2 : 1));
        set(head, addr(h), 16, VRING_DESC_F_NEXT, static_cast<uint16_t>(head + 1));
        if (data != 0) {
            set(head + 1, addr(buffer(off + 4096)), data,
                VRING_DESC_F_NEXT | (in ? VRING_DESC_F_WRITE : 0), s);
        }
        set(s, addr(status(off)), 1, VRING_DESC_F_WRITE);
    }
    uint8_t* status(size_t off) { return buffer(off + 64); }
    void go(uint16_t head)
    {
        ring.add(head);
        if (ring.publish()) {
            const uint64_t one = 1;
            [[maybe_unused]] ssize_t n = ::write(kick, &one, sizeof one);
        }
    }
    // The next used entry, waiting up to 5 s; false if none came.
    bool used(uint32_t& id, uint32_t& len)
    {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (std::chrono::steady_clock::now() < until) {
            if (ring.next_used(id, len)) {
                return true;
            }
            ring.enable_interrupts();
            pollfd p{call, POLLIN, 0};
            ::poll(&p, 1, 50);
            uint64_t v;
            [[maybe_unused]] ssize_t n = ::read(call, &v, sizeof v);
        }
        return false;
    }
    // True when the back end closed the connection within `ms`.
    bool dropped(int ms = 5000)
    {
        pollfd p{client.fd(), POLLIN | POLLRDHUP, 0};
        if (::poll(&p, 1, ms) <= 0) {
            return false;
        }
        char c;
        return ::recv(client.fd(), &c, 1, MSG_DONTWAIT) == 0;
    }

    virtio_driver::vhost_user_client client;
    int memfd = -1;
    uint8_t* mem = nullptr;
    virtio::driver_ring ring;
    int kick = -1;
    int call = -1;
};

int connect_raw(const std::string& path)
{
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof a.sun_path - 1);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    return fd;
}

bool closed_by_peer(int fd)
{
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) {
        return false;
    }
    char c[64];
    while (true) {
        const ssize_t n = ::recv(fd, c, sizeof c, MSG_DONTWAIT);
        if (n == 0) {
            return true;
        }
        if (n < 0) {
            return false;
        }
    }
}

// A working front end afterwards: the export survived.
void still_serves(backend& be)
{
    auto v = make_virtio(be.socket, {"poll_queues=0"}, "after");
    ASSERT_TRUE(v);
    std::vector<uint8_t> buf(4096);
    EXPECT_EQ(v->execute(io_op::read, 0, 4096, buf.data()), 4096);
}

}  // namespace

TEST(vhost_user_blk_backend, malformed_messages_end_only_that_connection)
{
    backend be("null", {"memory_backed=1", "size=16", "submit_queues=1", "poll_queues=0"});
    ASSERT_TRUE(be.exp);
    {
        // A payload larger than any request's.
        const int fd = connect_raw(be.socket);
        const vu::header h{vu::k_get_features, vu::k_version, 1u << 16};
        ASSERT_EQ(::send(fd, &h, sizeof h, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof h));
        EXPECT_TRUE(closed_by_peer(fd));
        ::close(fd);
    }
    {
        // A memory table of 9 regions.
        const int fd = connect_raw(be.socket);
        vu::message m;
        m.hdr = {vu::k_set_mem_table, vu::k_version, 8 + 8 * sizeof(vu::region_desc)};
        m.body.table.nregions = 9;
        ASSERT_EQ(vu::send(fd, m), 0);
        EXPECT_TRUE(closed_by_peer(fd));
        ::close(fd);
    }
    {
        // A kick without its descriptor, then garbage cut short.
        const int fd = connect_raw(be.socket);
        vu::message m;
        m.hdr = {vu::k_set_vring_kick, vu::k_version, 8};
        m.body.u64 = 0;
        ASSERT_EQ(vu::send(fd, m), 0);
        EXPECT_TRUE(closed_by_peer(fd));
        ::close(fd);
    }
    {
        // An unknown request with need_reply gets "failed" and the
        // connection stays; a SET_VRING_NUM that is not a power of two too.
        auto c = virtio_driver::vhost_user_client::connect(be.socket, 30000);
        ASSERT_TRUE(c);
        ASSERT_TRUE(c->set_u64(vu::k_set_protocol_features, bit(vu::k_pf_reply_ack)));
        c->set_reply_ack(true);
        EXPECT_FALSE(c->set_u64(vu::k_set_status, 1)) << "not offered: answered as failed";
        EXPECT_FALSE(c->set_state(vu::k_set_vring_num, 0, 6));
        EXPECT_TRUE(c->get_u64(vu::k_get_features)) << "the connection still works";
        EXPECT_FALSE(c->set_u64(vu::k_set_features, bit(63))) << "a feature never offered";
    }
    still_serves(be);
}

TEST(vhost_user_blk_backend, malformed_chains_fail_that_request)
{
    backend be("null", {"memory_backed=1", "size=16", "submit_queues=1", "poll_queues=0"});
    ASSERT_TRUE(be.exp);
    raw_front_end fe(be.socket);
    ASSERT_TRUE(fe.mem);
    uint32_t id, len;

    // 0 -> 1 -> 0: a loop.
    fe.set(0, raw_front_end::addr(fe.buffer(0)), 16, VRING_DESC_F_NEXT, 1);
    fe.set(1, raw_front_end::addr(fe.buffer(0)), 16, VRING_DESC_F_NEXT, 0);
    fe.go(0);
    ASSERT_TRUE(fe.used(id, len));
    EXPECT_EQ(id, 0u);
    EXPECT_EQ(len, 0u);
    EXPECT_EQ(be.stat("bad_requests"), 1u);

    // A data buffer outside the shared memory.
    fe.request(0, 0, VIRTIO_BLK_T_IN, 0, 4096, true);
    fe.ring.table()[1].addr = 0x1000;
    fe.go(0);
    ASSERT_TRUE(fe.used(id, len));
    EXPECT_EQ(len, 0u);
    EXPECT_EQ(*fe.status(0), 0xff) << "nothing written for an invalid chain";
    EXPECT_EQ(be.stat("bad_requests"), 2u);

    // A buffer that starts inside and runs past the end.
    fe.request(0, 0, VIRTIO_BLK_T_IN, 0, 4096, true);
    fe.ring.table()[1].addr = raw_front_end::addr(fe.mem) + raw_front_end::k_bytes - 100;
    fe.go(0);
    ASSERT_TRUE(fe.used(id, len));
    EXPECT_EQ(len, 0u);
    EXPECT_EQ(be.stat("bad_requests"), 3u);

    // A header of 8 bytes: the status says IOERR.
    fe.request(0, 0, VIRTIO_BLK_T_IN, 0, 0, true);
    fe.ring.table()[0].len = 8;
    fe.go(0);
    ASSERT_TRUE(fe.used(id, len));
    EXPECT_EQ(*fe.status(0), VIRTIO_BLK_S_IOERR);
    EXPECT_EQ(be.stat("bad_requests"), 4u);

    // No writable byte for the status.
    fe.set(0, raw_front_end::addr(fe.buffer(0)), 16, 0);
    fe.go(0);
    ASSERT_TRUE(fe.used(id, len));
    EXPECT_EQ(len, 0u);
    EXPECT_EQ(be.stat("bad_requests"), 5u);

    // An indirect table that points at itself.
    auto* table = reinterpret_cast<vring_desc*>(fe.buffer(8192));
    table[0] = vring_desc{
        .addr = raw_front_end::addr(table), .len = 32, .flags = VRING_DESC_F_INDIRECT, .next = 0};
    fe.set(0, raw_front_end::addr(table), 32, VRING_DESC_F_INDIRECT);
    fe.go(0);
    ASSERT_TRUE(fe.used(id, len));
    EXPECT_EQ(len, 0u);
    EXPECT_EQ(be.stat("bad_requests"), 6u);

    // Unknown request type: UNSUPP.
    fe.request(0, 0, 77, 0, 0, true);
    fe.go(0);
    ASSERT_TRUE(fe.used(id, len));
    EXPECT_EQ(*fe.status(0), VIRTIO_BLK_S_UNSUPP);

    // The ring goes on: GET_ID answers the device name, a read reads.
    fe.request(0, 0, VIRTIO_BLK_T_GET_ID, 0, 20, true);
    fe.go(0);
    ASSERT_TRUE(fe.used(id, len));
    EXPECT_EQ(*fe.status(0), VIRTIO_BLK_S_OK);
    EXPECT_EQ(std::string(reinterpret_cast<char*>(fe.buffer(4096))), "vback");
    fe.request(3, 512, VIRTIO_BLK_T_OUT, 8, 4096, false);
    std::memset(fe.buffer(512 + 4096), 0x3c, 4096);
    fe.go(3);
    ASSERT_TRUE(fe.used(id, len));
    EXPECT_EQ(id, 3u);
    EXPECT_EQ(*fe.status(512), VIRTIO_BLK_S_OK);
    std::vector<uint8_t> back(4096);
    ASSERT_EQ(be.dev->execute(io_op::read, 8 * 512, 4096, back.data()), 4096);
    EXPECT_EQ(back[100], 0x3c);
    EXPECT_FALSE(fe.dropped(200));
}

TEST(vhost_user_blk_backend, a_driver_that_breaks_the_ring_loses_its_connection)
{
    backend be("null", {"size=16", "submit_queues=1", "poll_queues=0"});
    ASSERT_TRUE(be.exp);
    {
        raw_front_end fe(be.socket);
        ASSERT_TRUE(fe.mem);
        fe.go(200);  // a head beyond the queue size
        EXPECT_TRUE(fe.dropped());
    }
    still_serves(be);
    {
        // Slow completions, and head 0 made available twice.
        backend slow("null",
                     {"size=16", "submit_queues=1", "poll_queues=0", "irqmode=2",
                      "completion_nsec=500000000"},
                     {}, "slow");
        raw_front_end fe(slow.socket);
        ASSERT_TRUE(fe.mem);
        fe.request(0, 0, VIRTIO_BLK_T_IN, 0, 4096, true);
        fe.ring.add(0);
        fe.go(0);
        EXPECT_TRUE(fe.dropped());
        uint32_t id, len;
        EXPECT_TRUE(fe.used(id, len)) << "the first one still completed before the connection went";
    }
}

TEST(vhost_user_blk_backend, memory_that_does_not_fit_its_file_is_refused)
{
    backend be("null", {"size=16", "submit_queues=1", "poll_queues=0"});
    ASSERT_TRUE(be.exp);
    auto c = virtio_driver::vhost_user_client::connect(be.socket, 30000);
    ASSERT_TRUE(c);
    ASSERT_TRUE(c->set_u64(vu::k_set_protocol_features, bit(vu::k_pf_reply_ack)));
    c->set_reply_ack(true);
    const int fd = ::memfd_create("small", MFD_CLOEXEC);
    ASSERT_EQ(::ftruncate(fd, 4096), 0);
    // 1 MiB claimed from a 4 KiB file: mapping it would SIGBUS the back end.
    auto r = c->set_mem_table({vu::region_desc{0x10000, 1 << 20, 0x10000, 0}}, {fd});
    ::close(fd);
    EXPECT_FALSE(r);
    still_serves(be);
}

TEST(vhost_user_blk_backend, a_second_front_end_waits_for_the_first)
{
    backend be("null", {"size=16", "submit_queues=1", "poll_queues=0"});
    ASSERT_TRUE(be.exp);
    auto first = make_virtio(be.socket, {"poll_queues=0"}, "first");
    ASSERT_TRUE(first);
    std::unique_ptr<device> second;
    std::thread t([&] {
        second = make_virtio(be.socket, {"poll_queues=0", "connect_timeout=20000"}, "second");
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_FALSE(second) << "served while the first is attached";
    EXPECT_EQ(be.exp->describe()["connections"], 1);
    first.reset();
    t.join();
    ASSERT_TRUE(second);
    std::vector<uint8_t> buf(4096);
    EXPECT_EQ(second->execute(io_op::read, 0, 4096, buf.data()), 4096);
}

TEST(vhost_user_blk_backend, inflight_chains_are_resubmitted_oldest_first)
{
    backend be("null", {"memory_backed=1", "size=16", "submit_queues=1", "poll_queues=0"});
    ASSERT_TRUE(be.exp);
    raw_front_end fe(be.socket, false);
    ASSERT_TRUE(fe.mem);
    // The region a dead back end left: heads 5 and 2 taken (5 first), not
    // returned; the driver had made both available (avail idx 2).
    const size_t region = virtio::inflight_queue_bytes(raw_front_end::k_num);
    const int ifd = ::memfd_create("inflight", MFD_CLOEXEC);
    ASSERT_EQ(::ftruncate(ifd, static_cast<off_t>(region)), 0);
    auto* base =
        static_cast<uint8_t*>(::mmap(nullptr, region, PROT_READ | PROT_WRITE, MAP_SHARED, ifd, 0));
    auto* head = reinterpret_cast<virtio::inflight_queue_header*>(base);
    auto* desc = reinterpret_cast<virtio::inflight_desc*>(head + 1);
    head->version = 1;
    head->desc_num = raw_front_end::k_num;
    head->used_idx = 0;
    desc[5].inflight = 1;
    desc[5].counter = 10;
    desc[2].inflight = 1;
    desc[2].counter = 11;
    fe.request(5, 0, VIRTIO_BLK_T_GET_ID, 0, 20, true);
    fe.request(2, 512, VIRTIO_BLK_T_GET_ID, 0, 20, true);
    fe.ring.add(5);
    fe.ring.add(2);
    fe.ring.publish();
    vu::message m;
    m.hdr = {vu::k_set_inflight_fd, vu::k_version | vu::k_flag_need_reply,
             sizeof(vu::inflight_info)};
    m.body.inflight = vu::inflight_info{region, 0, 1, raw_front_end::k_num};
    m.fds[0] = ifd;
    m.nfds = 1;
    ASSERT_EQ(vu::send(fe.client.fd(), m), 0);
    vu::message ack;
    ASSERT_EQ(vu::receive(fe.client.fd(), ack), 1);
    EXPECT_EQ(ack.body.u64, 0u);
    ::close(ifd);
    // QEMU restores the base to the used index after a back-end crash.
    fe.start_ring(0);
    uint32_t id, len;
    ASSERT_TRUE(fe.used(id, len));
    EXPECT_EQ(id, 5u) << "the oldest first";
    ASSERT_TRUE(fe.used(id, len));
    EXPECT_EQ(id, 2u);
    EXPECT_EQ(*fe.status(0), VIRTIO_BLK_S_OK);
    EXPECT_EQ(be.stat("resubmitted"), 2u);
    EXPECT_EQ(desc[5].inflight, 0) << "returned chains are no longer in flight";
    EXPECT_EQ(head->used_idx, 2);
    // New chains continue after the recovered ones.
    fe.request(1, 1024, VIRTIO_BLK_T_GET_ID, 0, 20, true);
    fe.go(1);
    ASSERT_TRUE(fe.used(id, len));
    EXPECT_EQ(id, 1u);
    ::munmap(base, region);
}

// The export's socket follows the shared rules (support/unix_socket.hpp):
// mode 0600 whatever the umask, mode= and group= applied, a regular file,
// a symbolic link or a live socket refused and left as they were, a stale
// socket replaced, and stop() removing only the socket it bound.
TEST(vhost_user_blk_backend, the_socket_is_taken_safely)
{
    temp_dir dir;
    const std::vector<std::string> options = {"size=16", "submit_queues=1", "poll_queues=0"};
    auto d = device::create("vsock", "null", options);
    ASSERT_TRUE(d) << d.error().message;
    const export_type* t = find_export_type("vhost-user-blk");
    ASSERT_NE(t, nullptr);
    auto start = [&](const std::string& path, std::vector<std::string> more = {}) {
        more.push_back("socket=" + path);
        return start_export(*t, **d, export_context{dir.path, false}, more);
    };
    auto mode_of = [](const std::string& path) {
        struct stat st {};
        return ::lstat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0u;
    };

    const std::string a = dir.path + "/a.sock";
    const mode_t old_umask = ::umask(0);
    auto e = start(a);
    ::umask(old_umask);
    ASSERT_TRUE(e) << e.error().message;
    EXPECT_EQ(mode_of(a), 0600u) << "under umask 000";
    // A second export on the same, live socket is refused; the first stays.
    auto twice = start(a);
    ASSERT_FALSE(twice);
    EXPECT_NE(twice.error().message.find("listens"), std::string::npos) << twice.error().message;
    auto front = make_virtio(a, {"poll_queues=0"});
    EXPECT_TRUE(front) << "the first export still serves its socket";
    front.reset();
    // stop() leaves a file that replaced the socket meanwhile.
    ASSERT_EQ(::unlink(a.c_str()), 0);
    {
        std::ofstream(a) << "not ours";
    }
    ASSERT_TRUE((*e)->stop());
    std::string kept;
    std::getline(std::ifstream(a), kept);
    EXPECT_EQ(kept, "not ours");

    // A regular file and a symbolic link are refused and left alone.
    auto on_file = start(a);
    ASSERT_FALSE(on_file);
    EXPECT_NE(on_file.error().message.find("not a socket"), std::string::npos)
        << on_file.error().message;
    std::getline(std::ifstream(a), kept);
    EXPECT_EQ(kept, "not ours");
    const std::string link = dir.path + "/link.sock";
    ASSERT_EQ(::symlink(a.c_str(), link.c_str()), 0);
    auto on_link = start(link);
    ASSERT_FALSE(on_link);
    EXPECT_NE(on_link.error().message.find("symbolic link"), std::string::npos)
        << on_link.error().message;
    struct stat st {};
    EXPECT_EQ(::lstat(link.c_str(), &st), 0);
    EXPECT_TRUE(S_ISLNK(st.st_mode));

    // A stale socket (bound, nobody listening) is replaced; mode= applies;
    // stop() removes the socket it bound.
    const std::string b = dir.path + "/b.sock";
    {
        const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::strncpy(addr.sun_path, b.c_str(), sizeof addr.sun_path - 1);
        ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
        ::close(fd);
    }
    auto stale = start(b, {"mode=0660"});
    ASSERT_TRUE(stale) << stale.error().message;
    EXPECT_EQ(mode_of(b), 0660u);
    ASSERT_TRUE((*stale)->stop());
    EXPECT_NE(::access(b.c_str(), F_OK), 0) << "stop() left its socket";

    // Bad mode= and group= name the option and create nothing.
    for (const char* bad : {"mode=0999", "group=no-such-group-here"}) {
        auto r = start(dir.path + "/c.sock", {bad});
        ASSERT_FALSE(r) << bad;
        const std::string key = std::string(bad).substr(0, std::string(bad).find('=') + 1);
        EXPECT_NE(r.error().message.find(key), std::string::npos) << r.error().message;
        EXPECT_NE(::access((dir.path + "/c.sock").c_str(), F_OK), 0);
    }

    // A relative socket= is refused: the daemon's working directory is not
    // the caller's. (Started from the socket directory, so that a socket
    // made anyway would be found.)
    char cwd[4096];
    ASSERT_NE(::getcwd(cwd, sizeof cwd), nullptr);
    ASSERT_EQ(::chdir(dir.path.c_str()), 0);
    auto relative = start("rel.sock");
    const bool made = ::access("rel.sock", F_OK) == 0;
    ASSERT_EQ(::chdir(cwd), 0);
    ASSERT_FALSE(relative);
    EXPECT_NE(relative.error().message.find("socket=rel.sock: give an absolute path"),
              std::string::npos)
        << relative.error().message;
    EXPECT_FALSE(made) << "a socket was made relative to the working directory";
}

// ADD_MEM_REG maps a region of another file that requests may then use;
// after REM_MEM_REG a request into it is a bad chain (length 0, counted,
// nothing touched); GET_VRING_BASE stops the ring and returns the next
// available index, and the ring takes nothing more.
TEST(vhost_user_blk_backend, regions_come_and_go_and_get_vring_base_stops_the_ring)
{
    backend be("null", {"size=16", "memory_backed=1", "submit_queues=1", "poll_queues=0"});
    ASSERT_TRUE(be.exp);
    raw_front_end fe(be.socket);
    ASSERT_GE(fe.client.fd(), 0);

    constexpr size_t k_extra = 64 << 10;
    const int extra = ::memfd_create("raw-extra", MFD_CLOEXEC);
    ASSERT_EQ(::ftruncate(extra, k_extra), 0);
    auto* xmem = static_cast<uint8_t*>(
        ::mmap(nullptr, k_extra, PROT_READ | PROT_WRITE, MAP_SHARED, extra, 0));
    ASSERT_NE(xmem, MAP_FAILED);
    const uint64_t xguest = uint64_t{1} << 40;  // far from the first region
    auto region_request = [&](uint32_t request) -> uint64_t {
        vu::message m;
        m.hdr = {request, vu::k_version | vu::k_flag_need_reply, sizeof(vu::single_region)};
        m.body.region.region = vu::region_desc{xguest, k_extra, raw_front_end::addr(xmem), 0};
        if (request == vu::k_add_mem_reg) {
            m.fds[0] = extra;
            m.nfds = 1;
        }
        EXPECT_EQ(vu::send(fe.client.fd(), m), 0);
        vu::message reply;
        EXPECT_EQ(vu::receive(fe.client.fd(), reply), 1);
        EXPECT_EQ(reply.hdr.request, request);
        return reply.body.u64;  // 0: done
    };
    // A 4 KiB write whose data lies in the extra region.
    auto write_from_extra = [&] {
        auto* h = reinterpret_cast<virtio_blk_outhdr*>(fe.buffer(0));
        *h = virtio_blk_outhdr{VIRTIO_BLK_T_OUT, 0, 8};
        *fe.status(0) = 0xff;
        fe.set(0, raw_front_end::addr(h), 16, VRING_DESC_F_NEXT, 1);
        fe.set(1, xguest, 4096, VRING_DESC_F_NEXT, 2);
        fe.set(2, raw_front_end::addr(fe.status(0)), 1, VRING_DESC_F_WRITE);
        fe.go(0);
    };

    ASSERT_EQ(region_request(vu::k_add_mem_reg), 0u);
    std::memset(xmem, 0x6b, 4096);
    write_from_extra();
    uint32_t id = 0;
    uint32_t len = 0;
    ASSERT_TRUE(fe.used(id, len));
    EXPECT_EQ(id, 0u);
    EXPECT_EQ(*fe.status(0), VIRTIO_BLK_S_OK);
    // Read back into the first region: the extra region's bytes arrived.
    fe.request(3, 8192, VIRTIO_BLK_T_IN, 8, 4096, true);
    fe.go(3);
    ASSERT_TRUE(fe.used(id, len));
    EXPECT_EQ(id, 3u);
    EXPECT_EQ(*fe.status(8192), VIRTIO_BLK_S_OK);
    EXPECT_EQ(fe.buffer(8192 + 4096)[0], 0x6b);
    EXPECT_EQ(fe.buffer(8192 + 4096)[4095], 0x6b);

    ASSERT_EQ(region_request(vu::k_rem_mem_reg), 0u);
    EXPECT_NE(region_request(vu::k_rem_mem_reg), 0u) << "removed twice";
    const uint64_t bad_before = be.stat("bad_requests");
    write_from_extra();
    ASSERT_TRUE(fe.used(id, len));
    EXPECT_EQ(id, 0u);
    EXPECT_EQ(len, 0u);
    EXPECT_EQ(*fe.status(0), 0xff) << "a chain into a removed region was served";
    EXPECT_EQ(be.stat("bad_requests"), bad_before + 1);

    auto base = fe.client.get_vring_base(0);
    ASSERT_TRUE(base) << base.error().message;
    EXPECT_EQ(*base, 3u) << "three chains taken";
    fe.request(6, 16384, VIRTIO_BLK_T_FLUSH, 0, 0, false);
    fe.go(6);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_FALSE(fe.ring.next_used(id, len)) << "a stopped ring took a chain";
    EXPECT_EQ(*fe.status(16384), 0xff);

    ::munmap(xmem, k_extra);
    ::close(extra);
}
