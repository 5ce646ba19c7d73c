// The front end's side of the vhost-user protocol, for softblk's virtio-blk
// driver (what libblkio's virtio-blk-vhost-user driver does): connect to a
// back end's socket, negotiate features, share memory, set up vrings.
// Control path only: every call blocks until the back end answered (with
// REPLY_ACK when the back end has it, so that a setting is in force when
// the call returns), or until the connection's deadline: connecting and the
// whole handshake share one (connect_timeout), so a back end that answers
// slowly cannot add its delays up.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <softblk/types.hpp>
#include <softblk/virtio/vhost_user.hpp>

namespace softblk::virtio_driver {

class vhost_user_client {
public:
    vhost_user_client() = default;
    ~vhost_user_client();
    vhost_user_client(vhost_user_client&& other) noexcept;
    vhost_user_client& operator=(vhost_user_client&& other) noexcept;

    // Connects to the back end listening on `path`, retrying while the
    // socket is not there yet, refuses or has a full backlog, and sets the
    // deadline of every later call: `timeout_ms` from now (connect_timeout).
    // A path that exists and is not a socket fails at once. A readable
    // `cancel_fd` (-1: none; not owned) ends any wait with ECANCELED. Errors
    // name the path, the message and connect_timeout.
    static result<vhost_user_client> connect(const std::string& path, uint32_t timeout_ms,
                                             int cancel_fd = -1);

    int fd() const { return _fd; }
    const std::string& path() const { return _path; }

    // After SET_PROTOCOL_FEATURES with REPLY_ACK, settings are acknowledged.
    void set_reply_ack(bool on) { _reply_ack = on; }

    // GET_FEATURES, GET_PROTOCOL_FEATURES, GET_QUEUE_NUM ...
    result<uint64_t> get_u64(uint32_t request);
    // SET_FEATURES, SET_PROTOCOL_FEATURES, SET_OWNER (no payload: size 0).
    result<void> set_u64(uint32_t request, uint64_t value);
    result<void> set_owner();
    // SET_VRING_NUM, SET_VRING_BASE, SET_VRING_ENABLE.
    result<void> set_state(uint32_t request, unsigned index, unsigned num);
    result<void> set_vring_addr(const vhost_vring_addr& addr);
    // SET_VRING_KICK, SET_VRING_CALL (fd -1: none, poll).
    result<void> set_vring_fd(uint32_t request, unsigned index, int fd);
    // GET_VRING_BASE: stops the ring, returns its next available index.
    result<uint16_t> get_vring_base(unsigned index);
    // SET_MEM_TABLE with one region per descriptor.
    result<void> set_mem_table(const std::vector<virtio::vhost_user::region_desc>& regions,
                               const std::vector<int>& fds);
    // GET_CONFIG of `size` bytes from offset 0.
    result<std::vector<uint8_t>> get_config(uint32_t size);

private:
    result<void> send(virtio::vhost_user::message& m, bool ack);
    result<virtio::vhost_user::message> call(virtio::vhost_user::message& m, uint32_t reply_size);
    // Receives the reply to `m` and checks it (payload of `size` bytes,
    // 0: any).
    result<virtio::vhost_user::message> await_reply(const virtio::vhost_user::message& m,
                                                    uint32_t size);
    error failure(const virtio::vhost_user::message& m, const std::string& what) const;
    error timeout(const virtio::vhost_user::message& m, bool sending) const;
    // Waits until the socket can take a message (send) or holds a whole one
    // (or its end) that receive() then reads without blocking; the socket's
    // time-outs are set to what is left. Returns 0, -ETIMEDOUT at the
    // deadline, -ECANCELED, or -errno.
    int wait_until_writable() const;
    int wait_for_message() const;
    // Milliseconds to the deadline, rounded up; 0 once it passed.
    int remaining_ms() const;

    int _fd = -1;
    std::string _path;
    bool _reply_ack = false;
    uint64_t _deadline_ns = 0;  // CLOCK_MONOTONIC
    uint32_t _timeout_ms = 0;
    int _cancel_fd = -1;
};

}  // namespace softblk::virtio_driver
