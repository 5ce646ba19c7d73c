// NBD wire protocol constants and big-endian helpers (the protocol as
// written in the NBD project's doc/proto.md). Pure: no I/O, no softblk
// types, so the codec, its unit tests and the libFuzzer target (built by
// clang) share it.
#pragma once

#include <cstdint>
#include <cstring>

namespace softblk::nbd {

// ---------------------------------------------------------------- handshake

constexpr uint64_t k_nbd_magic = 0x4e42444d41474943ull;  // "NBDMAGIC"
constexpr uint64_t k_ihaveopt = 0x49484156454f5054ull;   // "IHAVEOPT"
constexpr uint64_t k_option_reply_magic = 0x0003e889045565a9ull;

// Handshake flags (server, 16 bits) and client flags (32 bits).
constexpr uint16_t k_flag_fixed_newstyle = 1u << 0;
constexpr uint16_t k_flag_no_zeroes = 1u << 1;
constexpr uint32_t k_flag_c_fixed_newstyle = 1u << 0;
constexpr uint32_t k_flag_c_no_zeroes = 1u << 1;

// Options.
enum option : uint32_t {
    k_opt_export_name = 1,
    k_opt_abort = 2,
    k_opt_list = 3,
    k_opt_peek_export = 4,
    k_opt_starttls = 5,
    k_opt_info = 6,
    k_opt_go = 7,
    k_opt_structured_reply = 8,
    k_opt_list_meta_context = 9,
    k_opt_set_meta_context = 10,
    k_opt_extended_headers = 11,
};

// Option replies.
constexpr uint32_t k_rep_ack = 1;
constexpr uint32_t k_rep_server = 2;
constexpr uint32_t k_rep_info = 3;
constexpr uint32_t k_rep_meta_context = 4;
constexpr uint32_t k_rep_flag_error = 1u << 31;
constexpr uint32_t k_rep_err_unsup = k_rep_flag_error | 1;
constexpr uint32_t k_rep_err_policy = k_rep_flag_error | 2;
constexpr uint32_t k_rep_err_invalid = k_rep_flag_error | 3;
constexpr uint32_t k_rep_err_platform = k_rep_flag_error | 4;
constexpr uint32_t k_rep_err_tls_reqd = k_rep_flag_error | 5;
constexpr uint32_t k_rep_err_unknown = k_rep_flag_error | 6;
constexpr uint32_t k_rep_err_shutdown = k_rep_flag_error | 7;
constexpr uint32_t k_rep_err_block_size_reqd = k_rep_flag_error | 8;
constexpr uint32_t k_rep_err_too_big = k_rep_flag_error | 9;

// NBD_REP_INFO types.
constexpr uint16_t k_info_export = 0;
constexpr uint16_t k_info_name = 1;
constexpr uint16_t k_info_description = 2;
constexpr uint16_t k_info_block_size = 3;

// Transmission flags (16 bits, sent with the export's size).
constexpr uint16_t k_tflag_has_flags = 1u << 0;
constexpr uint16_t k_tflag_read_only = 1u << 1;
constexpr uint16_t k_tflag_send_flush = 1u << 2;
constexpr uint16_t k_tflag_send_fua = 1u << 3;
constexpr uint16_t k_tflag_rotational = 1u << 4;
constexpr uint16_t k_tflag_send_trim = 1u << 5;
constexpr uint16_t k_tflag_send_write_zeroes = 1u << 6;
constexpr uint16_t k_tflag_send_df = 1u << 7;
constexpr uint16_t k_tflag_can_multi_conn = 1u << 8;
constexpr uint16_t k_tflag_send_resize = 1u << 9;
constexpr uint16_t k_tflag_send_cache = 1u << 10;
constexpr uint16_t k_tflag_send_fast_zero = 1u << 11;

// ---------------------------------------------------------------- transmission

constexpr uint32_t k_request_magic = 0x25609513u;
constexpr uint32_t k_simple_reply_magic = 0x67446698u;
constexpr uint32_t k_structured_reply_magic = 0x668e33efu;

constexpr size_t k_request_size = 28;
constexpr size_t k_simple_reply_size = 16;
constexpr size_t k_chunk_header_size = 20;

// Commands.
enum command : uint16_t {
    k_cmd_read = 0,
    k_cmd_write = 1,
    k_cmd_disc = 2,
    k_cmd_flush = 3,
    k_cmd_trim = 4,
    k_cmd_cache = 5,
    k_cmd_write_zeroes = 6,
    k_cmd_block_status = 7,
    k_cmd_resize = 8,
};

// Command flags.
constexpr uint16_t k_cmd_flag_fua = 1u << 0;
constexpr uint16_t k_cmd_flag_no_hole = 1u << 1;
constexpr uint16_t k_cmd_flag_df = 1u << 2;
constexpr uint16_t k_cmd_flag_req_one = 1u << 3;
constexpr uint16_t k_cmd_flag_fast_zero = 1u << 4;

// Structured reply chunks.
constexpr uint16_t k_reply_flag_done = 1u << 0;
constexpr uint16_t k_reply_type_none = 0;
constexpr uint16_t k_reply_type_offset_data = 1;
constexpr uint16_t k_reply_type_offset_hole = 2;
constexpr uint16_t k_reply_type_block_status = 5;
constexpr uint16_t k_reply_type_error = (1u << 15) + 1;
constexpr uint16_t k_reply_type_error_offset = (1u << 15) + 2;

// base:allocation states.
constexpr uint32_t k_state_hole = 1u << 0;
constexpr uint32_t k_state_zero = 1u << 1;

// Errors on the wire (Linux values, fixed by the protocol).
constexpr uint32_t k_eperm = 1;
constexpr uint32_t k_eio = 5;
constexpr uint32_t k_enomem = 12;
constexpr uint32_t k_einval = 22;
constexpr uint32_t k_enospc = 28;
constexpr uint32_t k_eoverflow = 75;
constexpr uint32_t k_enotsup = 95;
constexpr uint32_t k_eshutdown = 108;

// ---------------------------------------------------------------- byte order

inline uint16_t load_be16(const uint8_t* p)
{
    return static_cast<uint16_t>((p[0] << 8) | p[1]);
}
inline uint32_t load_be32(const uint8_t* p)
{
    uint32_t v;
    std::memcpy(&v, p, 4);
    return __builtin_bswap32(v);
}
inline uint64_t load_be64(const uint8_t* p)
{
    uint64_t v;
    std::memcpy(&v, p, 8);
    return __builtin_bswap64(v);
}
inline void store_be16(uint8_t* p, uint16_t v)
{
    p[0] = static_cast<uint8_t>(v >> 8);
    p[1] = static_cast<uint8_t>(v);
}
inline void store_be32(uint8_t* p, uint32_t v)
{
    v = __builtin_bswap32(v);
    std::memcpy(p, &v, 4);
}
inline void store_be64(uint8_t* p, uint64_t v)
{
    v = __builtin_bswap64(v);
    std::memcpy(p, &v, 8);
}

}  // namespace softblk::nbd
