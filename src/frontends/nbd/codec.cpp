#include "codec.hpp"

#include <algorithm>
#include <cerrno>

namespace softblk::nbd {

namespace {

void put16(std::vector<uint8_t>& out, uint16_t v)
{
    uint8_t b[2];
    store_be16(b, v);
    out.insert(out.end(), b, b + 2);
}
void put32(std::vector<uint8_t>& out, uint32_t v)
{
    uint8_t b[4];
    store_be32(b, v);
    out.insert(out.end(), b, b + 4);
}
void put64(std::vector<uint8_t>& out, uint64_t v)
{
    uint8_t b[8];
    store_be64(b, v);
    out.insert(out.end(), b, b + 8);
}
void put_text(std::vector<uint8_t>& out, std::string_view s)
{
    out.insert(out.end(), s.begin(), s.end());
}

// A cursor over an option's payload that never reads past its end.
struct reader {
    std::span<const uint8_t> data;
    size_t pos = 0;
    bool ok = true;

    size_t left() const { return data.size() - pos; }
    uint16_t u16()
    {
        if (left() < 2) {
            ok = false;
            return 0;
        }
        pos += 2;
        return load_be16(data.data() + pos - 2);
    }
    uint32_t u32()
    {
        if (left() < 4) {
            ok = false;
            return 0;
        }
        pos += 4;
        return load_be32(data.data() + pos - 4);
    }
    std::string_view text(uint64_t n)
    {
        if (n > left()) {
            ok = false;
            return {};
        }
        std::string_view s(reinterpret_cast<const char*>(data.data() + pos), n);
        pos += n;
        return s;
    }
};

}  // namespace

handshake::handshake(const export_catalog& catalog, tls_mode tls, bool tls_active)
    : _catalog(catalog), _tls(tls), _tls_active(tls_active)
{
}

void handshake::greet(std::vector<uint8_t>& out)
{
    put64(out, k_nbd_magic);
    put64(out, k_ihaveopt);
    put16(out, k_flag_fixed_newstyle | k_flag_no_zeroes);
}

void handshake::reply(std::vector<uint8_t>& out, uint32_t option, uint32_t type,
                      std::span<const uint8_t> data)
{
    put64(out, k_option_reply_magic);
    put32(out, option);
    put32(out, type);
    put32(out, static_cast<uint32_t>(data.size()));
    out.insert(out.end(), data.begin(), data.end());
}

void handshake::reply_error(std::vector<uint8_t>& out, uint32_t option, uint32_t type,
                            std::string_view message)
{
    reply(
        out, option, type,
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(message.data()), message.size()));
}

handshake_step handshake::close(std::string reason, size_t consumed)
{
    _state = state::done;
    _close_reason = std::move(reason);
    return {handshake_action::close, consumed};
}

uint16_t handshake::transmission_flags(const export_details& e) const
{
    uint16_t f = k_tflag_has_flags | k_tflag_send_flush | k_tflag_send_fua | k_tflag_send_cache;
    if (e.read_only) {
        f |= k_tflag_read_only;
    } else {
        f |= k_tflag_send_write_zeroes | k_tflag_send_fast_zero;
        if (e.can_trim) {
            f |= k_tflag_send_trim;
        }
    }
    if (e.rotational) {
        f |= k_tflag_rotational;
    }
    if (_structured) {
        f |= k_tflag_send_df;
    }
    if (e.can_multi_conn) {
        f |= k_tflag_can_multi_conn;
    }
    return f;
}

void handshake::reply_info_export(std::vector<uint8_t>& out, uint32_t option,
                                  const export_details& e, uint64_t size)
{
    uint8_t b[12];
    store_be16(b, k_info_export);
    store_be64(b + 2, size);
    store_be16(b + 10, transmission_flags(e));
    reply(out, option, k_rep_info, b);
}

handshake_step handshake::feed(std::span<const uint8_t> in, std::vector<uint8_t>& out)
{
    size_t used = 0;
    for (;;) {
        const size_t left = in.size() - used;
        const uint8_t* p = in.data() + used;
        switch (_state) {
        case state::client_flags: {
            if (left < 4) {
                return {handshake_action::need_more, used};
            }
            const uint32_t flags = load_be32(p);
            used += 4;
            if ((flags & ~(k_flag_c_fixed_newstyle | k_flag_c_no_zeroes)) != 0) {
                return close("client sent unknown handshake flags", used);
            }
            if ((flags & k_flag_c_fixed_newstyle) == 0) {
                return close("client does not speak the fixed newstyle handshake", used);
            }
            _no_zeroes = (flags & k_flag_c_no_zeroes) != 0;
            _state = state::option_header;
            break;
        }
        case state::option_header: {
            if (left < 16) {
                return {handshake_action::need_more, used};
            }
            if (load_be64(p) != k_ihaveopt) {
                return close("bad option magic", used);
            }
            _option = load_be32(p + 8);
            _option_length = load_be32(p + 12);
            used += 16;
            if (_option_length > k_max_option_length) {
                if (_option == k_opt_export_name) {
                    return close("NBD_OPT_EXPORT_NAME longer than any export name", used);
                }
                _skip_left = _option_length;
                _state = state::skipping;
            } else {
                _state = state::option_data;
            }
            break;
        }
        case state::skipping: {
            const uint64_t n = std::min<uint64_t>(_skip_left, left);
            used += n;
            _skip_left -= n;
            if (_skip_left != 0) {
                return {handshake_action::need_more, used};
            }
            reply_error(out, _option, k_rep_err_too_big, "option too long");
            _state = state::option_header;
            break;
        }
        case state::option_data: {
            if (left < _option_length) {
                return {handshake_action::need_more, used};
            }
            used += _option_length;
            _state = state::option_header;
            const handshake_step s = process_option(_option, {p, _option_length}, out);
            if (s.action != handshake_action::need_more) {
                return {s.action, used};
            }
            break;
        }
        case state::done:
            return {handshake_action::close, used};
        }
    }
}

handshake_step handshake::process_option(uint32_t option, std::span<const uint8_t> data,
                                         std::vector<uint8_t>& out)
{
    const handshake_step more{handshake_action::need_more, 0};
    if (_tls == tls_mode::require && !_tls_active && option != k_opt_starttls &&
        option != k_opt_abort) {
        if (option == k_opt_export_name) {
            // No way to send an error to NBD_OPT_EXPORT_NAME.
            return close("NBD_OPT_EXPORT_NAME before TLS, which the server requires", 0);
        }
        reply_error(out, option, k_rep_err_tls_reqd,
                    "TLS is required: send NBD_OPT_STARTTLS first");
        return more;
    }

    switch (option) {
    case k_opt_abort:
        reply(out, option, k_rep_ack);
        return close("client aborted the handshake", 0);

    case k_opt_starttls:
        if (!data.empty()) {
            reply_error(out, option, k_rep_err_invalid, "NBD_OPT_STARTTLS takes no data");
            return more;
        }
        if (_tls == tls_mode::off) {
            reply_error(out, option, k_rep_err_unsup, "TLS is not enabled on this server");
            return more;
        }
        if (_tls_active) {
            reply_error(out, option, k_rep_err_invalid, "TLS is already active");
            return more;
        }
        reply(out, option, k_rep_ack);
        // What was negotiated in clear text does not carry over.
        _structured = false;
        _base_allocation = false;
        _meta_export.clear();
        _state = state::option_header;
        return {handshake_action::start_tls, 0};

    case k_opt_list: {
        if (!data.empty()) {
            reply_error(out, option, k_rep_err_invalid, "NBD_OPT_LIST takes no data");
            return more;
        }
        for (const auto& e : _catalog.list()) {
            std::vector<uint8_t> d;
            put32(d, static_cast<uint32_t>(e->name.size()));
            put_text(d, e->name);
            put_text(d, e->description);
            reply(out, option, k_rep_server, d);
        }
        reply(out, option, k_rep_ack);
        return more;
    }

    case k_opt_export_name: {
        const std::string_view name(reinterpret_cast<const char*>(data.data()), data.size());
        auto e = _catalog.find(name);
        if (!e) {
            return close("NBD_OPT_EXPORT_NAME: no such export", 0);
        }
        const uint64_t size = e->current_size();
        put64(out, size);
        put16(out, transmission_flags(*e));
        if (!_no_zeroes) {
            out.insert(out.end(), 124, 0);
        }
        _result.exp = e;
        _result.size = size;
        _result.transmission_flags = transmission_flags(*e);
        _result.structured_replies = _structured;
        _result.base_allocation = _base_allocation && _meta_export == e->name;
        _state = state::done;
        return {handshake_action::transmission, 0};
    }

    case k_opt_info:
    case k_opt_go: {
        reader r{data};
        const uint32_t name_length = r.u32();
        const std::string_view name = r.text(name_length);
        const uint16_t count = r.u16();
        if (!r.ok || r.left() != size_t{count} * 2) {
            reply_error(out, option, k_rep_err_invalid, "malformed NBD_OPT_INFO/GO request");
            return more;
        }
        auto e = _catalog.find(name);
        if (!e) {
            reply_error(out, option, k_rep_err_unknown, "no such export");
            return more;
        }
        bool sent_name = false;
        bool sent_description = false;
        bool sent_block_size = false;
        for (uint16_t i = 0; i < count; ++i) {
            const uint16_t type = r.u16();
            if (type == k_info_name && !sent_name) {
                std::vector<uint8_t> d;
                put16(d, k_info_name);
                put_text(d, e->name);
                reply(out, option, k_rep_info, d);
                sent_name = true;
            } else if (type == k_info_description && !sent_description) {
                std::vector<uint8_t> d;
                put16(d, k_info_description);
                put_text(d, e->description);
                reply(out, option, k_rep_info, d);
                sent_description = true;
            } else if (type == k_info_block_size && !sent_block_size) {
                uint8_t b[14];
                store_be16(b, k_info_block_size);
                store_be32(b + 2, e->min_block);
                store_be32(b + 6, e->preferred_block);
                store_be32(b + 10, e->max_block);
                reply(out, option, k_rep_info, b);
                sent_block_size = true;
            }
            // Unknown information types are ignored, as the protocol says.
        }
        const uint64_t size = e->current_size();
        reply_info_export(out, option, *e, size);
        reply(out, option, k_rep_ack);
        if (option == k_opt_info) {
            return more;
        }
        _result.exp = e;
        _result.size = size;
        _result.transmission_flags = transmission_flags(*e);
        _result.structured_replies = _structured;
        _result.base_allocation = _base_allocation && _meta_export == e->name;
        _state = state::done;
        return {handshake_action::transmission, 0};
    }

    case k_opt_structured_reply:
        if (!data.empty()) {
            reply_error(out, option, k_rep_err_invalid, "NBD_OPT_STRUCTURED_REPLY takes no data");
            return more;
        }
        if (_structured) {
            reply_error(out, option, k_rep_err_invalid, "structured replies already negotiated");
            return more;
        }
        _structured = true;
        reply(out, option, k_rep_ack);
        return more;

    case k_opt_list_meta_context:
    case k_opt_set_meta_context:
        do_meta_context(option, data, out);
        return more;

    default:
        reply_error(out, option, k_rep_err_unsup, "option not supported");
        return more;
    }
}

bool handshake::do_meta_context(uint32_t option, std::span<const uint8_t> data,
                                std::vector<uint8_t>& out)
{
    const bool set = option == k_opt_set_meta_context;
    reader r{data};
    const uint32_t name_length = r.u32();
    const std::string_view name = r.text(name_length);
    const uint32_t count = r.u32();
    std::vector<std::string_view> queries;
    for (uint32_t i = 0; r.ok && i < count; ++i) {
        const uint32_t length = r.u32();
        queries.push_back(r.text(length));
    }
    if (!r.ok || r.left() != 0) {
        reply_error(out, option, k_rep_err_invalid, "malformed meta context request");
        return false;
    }
    if (set && !_structured) {
        reply_error(out, option, k_rep_err_invalid,
                    "NBD_OPT_SET_META_CONTEXT needs structured replies first");
        return false;
    }
    auto e = _catalog.find(name);
    if (!e) {
        reply_error(out, option, k_rep_err_unknown, "no such export");
        return false;
    }
    bool match = false;
    if (!set && queries.empty()) {
        match = true;  // list everything
    }
    for (std::string_view q : queries) {
        if (q == k_base_allocation || (!set && q == "base:")) {
            match = true;
        }
    }
    if (set) {
        _base_allocation = match;
        _meta_export = e->name;
    }
    if (match) {
        std::vector<uint8_t> d;
        put32(d, set ? k_base_allocation_id : 0);
        put_text(d, k_base_allocation);
        reply(out, option, k_rep_meta_context, d);
    }
    reply(out, option, k_rep_ack);
    return true;
}

// ---------------------------------------------------------------- requests

bool parse_request(const uint8_t* p, request_header& h)
{
    if (load_be32(p) != k_request_magic) {
        return false;
    }
    h.flags = load_be16(p + 4);
    h.type = load_be16(p + 6);
    h.cookie = load_be64(p + 8);
    h.offset = load_be64(p + 16);
    h.length = load_be32(p + 24);
    return true;
}

request_check check_request(const request_header& h, const negotiated& n)
{
    const export_details& e = *n.exp;
    constexpr uint16_t k_known_flags = k_cmd_flag_fua | k_cmd_flag_no_hole | k_cmd_flag_df |
                                       k_cmd_flag_req_one | k_cmd_flag_fast_zero;
    auto fail = [](uint32_t error, uint32_t payload = 0) {
        return request_check{request_disposition::error, error, payload};
    };
    const uint64_t mask = e.min_block - 1;
    const bool aligned = (h.offset & mask) == 0 && (h.length & mask) == 0;
    const bool in_range = h.offset <= n.size && h.length <= n.size - h.offset;
    uint16_t allowed = k_cmd_flag_fua;

    if ((h.flags & ~k_known_flags) != 0) {
        if (h.type == k_cmd_write) {
            if (h.length > e.max_block) {
                return {request_disposition::disconnect, k_einval, 0};
            }
            return fail(k_einval, h.length);
        }
        return fail(k_einval);
    }

    switch (h.type) {
    case k_cmd_read:
        if (n.structured_replies) {
            allowed |= k_cmd_flag_df;
        }
        if ((h.flags & ~allowed) != 0 || h.length == 0 || h.length > e.max_block || !aligned ||
            !in_range) {
            return fail(h.length > e.max_block ? k_eoverflow : k_einval);
        }
        return {};

    case k_cmd_write:
        if (h.length > e.max_block) {
            // The payload cannot be taken in: the only safe answer is to hang up.
            return {request_disposition::disconnect, k_einval, 0};
        }
        if ((h.flags & ~allowed) != 0 || h.length == 0 || !aligned) {
            return fail(k_einval, h.length);
        }
        if (e.read_only) {
            return fail(k_eperm, h.length);
        }
        if (!in_range) {
            return fail(k_enospc, h.length);
        }
        return {request_disposition::execute, 0, h.length};

    case k_cmd_disc:
        return {request_disposition::disconnect, 0, 0};

    case k_cmd_flush:
        if ((h.flags & ~allowed) != 0 || h.offset != 0 || h.length != 0) {
            return fail(k_einval);
        }
        return {};

    case k_cmd_trim:
        if ((h.flags & ~allowed) != 0 || !e.can_trim || h.length == 0 || !aligned) {
            return fail(k_einval);
        }
        if (e.read_only) {
            return fail(k_eperm);
        }
        if (!in_range) {
            return fail(k_einval);  // ENOSPC is for commands that write data
        }
        return {};

    case k_cmd_cache:
        if ((h.flags & ~allowed) != 0 || h.length == 0 || !aligned || !in_range) {
            return fail(k_einval);
        }
        return {};

    case k_cmd_write_zeroes:
        allowed |= k_cmd_flag_no_hole | k_cmd_flag_fast_zero;
        if ((h.flags & ~allowed) != 0 || h.length == 0 || !aligned) {
            return fail(k_einval);
        }
        if (e.read_only) {
            return fail(k_eperm);
        }
        if (!in_range) {
            return fail(k_enospc);
        }
        return {};

    case k_cmd_block_status:
        allowed |= k_cmd_flag_req_one;
        if ((h.flags & ~allowed) != 0 || !n.structured_replies || !n.base_allocation ||
            h.length == 0 || !aligned || !in_range) {
            return fail(k_einval);
        }
        return {};

    default:
        return fail(k_einval);
    }
}

// ---------------------------------------------------------------- replies

size_t encode_simple_reply(uint8_t* p, uint64_t cookie, uint32_t error)
{
    store_be32(p, k_simple_reply_magic);
    store_be32(p + 4, error);
    store_be64(p + 8, cookie);
    return k_simple_reply_size;
}

size_t encode_chunk_header(uint8_t* p, uint16_t flags, uint16_t type, uint64_t cookie,
                           uint32_t length)
{
    store_be32(p, k_structured_reply_magic);
    store_be16(p + 4, flags);
    store_be16(p + 6, type);
    store_be64(p + 8, cookie);
    store_be32(p + 16, length);
    return k_chunk_header_size;
}

size_t encode_read_chunk(uint8_t* p, uint64_t cookie, uint64_t offset, uint32_t length, bool done)
{
    encode_chunk_header(p, done ? k_reply_flag_done : 0, k_reply_type_offset_data, cookie,
                        8 + length);
    store_be64(p + k_chunk_header_size, offset);
    return k_read_chunk_size;
}

size_t encode_error_chunk(uint8_t* p, uint64_t cookie, uint32_t error)
{
    encode_chunk_header(p, k_reply_flag_done, k_reply_type_error, cookie, 6);
    store_be32(p + k_chunk_header_size, error);
    store_be16(p + k_chunk_header_size + 4, 0);
    return k_error_chunk_size;
}

void encode_block_status(std::vector<uint8_t>& out, uint64_t cookie, uint32_t context_id,
                         std::span<const status_extent> extents)
{
    const size_t at = out.size();
    out.resize(at + k_chunk_header_size + 4 + extents.size() * 8);
    uint8_t* p = out.data() + at;
    encode_chunk_header(p, k_reply_flag_done, k_reply_type_block_status, cookie,
                        static_cast<uint32_t>(4 + extents.size() * 8));
    p += k_chunk_header_size;
    store_be32(p, context_id);
    p += 4;
    for (const status_extent& x : extents) {
        store_be32(p, x.length);
        store_be32(p + 4, x.flags);
        p += 8;
    }
}

uint32_t nbd_error_from_errno(int negative_errno)
{
    switch (-negative_errno) {
    case EPERM:
    case EROFS:
    case EACCES:
        return k_eperm;
    case ENOMEM:
        return k_enomem;
    case EINVAL:
        return k_einval;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
        return k_enospc;
    case EOVERFLOW:
        return k_eoverflow;
    case EOPNOTSUPP:
        return k_enotsup;
    case ESHUTDOWN:
    case ENODEV:
        return k_eshutdown;
    default:
        return k_eio;
    }
}

const char* command_name(uint16_t type)
{
    switch (type) {
    case k_cmd_read:
        return "READ";
    case k_cmd_write:
        return "WRITE";
    case k_cmd_disc:
        return "DISC";
    case k_cmd_flush:
        return "FLUSH";
    case k_cmd_trim:
        return "TRIM";
    case k_cmd_cache:
        return "CACHE";
    case k_cmd_write_zeroes:
        return "WRITE_ZEROES";
    case k_cmd_block_status:
        return "BLOCK_STATUS";
    case k_cmd_resize:
        return "RESIZE";
    default:
        return "unknown";
    }
}

}  // namespace softblk::nbd
