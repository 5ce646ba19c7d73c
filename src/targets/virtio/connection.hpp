// One connection of softblk's virtio-blk driver to its vhost-user-blk back
// end: connect, negotiate, read the config space, share fresh memory and
// start every virtqueue, all within one deadline (connect_timeout). The
// device's first connection decides its shape (features, geometry, ring
// and buffer sizes); a later one (after a request the back end held timed
// out) must find the same device behind the socket.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <softblk/types.hpp>

#include "driver_queue.hpp"
#include "vhost_user_client.hpp"

namespace softblk::virtio_driver {

// What the device asks for (its options).
struct connection_settings {
    std::string path;
    uint32_t connect_timeout_ms = 5000;
    unsigned submit_queues = 1;
    unsigned queue_count = 1;  // submit_queues + poll_queues
    uint32_t depth = 0;        // hw_queue_depth
    uint64_t max_transfer_bytes = 0;
    bool indirect = false;
    bool poll = false;
};

// What the first connection found; later connections must match it.
struct device_shape {
    uint64_t features = 0;  // negotiated (SET_FEATURES)
    unsigned backend_queues = 1;
    block_limits limits;
    uint32_t data_bytes = 0;  // per tag
    uint32_t ring_num = 0;
};

struct connection {
    vhost_user_client client;
    std::shared_ptr<connection_memory> memory;
};

// Connects to `settings.path` and sets the connection up within
// connect_timeout: GET_FEATURES ... SET_MEM_TABLE with new memory of
// `generation`, then every ring (SET_VRING_*), the queue's call eventfd
// from `call_fds`. `first`: fills `shape`; otherwise refuses a back end
// whose device differs from `shape`. `cancel_fd` (not owned) ends the waits
// when readable. Control path or the target's connection thread.
result<connection> open_connection(const connection_settings& settings, device_shape& shape,
                                   bool first, uint32_t generation,
                                   const std::vector<int>& call_fds, int cancel_fd);

}  // namespace softblk::virtio_driver
