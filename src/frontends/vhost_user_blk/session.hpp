// One vhost-user connection of the vhost-user-blk back end: the protocol's
// control side (features, memory table, vring setup, config space,
// inflight region) on the export's thread, and one queue_worker per
// started ring.
//
// Every message is checked (virtio::vhost_user::check_request) before it
// is acted on; a malformed one, or one that leaves the connection
// unusable (a memory table that cannot be mapped), ends the connection
// with a log line. Memory the front end shares is mapped only as far as
// its file reaches; changes to the memory table wait until the rings
// have completed the requests that point into it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <softblk/device.hpp>
#include <softblk/virtio/memory.hpp>
#include <softblk/virtio/vhost_user.hpp>

#include "blk_config.hpp"
#include "queue_worker.hpp"

namespace softblk::vhost_user_blk {

class session {
public:
    // Takes ownership of `conn_fd`. `counters` has settings.num_queues
    // entries and outlives the session. Export thread.
    session(int conn_fd, device& dev, const export_settings& settings, ring_counters* counters);
    // Stops the rings (their requests complete first), unmaps the shared
    // memory, closes every descriptor.
    ~session();
    session(const session&) = delete;
    session& operator=(const session&) = delete;

    int fd() const { return _fd; }
    // Readable when a ring found the driver broke it (the connection should
    // go).
    int error_fd() const { return _error_fd; }

    // Reads and handles one message. Returns false when the connection
    // must close (end of stream, a malformed message, a failure that
    // leaves the session unusable); the reason has been logged. Export
    // thread.
    bool handle_message();

private:
    enum class outcome : uint8_t { ok, failed, replied, close };

    struct mapping {
        void* base = nullptr;
        size_t length = 0;
        virtio::memory_region region;
    };

    struct vring {
        uint32_t num = 0;
        uint16_t base = 0;
        bool addr_set = false;
        vhost_vring_addr addr{};
        bool kick_set = false;  // SET_VRING_KICK came (kick may be -1: poll)
        int kick = -1;
        int call = -1;
        int err = -1;
        bool enabled = false;
        std::unique_ptr<queue_worker> worker;
    };

    outcome dispatch(virtio::vhost_user::message& m);
    outcome set_mem_table(virtio::vhost_user::message& m);
    outcome add_mem_reg(virtio::vhost_user::message& m);
    outcome rem_mem_reg(const virtio::vhost_user::message& m);
    outcome get_config(const virtio::vhost_user::message& m);
    outcome set_config(const virtio::vhost_user::message& m);
    outcome get_inflight_fd(const virtio::vhost_user::message& m);
    outcome set_inflight_fd(virtio::vhost_user::message& m);
    outcome set_vring_fd(virtio::vhost_user::message& m);
    outcome get_vring_base(const virtio::vhost_user::message& m);
    outcome set_backend_req_fd(virtio::vhost_user::message& m);
    // The device's capacity changed (device::add_capacity_listener): tells
    // the front end on the back-end channel that the config space changed,
    // so it reads the new capacity (GET_CONFIG) and tells the guest. The
    // resizing thread.
    void capacity_changed(uint64_t bytes);

    // Maps one region from `fd` (which it closes) and adds it to the table.
    bool map_region(const virtio::vhost_user::region_desc& r, int fd);
    void unmap_all();
    bool start_ring(unsigned index);
    void stop_rings();
    bool any_ring_running() const;
    void pause_rings(bool drain);
    void resume_rings();
    bool reply(const virtio::vhost_user::message& request, const void* payload, uint32_t size,
               int fd = -1);
    void log(const std::string& what) const;

    int _fd;
    device& _dev;
    const export_settings& _settings;
    ring_counters* _counters;
    int _error_fd = -1;
    uint64_t _offered = 0;
    uint64_t _features = 0;
    uint64_t _protocol = 0;
    std::atomic<bool> _write_back{true};
    virtio::guest_memory _memory;
    std::vector<mapping> _maps;
    bool _warned_unsealed = false;
    std::vector<vring> _vrings;
    void* _inflight = nullptr;
    size_t _inflight_length = 0;
    uint16_t _inflight_queues = 0;
    uint16_t _inflight_queue_size = 0;

    // The back-end channel (SET_BACKEND_REQ_FD, protocol feature
    // BACKEND_REQ), written by capacity_changed on another thread:
    // _backend_mutex guards the descriptor and orders the messages.
    std::mutex _backend_mutex;
    int _backend_fd = -1;
    uint64_t _capacity_listener = 0;
};

}  // namespace softblk::vhost_user_blk
