#include "session.hpp"

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/core.h>

#include <linux/virtio_config.h>

#include <softblk/support/fd_guard.hpp>
#include <softblk/virtio/split_ring.hpp>

#include <softblk/virtio/inflight.hpp>

namespace softblk::vhost_user_blk {

namespace vu = virtio::vhost_user;
using vu::feature_bit;

namespace {

// BACKEND_REQ with CONFIG: a resized device tells the front end
// (VHOST_USER_BACKEND_CONFIG_CHANGE_MSG), which re-reads the capacity.
constexpr uint64_t k_offered_protocol =
    feature_bit(vu::k_pf_mq) | feature_bit(vu::k_pf_reply_ack) | feature_bit(vu::k_pf_config) |
    feature_bit(vu::k_pf_backend_req) | feature_bit(vu::k_pf_inflight_shmfd) |
    feature_bit(vu::k_pf_configure_mem_slots);

// Requests whose answer is a reply of their own (REPLY_ACK adds none).
bool has_reply(uint32_t request)
{
    switch (request) {
    case vu::k_get_features:
    case vu::k_get_protocol_features:
    case vu::k_get_vring_base:
    case vu::k_get_queue_num:
    case vu::k_get_config:
    case vu::k_get_inflight_fd:
    case vu::k_get_max_mem_slots:
        return true;
    default:
        return false;
    }
}

void close_fd(int& fd)
{
    if (fd >= 0) {
        ::close(fd);
        fd = -1;
    }
}

}  // namespace

session::session(int conn_fd, device& dev, const export_settings& settings, ring_counters* counters)
    : _fd(conn_fd), _dev(dev), _settings(settings), _counters(counters)
{
    _offered = offered_features(dev.limits(), settings);
    _vrings.resize(settings.num_queues);
    _error_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    _capacity_listener = _dev.add_capacity_listener([this](uint64_t b) { capacity_changed(b); });
}

session::~session()
{
    _dev.remove_capacity_listener(_capacity_listener);
    close_fd(_backend_fd);
    stop_rings();
    for (vring& v : _vrings) {
        close_fd(v.kick);
        close_fd(v.call);
        close_fd(v.err);
    }
    unmap_all();
    if (_inflight != nullptr) {
        ::munmap(_inflight, _inflight_length);
    }
    close_fd(_error_fd);
    close_fd(_fd);
}

void session::log(const std::string& what) const
{
    fmt::print(stderr, "vhost-user-blk {}: {}\n", _settings.serial, what);
}

bool session::handle_message()
{
    vu::message m;
    const int rc = vu::receive(_fd, m);
    if (rc == 0) {
        log("the front end closed the connection");
        return false;
    }
    if (rc < 0) {
        log(fmt::format("receiving a message: {}; closing the connection", std::strerror(-rc)));
        return false;
    }
    if (const char* why = vu::check_request(m, _settings.num_queues)) {
        log(fmt::format("malformed {} ({} bytes, {} descriptors): {}; closing the connection",
                        vu::request_name(m.hdr.request), m.hdr.size, m.nfds, why));
        vu::close_fds(m);
        return false;
    }
    const outcome r = dispatch(m);
    vu::close_fds(m);  // those the handler did not take
    if (r == outcome::close) {
        return false;
    }
    if (r != outcome::replied && (_protocol & feature_bit(vu::k_pf_reply_ack)) != 0 &&
        (m.hdr.flags & vu::k_flag_need_reply) != 0 && !has_reply(m.hdr.request)) {
        const uint64_t status = r == outcome::ok ? 0 : 1;
        if (!reply(m, &status, sizeof status)) {
            return false;
        }
    }
    return true;
}

bool session::reply(const vu::message& request, const void* payload, uint32_t size, int fd)
{
    vu::message r;
    r.hdr.request = request.hdr.request;
    r.hdr.flags = vu::k_version | vu::k_flag_reply;
    r.hdr.size = size;
    std::memcpy(&r.body, payload, size);
    if (fd >= 0) {
        r.fds[0] = fd;
        r.nfds = 1;
    }
    if (const int rc = vu::send(_fd, r); rc < 0) {
        log(fmt::format("replying to {}: {}; closing the connection",
                        vu::request_name(request.hdr.request), std::strerror(-rc)));
        return false;
    }
    return true;
}

session::outcome session::dispatch(vu::message& m)
{
    const vu::payload& b = m.body;
    auto u64_reply = [&](uint64_t v) {
        return reply(m, &v, sizeof v) ? outcome::replied : outcome::close;
    };
    switch (m.hdr.request) {
    case vu::k_get_features:
        return u64_reply(_offered);
    case vu::k_set_features:
        if ((b.u64 & ~_offered) != 0) {
            log(fmt::format("SET_FEATURES {:#x} asks for features never offered ({:#x}); closing",
                            b.u64, b.u64 & ~_offered));
            return outcome::close;
        }
        _features = b.u64;
        return outcome::ok;
    case vu::k_get_protocol_features:
        return u64_reply(k_offered_protocol);
    case vu::k_set_protocol_features:
        if ((b.u64 & ~k_offered_protocol) != 0) {
            log(fmt::format("SET_PROTOCOL_FEATURES {:#x} asks for features never offered; closing",
                            b.u64));
            return outcome::close;
        }
        _protocol = b.u64;
        return outcome::ok;
    case vu::k_set_owner:
        return outcome::ok;
    case vu::k_reset_owner:
        // Deprecated; the spec's advice: stop the rings, keep the state.
        stop_rings();
        return outcome::ok;
    case vu::k_get_queue_num:
        return u64_reply(_settings.num_queues);
    case vu::k_get_max_mem_slots:
        return u64_reply(virtio::guest_memory::k_max_regions);
    case vu::k_set_mem_table:
        return set_mem_table(m);
    case vu::k_add_mem_reg:
        return add_mem_reg(m);
    case vu::k_rem_mem_reg:
        return rem_mem_reg(m);
    case vu::k_set_vring_num: {
        vring& v = _vrings[b.state.index];
        if (v.worker) {
            log(fmt::format("SET_VRING_NUM on running ring {}: refused", b.state.index));
            return outcome::failed;
        }
        if (b.state.num == 0 || b.state.num > virtio::k_max_queue_size ||
            (b.state.num & (b.state.num - 1)) != 0) {
            log(fmt::format("SET_VRING_NUM {} for ring {}: a queue size is a power of two up to {}",
                            b.state.num, b.state.index, virtio::k_max_queue_size));
            return outcome::failed;
        }
        v.num = b.state.num;
        return outcome::ok;
    }
    case vu::k_set_vring_addr: {
        vring& v = _vrings[b.addr.index];
        v.addr = b.addr;
        v.addr_set = true;
        if (v.worker) {
            // The worker keeps its own copy of the addresses: restart it
            // (stop completes what it took first).
            v.base = v.worker->stop();
            v.worker.reset();
            return start_ring(b.addr.index) ? outcome::ok : outcome::failed;
        }
        return outcome::ok;
    }
    case vu::k_set_vring_base: {
        vring& v = _vrings[b.state.index];
        if (v.worker) {
            log(fmt::format("SET_VRING_BASE on running ring {}: refused", b.state.index));
            return outcome::failed;
        }
        v.base = static_cast<uint16_t>(b.state.num);
        return outcome::ok;
    }
    case vu::k_get_vring_base:
        return get_vring_base(m);
    case vu::k_set_vring_kick:
    case vu::k_set_vring_call:
    case vu::k_set_vring_err:
        return set_vring_fd(m);
    case vu::k_set_vring_enable: {
        vring& v = _vrings[b.state.index];
        v.enabled = b.state.num != 0;
        if (v.worker) {
            v.worker->set_enabled(v.enabled);
        }
        return outcome::ok;
    }
    case vu::k_get_config:
        return get_config(m);
    case vu::k_set_backend_req_fd:
        return set_backend_req_fd(m);
    case vu::k_set_config:
        return set_config(m);
    case vu::k_get_inflight_fd:
        return get_inflight_fd(m);
    case vu::k_set_inflight_fd:
        return set_inflight_fd(m);
    default:
        log(fmt::format("{} (request {}) is not supported; answered as failed",
                        vu::request_name(m.hdr.request), m.hdr.request));
        return outcome::failed;
    }
}

// ---------------------------------------------------------------- memory

bool session::map_region(const vu::region_desc& r, int fd)
{
    const fd_guard owned{fd};  // the mapping keeps the memory; the descriptor goes
    struct stat st;
    if (::fstat(fd, &st) != 0) {
        log(fmt::format("memory region at guest address {:#x}: fstat: {}", r.guest_addr,
                        std::strerror(errno)));
        return false;
    }
    // Touching a page beyond the end of the file would kill this process
    // (SIGBUS): the region must lie inside the file.
    if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) < r.mmap_offset + r.size) {
        log(
            fmt::format("memory region at guest address {:#x}: {} bytes at offset {} reach "
                        "beyond its file ({} bytes)",
                        r.guest_addr, r.size, r.mmap_offset, st.st_size));
        return false;
    }
    const int seals = ::fcntl(fd, F_GET_SEALS);
    if ((seals < 0 || (seals & F_SEAL_SHRINK) == 0) && !_warned_unsealed) {
        _warned_unsealed = true;
        log("shared memory is not sealed against shrinking (memfd seal=on): a front end that "
            "truncates it can crash this process");
    }
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t aligned = r.mmap_offset & ~(page - 1);
    const uint64_t delta = r.mmap_offset - aligned;
    const size_t length = static_cast<size_t>(r.size + delta);
    void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd,
                        static_cast<off_t>(aligned));
    const int e = errno;
    if (base == MAP_FAILED) {
        log(fmt::format("memory region at guest address {:#x} ({} bytes): mmap: {}", r.guest_addr,
                        r.size, std::strerror(e)));
        return false;
    }
    const virtio::memory_region region{.guest_addr = r.guest_addr,
                                       .user_addr = r.user_addr,
                                       .size = r.size,
                                       .host = static_cast<uint8_t*>(base) + delta};
    if (!_memory.add(region)) {
        log(
            fmt::format("memory region at guest address {:#x} ({} bytes) overlaps another, or "
                        "more than {} regions",
                        r.guest_addr, r.size, virtio::guest_memory::k_max_regions));
        ::munmap(base, length);
        return false;
    }
    _maps.push_back(mapping{base, length, region});
    return true;
}

void session::unmap_all()
{
    for (const mapping& mp : _maps) {
        ::munmap(mp.base, mp.length);
    }
    _maps.clear();
    _memory.clear();
}

session::outcome session::set_mem_table(vu::message& m)
{
    // Requests in flight point into the old mappings: let them complete.
    pause_rings(true);
    unmap_all();
    bool ok = true;
    for (uint32_t i = 0; i < m.body.table.nregions; ++i) {
        const int fd = m.fds[i];
        m.fds[i] = -1;
        if (ok) {
            ok = map_region(m.body.table.regions[i], fd);
        } else {
            ::close(fd);
        }
    }
    if (!ok) {
        unmap_all();
        log("SET_MEM_TABLE could not be mapped; closing the connection");
        return outcome::close;  // the rings stay parked; the session ends
    }
    resume_rings();
    return outcome::ok;
}

session::outcome session::add_mem_reg(vu::message& m)
{
    // Existing mappings stay: the rings only need to stand still while the
    // table changes.
    pause_rings(false);
    const int fd = m.fds[0];
    m.fds[0] = -1;
    const bool ok = map_region(m.body.region.region, fd);
    resume_rings();
    return ok ? outcome::ok : outcome::failed;
}

session::outcome session::rem_mem_reg(const vu::message& m)
{
    const vu::region_desc& r = m.body.region.region;
    pause_rings(true);
    virtio::memory_region removed;
    const bool found = _memory.remove(r.guest_addr, r.user_addr, r.size, removed);
    if (found) {
        for (auto it = _maps.begin(); it != _maps.end(); ++it) {
            if (it->region.host == removed.host) {
                ::munmap(it->base, it->length);
                _maps.erase(it);
                break;
            }
        }
    } else {
        log(fmt::format("REM_MEM_REG of an unknown region (guest address {:#x}, {} bytes)",
                        r.guest_addr, r.size));
    }
    resume_rings();
    return found ? outcome::ok : outcome::failed;
}

// ---------------------------------------------------------------- rings

bool session::any_ring_running() const
{
    for (const vring& v : _vrings) {
        if (v.worker) {
            return true;
        }
    }
    return false;
}

void session::pause_rings(bool drain)
{
    for (vring& v : _vrings) {
        if (v.worker) {
            v.worker->pause(drain);
        }
    }
}

void session::resume_rings()
{
    for (unsigned i = 0; i < _vrings.size(); ++i) {
        if (_vrings[i].worker) {
            if (const char* err = _vrings[i].worker->reattach()) {
                log(fmt::format("ring {} after the memory table changed: {}; the ring stops", i,
                                err));
            }
            _vrings[i].worker->resume();
        }
    }
}

void session::stop_rings()
{
    for (vring& v : _vrings) {
        if (v.worker) {
            v.base = v.worker->stop();
            v.worker.reset();
        }
    }
}

bool session::start_ring(unsigned index)
{
    vring& v = _vrings[index];
    if (v.worker || !v.kick_set || !v.addr_set || v.num == 0 || _memory.count() == 0) {
        return true;  // not all set yet: it starts when the last piece comes
    }
    worker_config cfg;
    cfg.index = index;
    cfg.queue = &_dev.queue(index);
    cfg.limits = &_dev.limits();
    cfg.settings = &_settings;
    cfg.memory = &_memory;
    cfg.desc_addr = v.addr.desc_user_addr;
    cfg.avail_addr = v.addr.avail_user_addr;
    cfg.used_addr = v.addr.used_user_addr;
    cfg.num = v.num;
    cfg.base = v.base;
    cfg.event_idx = (_features & feature_bit(VIRTIO_RING_F_EVENT_IDX)) != 0;
    cfg.indirect = (_features & feature_bit(VIRTIO_RING_F_INDIRECT_DESC)) != 0;
    // Without protocol features a ring is enabled once started.
    cfg.enabled = (_features & feature_bit(vu::k_f_protocol_features)) == 0 || v.enabled;
    cfg.kick_fd = v.kick;
    cfg.call_fd = v.call;
    if (_inflight != nullptr && index < _inflight_queues && v.num == _inflight_queue_size) {
        cfg.inflight =
            static_cast<uint8_t*>(_inflight) + index * virtio::inflight_queue_bytes(v.num);
    }
    cfg.write_back = &_write_back;
    cfg.counters = &_counters[index];
    cfg.error_fd = _error_fd;
    auto worker = std::make_unique<queue_worker>(cfg);
    if (const char* err = worker->start()) {
        log(fmt::format("ring {} cannot start: {}", index, err));
        return false;
    }
    v.worker = std::move(worker);
    return true;
}

session::outcome session::get_vring_base(const vu::message& m)
{
    const unsigned index = m.body.state.index;
    vring& v = _vrings[index];
    if (v.worker) {
        v.base = v.worker->stop();
        v.worker.reset();
    }
    // A stopped ring waits for a new kick descriptor to start again.
    close_fd(v.kick);
    v.kick_set = false;
    const vhost_vring_state state{index, v.base};
    return reply(m, &state, sizeof state) ? outcome::replied : outcome::close;
}

session::outcome session::set_vring_fd(vu::message& m)
{
    const unsigned index = static_cast<unsigned>(m.body.u64 & vu::k_vring_index_mask);
    int fd = -1;
    if ((m.body.u64 & vu::k_vring_nofd) == 0) {
        fd = m.fds[0];
        m.fds[0] = -1;
    }
    vring& v = _vrings[index];
    switch (m.hdr.request) {
    case vu::k_set_vring_kick: {
        const int old = v.kick;
        v.kick = fd;
        v.kick_set = true;
        if (v.worker) {
            v.worker->pause(false);
            v.worker->set_kick_fd(fd);
            v.worker->resume();
            if (old >= 0) {
                ::close(old);
            }
            return outcome::ok;
        }
        if (old >= 0) {
            ::close(old);
        }
        return start_ring(index) ? outcome::ok : outcome::failed;
    }
    case vu::k_set_vring_call: {
        const int old = v.call;
        v.call = fd;
        if (v.worker) {
            v.worker->pause(false);
            v.worker->set_call_fd(fd);
            v.worker->resume();
        }
        if (old >= 0) {
            ::close(old);
        }
        return outcome::ok;
    }
    default:  // SET_VRING_ERR: kept, never signalled (no ring errors to report)
        close_fd(v.err);
        v.err = fd;
        return outcome::ok;
    }
}

// ---------------------------------------------------------------- config

session::outcome session::get_config(const vu::message& m)
{
    const virtio::blk_config cfg =
        make_config(_dev.limits(), _settings, _write_back.load(std::memory_order_relaxed));
    const auto* bytes = reinterpret_cast<const uint8_t*>(&cfg);
    vu::config_space out{};
    out.offset = m.body.config.offset;
    out.size = m.body.config.size;
    out.flags = m.body.config.flags;
    for (uint32_t i = 0; i < out.size; ++i) {
        const uint32_t at = out.offset + i;
        out.payload[i] = at < sizeof cfg ? bytes[at] : 0;
    }
    return reply(m, &out, vu::k_config_header_bytes + out.size) ? outcome::replied : outcome::close;
}

session::outcome session::set_backend_req_fd(vu::message& m)
{
    if ((_protocol & feature_bit(vu::k_pf_backend_req)) == 0) {
        log("SET_BACKEND_REQ_FD without the BACKEND_REQ protocol feature; answered as failed");
        return outcome::failed;
    }
    std::lock_guard lock(_backend_mutex);
    close_fd(_backend_fd);
    _backend_fd = m.fds[0];
    m.fds[0] = -1;
    return outcome::ok;
}

void session::capacity_changed(uint64_t bytes)
{
    std::lock_guard lock(_backend_mutex);
    if (_backend_fd < 0) {
        log(
            fmt::format("capacity now {} bytes; the front end gave no back-end channel, so "
                        "the guest sees it only after it reads the config space again",
                        bytes));
        return;
    }
    // No reply asked for: the front end's answer is to read the config
    // space (GET_CONFIG on the main channel, this session's thread).
    vu::message note;
    note.hdr.request = vu::k_backend_config_change_msg;
    note.hdr.flags = vu::k_version;
    note.hdr.size = 0;
    if (const int rc = vu::send(_backend_fd, note); rc < 0) {
        log(fmt::format("capacity now {} bytes; telling the front end failed: {}", bytes,
                        std::strerror(-rc)));
        return;
    }
    log(fmt::format("capacity now {} bytes; the front end was told (CONFIG_CHANGE_MSG)", bytes));
}

session::outcome session::set_config(const vu::message& m)
{
    const vu::config_space& c = m.body.config;
    // Only the write-cache mode is writable, and only when offered.
    if ((_offered & feature_bit(VIRTIO_BLK_F_CONFIG_WCE)) == 0 ||
        c.offset != offsetof(virtio_blk_config, wce) || c.size != 1) {
        log(fmt::format("SET_CONFIG of {} bytes at offset {}: only wce (offset {}) is writable{}",
                        c.size, c.offset, offsetof(virtio_blk_config, wce),
                        (_offered & feature_bit(VIRTIO_BLK_F_CONFIG_WCE)) == 0
                            ? ", and the device has no write cache"
                            : ""));
        return outcome::failed;
    }
    _write_back.store(c.payload[0] != 0, std::memory_order_relaxed);
    return outcome::ok;
}

// ---------------------------------------------------------------- inflight

session::outcome session::get_inflight_fd(const vu::message& m)
{
    if (any_ring_running()) {
        log("GET_INFLIGHT_FD while rings run: refused");
        return outcome::failed;
    }
    const vu::inflight_info& in = m.body.inflight;
    const uint64_t size = in.num_queues * virtio::inflight_queue_bytes(in.queue_size);
    const fd_guard memfd{::memfd_create("softblk-vhost-inflight", MFD_CLOEXEC | MFD_ALLOW_SEALING)};
    const int fd = memfd.fd;  // closed when the reply has passed it on
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
        log(fmt::format("GET_INFLIGHT_FD: a memfd of {} bytes: {}", size, std::strerror(errno)));
        return outcome::failed;
    }
    ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        log(fmt::format("GET_INFLIGHT_FD: mmap: {}", std::strerror(errno)));
        return outcome::failed;
    }
    if (_inflight != nullptr) {
        ::munmap(_inflight, _inflight_length);
    }
    _inflight = p;
    _inflight_length = size;
    _inflight_queues = in.num_queues;
    _inflight_queue_size = in.queue_size;
    vu::inflight_info out{.mmap_size = size,
                          .mmap_offset = 0,
                          .num_queues = in.num_queues,
                          .queue_size = in.queue_size};
    return reply(m, &out, sizeof out, fd) ? outcome::replied : outcome::close;
}

session::outcome session::set_inflight_fd(vu::message& m)
{
    const fd_guard owned{m.fds[0]};  // the mapping keeps the region; the descriptor goes
    const int fd = owned.fd;
    m.fds[0] = -1;
    const vu::inflight_info& in = m.body.inflight;
    if (any_ring_running()) {
        log("SET_INFLIGHT_FD while rings run: refused");
        return outcome::failed;
    }
    const uint64_t need = in.num_queues * virtio::inflight_queue_bytes(in.queue_size);
    struct stat st;
    if (in.mmap_size < need || ::fstat(fd, &st) != 0 ||
        static_cast<uint64_t>(st.st_size) < in.mmap_offset + in.mmap_size ||
        in.mmap_offset % static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) != 0) {
        log(
            fmt::format("SET_INFLIGHT_FD: {} bytes at offset {} for {} queues of {}: the region "
                        "needs {} bytes inside its file at a page-aligned offset",
                        in.mmap_size, in.mmap_offset, in.num_queues, in.queue_size, need));
        return outcome::failed;
    }
    void* p = ::mmap(nullptr, in.mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                     static_cast<off_t>(in.mmap_offset));
    const int e = errno;
    if (p == MAP_FAILED) {
        log(fmt::format("SET_INFLIGHT_FD: mmap: {}", std::strerror(e)));
        return outcome::failed;
    }
    if (_inflight != nullptr) {
        ::munmap(_inflight, _inflight_length);
    }
    _inflight = p;
    _inflight_length = in.mmap_size;
    _inflight_queues = in.num_queues;
    _inflight_queue_size = in.queue_size;
    return outcome::ok;
}

}  // namespace softblk::vhost_user_blk
