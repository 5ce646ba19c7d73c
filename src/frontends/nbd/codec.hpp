// The NBD protocol codec: the fixed-newstyle handshake as a state machine
// fed with bytes, request header parsing and validation, and reply
// encoding. Pure: it does no I/O and knows no device; the server feeds it
// what it received and sends what it produced, and so do the unit tests
// and the libFuzzer targets (fuzz/nbd). Depends on the standard library
// only, so that the fuzzers build with clang-16 and libc++ without the core.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "protocol.hpp"

namespace softblk::nbd {

// What a client learns about an export during the handshake.
struct export_details {
    std::string name;
    std::string description;
    // What a new connection is told. The server changes it when the device
    // is resized (set_size); connections keep the size they were told
    // (negotiated::size), as NBD has no resize.
    uint64_t size = 0;
    uint32_t min_block = 512;  // requests must be aligned to this
    uint32_t preferred_block = 4096;
    uint32_t max_block = 32u << 20;  // largest payload of one request
    bool read_only = false;
    bool rotational = false;
    bool can_trim = false;
    bool can_multi_conn = false;

    // `size` now, while the server may change it. Any thread.
    // The compilers' atomic built-ins rather than std::atomic_ref, which
    // the fuzzers' libc++ 16 does not have.
    uint64_t current_size() const { return __atomic_load_n(&size, __ATOMIC_RELAXED); }
    void set_size(uint64_t bytes) { __atomic_store_n(&size, bytes, __ATOMIC_RELAXED); }

    virtual ~export_details() = default;
};

// The exports a server offers. Implemented by the server (locked registry)
// and by tests. Called on the connection's thread during the handshake.
class export_catalog {
public:
    virtual ~export_catalog() = default;
    // The export called `name`, or nullptr. An empty name is the default
    // export: the only one when there is exactly one.
    virtual std::shared_ptr<const export_details> find(std::string_view name) const = 0;
    // Every export, for NBD_OPT_LIST.
    virtual std::vector<std::shared_ptr<const export_details>> list() const = 0;
};

enum class tls_mode : uint8_t { off, on, require };

// The one meta context softblk offers, and the id it gets.
constexpr std::string_view k_base_allocation = "base:allocation";
constexpr uint32_t k_base_allocation_id = 1;

// Largest option payload the server buffers; larger ones are skipped and
// answered NBD_REP_ERR_TOO_BIG. A name is at most 4096 bytes by the spec.
constexpr uint32_t k_max_option_length = 64 * 1024;

enum class handshake_action : uint8_t {
    need_more,     // feed more bytes (after sending what is in `out`)
    start_tls,     // send `out` (the ACK to STARTTLS), then run the TLS handshake
    transmission,  // send `out`, then enter the transmission phase (see result())
    close,         // send `out`, then close the connection
};

struct handshake_step {
    handshake_action action = handshake_action::need_more;
    size_t consumed = 0;  // bytes of the input used
};

// What the handshake negotiated.
struct negotiated {
    std::shared_ptr<const export_details> exp;
    uint16_t transmission_flags = 0;
    bool structured_replies = false;
    bool base_allocation = false;  // meta context k_base_allocation_id selected
    uint64_t size = 0;             // the export's size the client was told
};

// The server side of the fixed-newstyle handshake.
class handshake {
public:
    handshake(const export_catalog& catalog, tls_mode tls, bool tls_active = false);

    // The server's greeting (NBDMAGIC IHAVEOPT flags), appended to `out`.
    void greet(std::vector<uint8_t>& out);

    // Consumes what it can of `in` and appends replies to `out`. Call again
    // with the unconsumed rest plus new bytes. Never reads past `in`.
    handshake_step feed(std::span<const uint8_t> in, std::vector<uint8_t>& out);

    // The TLS handshake after start_tls succeeded: options continue.
    void tls_established() { _tls_active = true; }
    bool tls_active() const { return _tls_active; }

    // Valid after feed returned transmission.
    const negotiated& result() const { return _result; }

    // Why the handshake closed the connection (for the log), or "".
    const std::string& close_reason() const { return _close_reason; }

private:
    enum class state : uint8_t { client_flags, option_header, option_data, skipping, done };

    handshake_step process_option(uint32_t option, std::span<const uint8_t> data,
                                  std::vector<uint8_t>& out);
    void reply(std::vector<uint8_t>& out, uint32_t option, uint32_t type,
               std::span<const uint8_t> data = {});
    void reply_error(std::vector<uint8_t>& out, uint32_t option, uint32_t type,
                     std::string_view message);
    void reply_info_export(std::vector<uint8_t>& out, uint32_t option, const export_details& e,
                           uint64_t size);
    uint16_t transmission_flags(const export_details& e) const;
    bool do_meta_context(uint32_t option, std::span<const uint8_t> data, std::vector<uint8_t>& out);
    handshake_step close(std::string reason, size_t consumed);

    const export_catalog& _catalog;
    tls_mode _tls;
    bool _tls_active;
    state _state = state::client_flags;
    bool _no_zeroes = false;
    uint32_t _option = 0;
    uint32_t _option_length = 0;
    uint64_t _skip_left = 0;
    bool _structured = false;
    bool _base_allocation = false;
    std::string _meta_export;  // export the meta context selection applies to
    negotiated _result;
    std::string _close_reason;
};

// ---------------------------------------------------------------- requests

struct request_header {
    uint16_t flags = 0;
    uint16_t type = 0;
    uint64_t cookie = 0;
    uint64_t offset = 0;
    uint32_t length = 0;
};

// Parses the 28 bytes at `p`. Returns false when the magic is wrong (the
// stream is out of sync: the server must disconnect).
bool parse_request(const uint8_t* p, request_header& h);

// What the server does with a parsed request.
enum class request_disposition : uint8_t {
    execute,     // valid: run it
    error,       // answer with `error` (after consuming a write payload)
    disconnect,  // NBD_CMD_DISC, or a request that cannot be answered safely
};

struct request_check {
    request_disposition disposition = request_disposition::execute;
    uint32_t error = 0;    // NBD errno when disposition == error
    uint32_t payload = 0;  // bytes following the header that belong to it
};

// Validates `h` against the negotiated parameters: command known and
// advertised, flags allowed for the command, range inside the export,
// aligned to the minimum block size, payload within the maximum.
request_check check_request(const request_header& h, const negotiated& n);

// ---------------------------------------------------------------- replies

// Each encoder writes at `p` (which has room for the stated size) and
// returns the bytes written.
size_t encode_simple_reply(uint8_t* p, uint64_t cookie, uint32_t error);  // 16
size_t encode_chunk_header(uint8_t* p, uint16_t flags, uint16_t type, uint64_t cookie,
                           uint32_t length);  // 20
// Structured OFFSET_DATA header for `length` data bytes that follow (28).
size_t encode_read_chunk(uint8_t* p, uint64_t cookie, uint64_t offset, uint32_t length, bool done);
constexpr size_t k_read_chunk_size = k_chunk_header_size + 8;
// Structured ERROR chunk with DONE and no message (26).
size_t encode_error_chunk(uint8_t* p, uint64_t cookie, uint32_t error);
constexpr size_t k_error_chunk_size = k_chunk_header_size + 6;

// One base:allocation descriptor.
struct status_extent {
    uint32_t length = 0;
    uint32_t flags = 0;
};
// BLOCK_STATUS chunk (DONE set) for `extents`: appended to `out`.
void encode_block_status(std::vector<uint8_t>& out, uint64_t cookie, uint32_t context_id,
                         std::span<const status_extent> extents);

// The NBD error for a negative errno from the device.
uint32_t nbd_error_from_errno(int negative_errno);

const char* command_name(uint16_t type);

}  // namespace softblk::nbd
