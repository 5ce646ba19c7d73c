// The vhost-user protocol (QEMU docs/interop/vhost-user.rst): message
// layout, the checks every message from a front end passes before a back
// end acts on it, and message I/O on a unix socket with descriptors in the
// ancillary data. Both softblk's back end (vhost-user-blk export) and its
// front end (the virtio-blk driver) use it.
//
// Numbers are in the machine's byte order, as the protocol says. The
// kernel's vhost structures (<linux/vhost_types.h>) are used where the
// protocol borrows them (vring state, vring address).
//
// Pure: standard library, POSIX and kernel headers only (fuzzed with clang).
#pragma once

#include <cstddef>
#include <cstdint>

// The legacy part of the header (vring_init) is not C++.
#ifndef VIRTIO_RING_NO_LEGACY
#define VIRTIO_RING_NO_LEGACY 1
#endif
#include <linux/vhost_types.h>

namespace softblk::virtio::vhost_user {

// Front-end requests (front end -> back end).
enum request : uint32_t {
    k_get_features = 1,
    k_set_features = 2,
    k_set_owner = 3,
    k_reset_owner = 4,
    k_set_mem_table = 5,
    k_set_log_base = 6,
    k_set_log_fd = 7,
    k_set_vring_num = 8,
    k_set_vring_addr = 9,
    k_set_vring_base = 10,
    k_get_vring_base = 11,
    k_set_vring_kick = 12,
    k_set_vring_call = 13,
    k_set_vring_err = 14,
    k_get_protocol_features = 15,
    k_set_protocol_features = 16,
    k_get_queue_num = 17,
    k_set_vring_enable = 18,
    k_send_rarp = 19,
    k_net_set_mtu = 20,
    k_set_backend_req_fd = 21,
    k_iotlb_msg = 22,
    k_set_vring_endian = 23,
    k_get_config = 24,
    k_set_config = 25,
    k_create_crypto_session = 26,
    k_close_crypto_session = 27,
    k_postcopy_advise = 28,
    k_postcopy_listen = 29,
    k_postcopy_end = 30,
    k_get_inflight_fd = 31,
    k_set_inflight_fd = 32,
    k_gpu_set_socket = 33,
    k_reset_device = 34,
    k_vring_kick = 35,
    k_get_max_mem_slots = 36,
    k_add_mem_reg = 37,
    k_rem_mem_reg = 38,
    k_set_status = 39,
    k_get_status = 40,
};

// Back-end requests (back end -> front end), on the channel the front end
// gave with SET_BACKEND_REQ_FD.
enum backend_request : uint32_t {
    // The device's configuration space changed (a virtio-blk capacity):
    // the front end reads it again with GET_CONFIG. No payload.
    k_backend_config_change_msg = 2,
};

// The request's name for log lines ("SET_MEM_TABLE"), "unknown" otherwise.
const char* request_name(uint32_t request);

// Header flags.
constexpr uint32_t k_version = 0x1;
constexpr uint32_t k_version_mask = 0x3;
constexpr uint32_t k_flag_reply = 1u << 2;
constexpr uint32_t k_flag_need_reply = 1u << 3;

// Feature bit that says the back end speaks protocol features (virtio's
// reserved bit 30).
constexpr unsigned k_f_protocol_features = 30;

// The mask of feature or protocol-feature bit `n` (the numbers above and
// those of <linux/virtio_*.h>).
constexpr uint64_t feature_bit(unsigned n)
{
    return uint64_t{1} << n;
}

// Protocol feature bits.
constexpr unsigned k_pf_mq = 0;
constexpr unsigned k_pf_log_shmfd = 1;
constexpr unsigned k_pf_reply_ack = 3;
constexpr unsigned k_pf_backend_req = 5;
constexpr unsigned k_pf_config = 9;
constexpr unsigned k_pf_inflight_shmfd = 12;
constexpr unsigned k_pf_reset_device = 13;
constexpr unsigned k_pf_configure_mem_slots = 15;

// SET_VRING_KICK/CALL/ERR payload: vring index in bits 0-7, bit 8 = no
// descriptor (poll instead).
constexpr uint64_t k_vring_index_mask = 0xff;
constexpr uint64_t k_vring_nofd = 1u << 8;

// Descriptors one message may carry (VHOST_MEMORY_BASELINE_NREGIONS).
constexpr unsigned k_max_fds = 8;
// Regions SET_MEM_TABLE may carry.
constexpr unsigned k_max_table_regions = 8;
// Largest config space access.
constexpr uint32_t k_max_config = 256;

struct header {
    uint32_t request;
    uint32_t flags;
    uint32_t size;  // payload bytes
};
static_assert(sizeof(header) == 12);

struct region_desc {
    uint64_t guest_addr;
    uint64_t size;
    uint64_t user_addr;
    uint64_t mmap_offset;
};

struct memory_table {
    uint32_t nregions;
    uint32_t padding;
    region_desc regions[k_max_table_regions];
};

struct single_region {
    uint64_t padding;
    region_desc region;
};

struct config_space {
    uint32_t offset;
    uint32_t size;
    uint32_t flags;
    uint8_t payload[k_max_config];
};
constexpr uint32_t k_config_header_bytes = 12;

struct inflight_info {
    uint64_t mmap_size;
    uint64_t mmap_offset;
    uint16_t num_queues;
    uint16_t queue_size;
};
// QEMU and libvhost-user send sizeof (24, with tail padding); 20 is the
// protocol's minimum.
constexpr uint32_t k_inflight_min_bytes = 20;

union payload {
    uint64_t u64;
    vhost_vring_state state;
    vhost_vring_addr addr;
    memory_table table;
    single_region region;
    config_space config;
    inflight_info inflight;
    uint8_t raw[512];
};

struct message {
    header hdr{};
    payload body{};
    int fds[k_max_fds] = {-1, -1, -1, -1, -1, -1, -1, -1};
    unsigned nfds = 0;
};

// Closes the message's descriptors (those not taken: a taker sets them
// to -1).
void close_fds(message& m);

// Checks a message a back end received against the protocol before acting
// on it: version and reply flags, the payload size the request needs,
// the number of descriptors it carries, vring indices below `max_queues`,
// memory regions that are not empty and whose ranges do not wrap, config
// accesses within k_max_config, inflight sizes. Requests it does not know
// pass with only the generic checks (the back end answers them as
// unsupported). Returns nullptr, or what is wrong, for a log line.
const char* check_request(const message& m, uint32_t max_queues);

// Checks a reply a front end received to `request`: reply flag, version,
// same request, and a payload of exactly `size` bytes (0: any up to the
// payload's size, for GET_CONFIG which the caller checks). Returns nullptr
// or what is wrong.
const char* check_reply(const message& m, uint32_t request, uint32_t size);

// Receives one message from a stream socket: the header with any
// descriptors (SCM_RIGHTS, close-on-exec), then the payload. Returns 1, 0
// at end of stream before a message starts, or -errno: -EPROTO (stream
// ended inside a message, or a message larger than `payload`), -EMSGSIZE
// (more than k_max_fds descriptors; those received are closed), or the
// socket's error (-EAGAIN after the socket's receive timeout). The
// caller owns m.fds. Any thread.
int receive(int fd, message& m);

// Sends `m` (header, hdr.size payload bytes, m.nfds descriptors). Returns
// 0 or -errno. Any thread.
int send(int fd, const message& m);

}  // namespace softblk::virtio::vhost_user
