// The kernel's ublk ABI (include/uapi/linux/ublk_cmd.h), as softblk uses it.
//
// The system's <linux/ublk_cmd.h> gives what it has (Debian 12 ships the
// Linux 6.1 header: no ioctl-encoded commands, no GET_FEATURES, no
// USER_COPY ...); everything newer is defined here under #ifndef, with the
// values of Linux 6.12 and later. Whether the running kernel has a feature
// is never assumed from these constants: it is what GET_FEATURES (or, on
// kernels without it, the flags ADD_DEV hands back) reports.
//
// The structures whose layout grew after 6.1 (ublksrv_ctrl_cmd gained
// dev_path_len; ublk_params gained devt, zoned and dma_align) are defined
// here under our own names with static_asserts on size and offsets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <linux/blkzoned.h>
#include <linux/ioctl.h>
#include <linux/ublk_cmd.h>
#include <string>
#include <vector>

#include <softblk/types.hpp>

// ---------------------------------------------------------------- commands

#ifndef UBLK_CMD_GET_DEV_INFO2
#define UBLK_CMD_GET_DEV_INFO2 0x12
#endif

namespace softblk::ublk {

// Control command numbers (the _IOC_NR part). Legacy kernels take these
// bare; kernels with UBLK_F_CMD_IOCTL_ENCODE take them ioctl-encoded.
enum ctrl_nr : uint8_t {
    k_cmd_get_queue_affinity = 0x01,
    k_cmd_get_dev_info = 0x02,
    k_cmd_add_dev = 0x04,
    k_cmd_del_dev = 0x05,
    k_cmd_start_dev = 0x06,
    k_cmd_stop_dev = 0x07,
    k_cmd_set_params = 0x08,
    k_cmd_get_params = 0x09,
    k_cmd_start_user_recovery = 0x10,
    k_cmd_end_user_recovery = 0x11,
    k_cmd_get_dev_info2 = 0x12,
    k_cmd_get_features = 0x13,   // ioctl-encoded only (Linux 6.5+)
    k_cmd_del_dev_async = 0x14,  // ioctl-encoded only (Linux 6.10+)
    k_cmd_update_size = 0x15,    // ioctl-encoded only (Linux 6.16+, UBLK_F_UPDATE_SIZE)
};

enum io_nr : uint8_t {
    k_io_fetch_req = 0x20,
    k_io_commit_and_fetch_req = 0x21,
    k_io_need_get_data = 0x22,
    // UBLK_F_SUPPORT_ZERO_COPY (Linux 6.15+), ioctl-encoded only: put a
    // request's pages in (take them out of) the issuing ring's fixed-buffer
    // table, at io_cmd::addr.
    k_io_register_io_buf = 0x23,
    k_io_unregister_io_buf = 0x24,
    // UBLK_F_BATCH_IO, ioctl-encoded only, each with a batch_cmd: hand the
    // kernel a queue's tags (PREP), commit the results of many requests
    // at once (COMMIT), and receive requests as lists of tags from one
    // multishot command into provided buffers (FETCH).
    k_io_prep_io_cmds = 0x25,
    k_io_commit_io_cmds = 0x26,
    k_io_fetch_io_cmds = 0x27,
};

// What the kernel stores behind sqe->cmd for a control command (32 bytes).
// Same size as 6.1's struct ublksrv_ctrl_cmd, whose data[2] became
// data[1] + dev_path_len/pad/reserved.
struct ctrl_cmd {
    uint32_t dev_id;
    uint16_t queue_id;
    uint16_t len;
    uint64_t addr;
    uint64_t data[1];
    uint16_t dev_path_len;  // UBLK_F_UNPRIVILEGED_DEV and GET_DEV_INFO2
    uint16_t pad;
    uint32_t reserved;
};
static_assert(sizeof(ctrl_cmd) == 32);
static_assert(sizeof(ctrl_cmd) == sizeof(::ublksrv_ctrl_cmd));
static_assert(offsetof(ctrl_cmd, addr) == offsetof(::ublksrv_ctrl_cmd, addr));
static_assert(offsetof(ctrl_cmd, data) == offsetof(::ublksrv_ctrl_cmd, data));

// struct ublksrv_ctrl_dev_info (64 bytes); owner_uid/gid replaced 6.1's
// reserved0.
struct dev_info {
    uint16_t nr_hw_queues;
    uint16_t queue_depth;
    uint16_t state;
    uint16_t pad0;
    uint32_t max_io_buf_bytes;
    uint32_t dev_id;
    int32_t ublksrv_pid;
    uint32_t pad1;
    uint64_t flags;
    uint64_t ublksrv_flags;
    uint32_t owner_uid;
    uint32_t owner_gid;
    uint64_t reserved1;
    uint64_t reserved2;
};
static_assert(sizeof(dev_info) == 64);
static_assert(sizeof(dev_info) == sizeof(::ublksrv_ctrl_dev_info));
static_assert(offsetof(dev_info, flags) == offsetof(::ublksrv_ctrl_dev_info, flags));

// The per-I/O command (16 bytes, fits a 64-byte SQE's cmd area).
struct io_cmd {
    uint16_t q_id;
    uint16_t tag;
    int32_t result;
    // buffer (copy mode), zone_append_lba (USER_COPY + zoned) or the
    // fixed-buffer index (REGISTER_IO_BUF / UNREGISTER_IO_BUF)
    uint64_t addr;
};
static_assert(sizeof(io_cmd) == sizeof(::ublksrv_io_cmd));

// UBLK_F_AUTO_BUF_REG without BATCH_IO: what FETCH_REQ and
// COMMIT_AND_FETCH_REQ carry in sqe->addr (not in io_cmd::addr), struct
// ublk_auto_buf_reg packed as ublk_auto_buf_reg_to_sqe_addr() does: the
// fixed-buffer index where the kernel puts the tag's next request's pages
// in bits 0..15, flags (AUTO_BUF_REG_FALLBACK) in 16..23, the rest
// reserved (zero).
constexpr uint8_t k_auto_buf_reg_fallback = 1u << 0;
constexpr uint64_t auto_buf_reg_addr(uint16_t index, uint8_t flags = 0)
{
    return uint64_t{index} | (uint64_t{flags} << 16);
}

// UBLK_F_BATCH_IO: what sqe->cmd carries (struct ublk_batch_io, 16
// bytes); addr and len of the SQE point at nr_elem elements of elem_bytes
// each (FETCH: room for 16-bit tags in a provided buffer instead).
struct batch_cmd {
    uint16_t q_id;
    uint16_t flags;
    uint16_t nr_elem;
    uint8_t elem_bytes;
    uint8_t reserved;
    uint64_t reserved2;
};
static_assert(sizeof(batch_cmd) == 16);
constexpr uint16_t k_batch_f_has_zone_lba = 1u << 0;  // each element ends with zone_lba
constexpr uint16_t k_batch_f_has_buf_addr = 1u << 1;  // each element has a buffer address
// One element of PREP and COMMIT (struct ublk_elem_header, then the
// optional 8 bytes): buf_index is where AUTO_BUF_REG puts the tag's next
// request's pages; zone_lba the sector a zone append landed on.
struct batch_elem {
    uint16_t tag;
    uint16_t buf_index;
    int32_t result;
    uint64_t zone_lba;
};
constexpr uint8_t k_batch_elem_header_bytes = 8;
// IORING_URING_CMD_MULTISHOT (sqe->uring_cmd_flags).
constexpr uint32_t k_uring_cmd_multishot = 1u << 1;

// What the kernel writes in the shared descriptor array, one per tag.
using io_desc = ::ublksrv_io_desc;
static_assert(sizeof(io_desc) == 24);

constexpr uint32_t encode_ctrl(uint8_t nr, bool read_only)
{
    // _IOR / _IOWR('u', nr, struct ublksrv_ctrl_cmd)
    return read_only ? static_cast<uint32_t>(_IOR('u', nr, ctrl_cmd))
                     : static_cast<uint32_t>(_IOWR('u', nr, ctrl_cmd));
}
constexpr uint32_t encode_io(uint8_t nr)
{
    return static_cast<uint32_t>(_IOWR('u', nr, io_cmd));
}

// The cmd_op a control command is sent with: ioctl-encoded when the kernel
// has UBLK_F_CMD_IOCTL_ENCODE, else the legacy bare number. The encodings
// are the kernel's: GET_* read-only (_IOR), the others _IOWR.
uint32_t ctrl_op(uint8_t nr, bool ioctl_encode);
uint32_t io_op_code(uint8_t nr, bool ioctl_encode);

// ---------------------------------------------------------------- offsets

constexpr uint64_t k_cmd_buf_offset = 0;             // UBLKSRV_CMD_BUF_OFFSET
constexpr uint64_t k_io_buf_offset = 0x80000000ull;  // UBLKSRV_IO_BUF_OFFSET
constexpr unsigned k_max_queue_depth = 4096;         // UBLK_MAX_QUEUE_DEPTH
constexpr unsigned k_io_buf_bits = 25;               // UBLK_IO_BUF_BITS: 32 MiB per I/O
constexpr unsigned k_tag_off = k_io_buf_bits;
constexpr unsigned k_tag_bits = 16;
constexpr unsigned k_qid_off = k_tag_off + k_tag_bits;
constexpr unsigned k_qid_bits = 12;
constexpr uint32_t k_max_io_buf_bytes = 1u << k_io_buf_bits;
constexpr size_t k_features_len = 8;  // UBLK_FEATURES_LEN

// Byte offset of queue `q`'s descriptor array in /dev/ublkcN's mmap space:
// the kernel spaces the queues by the largest array (4096 descriptors,
// rounded up to pages) and maps exactly round_up(depth * 24, page) bytes.
uint64_t cmd_buf_offset(unsigned q_id, size_t page_size);
size_t cmd_buf_length(unsigned depth, size_t page_size);

// USER_COPY: the pread/pwrite offset on /dev/ublkcN of byte `offset` of the
// request at (q_id, tag).
constexpr uint64_t user_copy_offset(unsigned q_id, unsigned tag, uint32_t offset = 0)
{
    return k_io_buf_offset + (uint64_t{q_id} << k_qid_off) + (uint64_t{tag} << k_tag_off) + offset;
}

// ---------------------------------------------------------------- results

constexpr int k_io_res_ok = 0;             // UBLK_IO_RES_OK
constexpr int k_io_res_need_get_data = 1;  // UBLK_IO_RES_NEED_GET_DATA
// UBLK_IO_RES_ABORT is -ENODEV: the command will not be re-fetched.

// ---------------------------------------------------------------- features

enum feature : uint64_t {
    k_f_support_zero_copy = 1ull << 0,
    k_f_uring_cmd_comp_in_task = 1ull << 1,
    k_f_need_get_data = 1ull << 2,
    k_f_user_recovery = 1ull << 3,
    k_f_user_recovery_reissue = 1ull << 4,
    k_f_unprivileged_dev = 1ull << 5,
    k_f_cmd_ioctl_encode = 1ull << 6,
    k_f_user_copy = 1ull << 7,
    k_f_zoned = 1ull << 8,
    k_f_user_recovery_fail_io = 1ull << 9,
    k_f_update_size = 1ull << 10,
    k_f_auto_buf_reg = 1ull << 11,
    k_f_quiesce = 1ull << 12,
    k_f_per_io_daemon = 1ull << 13,
    k_f_buf_reg_off_daemon = 1ull << 14,
    k_f_batch_io = 1ull << 15,
    k_f_integrity = 1ull << 16,
    k_f_safe_stop_dev = 1ull << 17,
    k_f_no_auto_part_scan = 1ull << 18,
    k_f_shmem_zc = 1ull << 19,
};

// The name of one feature bit as the kernel header spells it, without the
// UBLK_F_ prefix ("USER_RECOVERY"); "bit N" for bits this build does not
// know.
std::string feature_name(unsigned bit);
// Every set bit of `features`, in bit order.
std::vector<std::string> feature_names(uint64_t features);

// Device states (dev_info.state).
enum dev_state : uint16_t {
    k_state_dead = 0,
    k_state_live = 1,
    k_state_quiesced = 2,
    k_state_fail_io = 3,  // Linux 6.13+
};
std::string state_name(uint16_t state);

// ---------------------------------------------------------------- I/O ops

enum io_desc_op : uint8_t {
    k_op_read = 0,
    k_op_write = 1,
    k_op_flush = 2,
    k_op_discard = 3,
    k_op_write_same = 4,
    k_op_write_zeroes = 5,
    k_op_zone_open = 10,
    k_op_zone_close = 11,
    k_op_zone_finish = 12,
    k_op_zone_append = 13,
    k_op_zone_reset_all = 14,
    k_op_zone_reset = 15,
    k_op_report_zones = 18,
};

// Flags in io_desc.op_flags (bits 8..31 as they sit in op_flags).
constexpr uint32_t k_io_f_failfast_dev = 1u << 8;
constexpr uint32_t k_io_f_fua = 1u << 13;
constexpr uint32_t k_io_f_nounmap = 1u << 15;

// ---------------------------------------------------------------- params

struct param_basic {
    uint32_t attrs;
    uint8_t logical_bs_shift;
    uint8_t physical_bs_shift;
    uint8_t io_opt_shift;
    uint8_t io_min_shift;
    uint32_t max_sectors;
    uint32_t chunk_sectors;
    uint64_t dev_sectors;
    uint64_t virt_boundary_mask;
};
static_assert(sizeof(param_basic) == sizeof(::ublk_param_basic));

constexpr uint32_t k_attr_read_only = 1u << 0;
constexpr uint32_t k_attr_rotational = 1u << 1;
constexpr uint32_t k_attr_volatile_cache = 1u << 2;
constexpr uint32_t k_attr_fua = 1u << 3;

struct param_discard {
    uint32_t discard_alignment;
    uint32_t discard_granularity;
    uint32_t max_discard_sectors;
    uint32_t max_write_zeroes_sectors;
    uint16_t max_discard_segments;
    uint16_t reserved0;
};
static_assert(sizeof(param_discard) == sizeof(::ublk_param_discard));

struct param_devt {
    uint32_t char_major;
    uint32_t char_minor;
    uint32_t disk_major;
    uint32_t disk_minor;
};

struct param_zoned {
    uint32_t max_open_zones;
    uint32_t max_active_zones;
    uint32_t max_zone_append_sectors;
    uint8_t reserved[20];
};

// struct ublk_params up to the zoned member (Linux 6.6..6.12 layout); the
// kernel copies min(len, its own size) and ignores types it does not know.
struct params {
    uint32_t len;
    uint32_t types;
    param_basic basic;
    param_discard discard;
    param_devt devt;
    param_zoned zoned;
};
static_assert(offsetof(params, basic) == offsetof(::ublk_params, basic));
static_assert(offsetof(params, discard) == offsetof(::ublk_params, discard));

// REPORT_ZONES: the server writes struct blk_zone entries (64 bytes,
// <linux/blkzoned.h>, sectors) into the request's buffer; a zero-length
// entry ends the list.
static_assert(sizeof(::blk_zone) == 64);
// One zone as the kernel wants it: bytes to sectors, a write pointer of
// UINT64_MAX ("none") kept as all ones.
::blk_zone to_blk_zone(const zone_descriptor& zone);
// Rewrites `count` zone_descriptor entries at the start of `buffer` as
// blk_zone entries in place (the larger entries are written from the last
// one back, so no entry is overwritten before it is read). `buffer` must
// hold count * 64 bytes.
void zones_to_blk_zones(void* buffer, uint32_t count);

constexpr uint32_t k_param_basic = 1u << 0;
constexpr uint32_t k_param_discard = 1u << 1;
constexpr uint32_t k_param_devt = 1u << 2;
constexpr uint32_t k_param_zoned = 1u << 3;

}  // namespace softblk::ublk
