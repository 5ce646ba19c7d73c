// The NBD codec fed with bytes: handshake options and their replies,
// request validation, reply encoding. No sockets, no device.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "codec.hpp"

using namespace softblk::nbd;

namespace {

class fake_catalog : public export_catalog {
public:
    fake_catalog()
    {
        add("d0", 64 << 20, false);
        add("ro", 1 << 20, true);
    }
    void add(const std::string& name, uint64_t size, bool ro)
    {
        auto e = std::make_shared<export_details>();
        e->name = name;
        e->description = "test " + name;
        e->size = size;
        e->read_only = ro;
        e->can_trim = true;
        e->can_multi_conn = true;
        _exports[name] = e;
    }
    std::shared_ptr<const export_details> find(std::string_view name) const override
    {
        auto it = _exports.find(std::string(name));
        return it == _exports.end() ? nullptr : it->second;
    }
    std::vector<std::shared_ptr<const export_details>> list() const override
    {
        std::vector<std::shared_ptr<const export_details>> v;
        for (const auto& [n, e] : _exports) {
            v.push_back(e);
        }
        return v;
    }

private:
    std::map<std::string, std::shared_ptr<export_details>> _exports;
};

struct bytes : std::vector<uint8_t> {
    bytes& u16(uint16_t v)
    {
        push_back(uint8_t(v >> 8));
        push_back(uint8_t(v));
        return *this;
    }
    bytes& u32(uint32_t v)
    {
        u16(uint16_t(v >> 16));
        return u16(uint16_t(v));
    }
    bytes& u64(uint64_t v)
    {
        u32(uint32_t(v >> 32));
        return u32(uint32_t(v));
    }
    bytes& str(std::string_view s)
    {
        insert(end(), s.begin(), s.end());
        return *this;
    }
    bytes& option(uint32_t opt, const bytes& data)
    {
        u64(k_ihaveopt).u32(opt).u32(uint32_t(data.size()));
        insert(end(), data.begin(), data.end());
        return *this;
    }
};

struct option_reply {
    uint32_t option;
    uint32_t type;
    std::vector<uint8_t> data;
};

// Splits handshake output (after the 18-byte greeting) into option replies.
std::vector<option_reply> replies(const std::vector<uint8_t>& out, size_t from)
{
    std::vector<option_reply> r;
    size_t p = from;
    while (p + 20 <= out.size()) {
        EXPECT_EQ(load_be64(&out[p]), k_option_reply_magic);
        option_reply x{load_be32(&out[p + 8]), load_be32(&out[p + 12]), {}};
        const uint32_t len = load_be32(&out[p + 16]);
        x.data.assign(out.begin() + long(p + 20), out.begin() + long(p + 20 + len));
        r.push_back(x);
        p += 20 + len;
    }
    EXPECT_EQ(p, out.size());
    return r;
}

struct session {
    fake_catalog catalog;
    handshake hs;
    std::vector<uint8_t> out;
    explicit session(tls_mode tls = tls_mode::off) : hs(catalog, tls)
    {
        hs.greet(out);
        out.clear();
    }
    handshake_step feed(const bytes& b)
    {
        out.clear();
        return hs.feed(b, out);
    }
};

bytes go(uint32_t opt, std::string_view name, std::vector<uint16_t> infos = {})
{
    bytes d;
    d.u32(uint32_t(name.size())).str(name).u16(uint16_t(infos.size()));
    for (uint16_t i : infos) {
        d.u16(i);
    }
    return d;
}

}  // namespace

TEST(nbd_handshake, greeting_is_fixed_newstyle)
{
    fake_catalog c;
    handshake hs(c, tls_mode::off);
    std::vector<uint8_t> out;
    hs.greet(out);
    ASSERT_EQ(out.size(), 18u);
    EXPECT_EQ(load_be64(&out[0]), k_nbd_magic);
    EXPECT_EQ(load_be64(&out[8]), k_ihaveopt);
    EXPECT_EQ(load_be16(&out[16]), k_flag_fixed_newstyle | k_flag_no_zeroes);
}

TEST(nbd_handshake, unknown_client_flags_close)
{
    session s;
    EXPECT_EQ(s.feed(bytes().u32(0x80000001)).action, handshake_action::close);
}

TEST(nbd_handshake, byte_at_a_time_go)
{
    session s;
    bytes all;
    all.u32(k_flag_c_fixed_newstyle | k_flag_c_no_zeroes);
    all.option(k_opt_structured_reply, {});
    all.option(k_opt_go, go(k_opt_go, "d0", {k_info_block_size, k_info_name, k_info_description}));
    std::vector<uint8_t> pending;
    handshake_step last{};
    for (uint8_t b : all) {
        pending.push_back(b);
        last = s.hs.feed(pending, s.out);
        pending.erase(pending.begin(), pending.begin() + long(last.consumed));
        if (last.action != handshake_action::need_more) {
            break;
        }
    }
    ASSERT_EQ(last.action, handshake_action::transmission);
    EXPECT_TRUE(pending.empty());
    auto r = replies(s.out, 0);
    ASSERT_EQ(r.size(), 6u);  // ACK, NAME, DESCRIPTION... order: as asked, then EXPORT, ACK
    EXPECT_EQ(r[0].type, k_rep_ack);
    EXPECT_EQ(r[1].type, k_rep_info);
    EXPECT_EQ(load_be16(r[1].data.data()), k_info_block_size);
    EXPECT_EQ(load_be32(&r[1].data[2]), 512u);
    EXPECT_EQ(load_be16(r[2].data.data()), k_info_name);
    EXPECT_EQ(std::string(r[2].data.begin() + 2, r[2].data.end()), "d0");
    EXPECT_EQ(load_be16(r[3].data.data()), k_info_description);
    EXPECT_EQ(load_be16(r[4].data.data()), k_info_export);
    EXPECT_EQ(load_be64(&r[4].data[2]), 64u << 20);
    const uint16_t flags = load_be16(&r[4].data[10]);
    EXPECT_TRUE(flags & k_tflag_send_df);
    EXPECT_TRUE(flags & k_tflag_can_multi_conn);
    EXPECT_FALSE(flags & k_tflag_read_only);
    EXPECT_EQ(r[5].type, k_rep_ack);
    EXPECT_TRUE(s.hs.result().structured_replies);
    EXPECT_EQ(s.hs.result().exp->name, "d0");
}

TEST(nbd_handshake, info_unknown_export_and_malformed)
{
    session s;
    s.feed(bytes().u32(k_flag_c_fixed_newstyle));
    EXPECT_EQ(s.feed(bytes().option(k_opt_info, go(k_opt_info, "nope"))).action,
              handshake_action::need_more);
    auto r = replies(s.out, 0);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].type, k_rep_err_unknown);
    // Name length beyond the option's data.
    bytes bad;
    bad.u32(1000).str("d0").u16(0);
    s.feed(bytes().option(k_opt_go, bad));
    r = replies(s.out, 0);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].type, k_rep_err_invalid);
}

TEST(nbd_handshake, list_and_unknown_option)
{
    session s;
    s.feed(bytes().u32(k_flag_c_fixed_newstyle));
    s.feed(bytes()
               .option(k_opt_list, {})
               .option(99, bytes().str("xyz"))
               .option(k_opt_extended_headers, {}));
    auto r = replies(s.out, 0);
    ASSERT_EQ(r.size(), 5u);
    EXPECT_EQ(r[0].type, k_rep_server);
    EXPECT_EQ(r[1].type, k_rep_server);
    EXPECT_EQ(r[2].type, k_rep_ack);
    EXPECT_EQ(r[3].type, k_rep_err_unsup);
    EXPECT_EQ(r[3].option, 99u);
    EXPECT_EQ(r[4].type, k_rep_err_unsup);
}

TEST(nbd_handshake, meta_context)
{
    session s;
    s.feed(bytes().u32(k_flag_c_fixed_newstyle));
    bytes q;
    q.u32(2).str("d0").u32(2).u32(15).str("base:allocation").u32(8).str("qemu:foo");
    // SET before structured replies: invalid.
    s.feed(bytes().option(k_opt_set_meta_context, q));
    EXPECT_EQ(replies(s.out, 0).at(0).type, k_rep_err_invalid);
    // LIST with no queries lists base:allocation.
    bytes all;
    all.u32(2).str("d0").u32(0);
    s.feed(bytes().option(k_opt_list_meta_context, all));
    auto r = replies(s.out, 0);
    ASSERT_EQ(r.size(), 2u);
    EXPECT_EQ(r[0].type, k_rep_meta_context);
    EXPECT_EQ(std::string(r[0].data.begin() + 4, r[0].data.end()), "base:allocation");
    s.feed(bytes().option(k_opt_structured_reply, {}).option(k_opt_set_meta_context, q));
    r = replies(s.out, 0);
    ASSERT_EQ(r.size(), 3u);
    EXPECT_EQ(r[1].type, k_rep_meta_context);
    EXPECT_EQ(load_be32(r[1].data.data()), k_base_allocation_id);
    EXPECT_EQ(r[2].type, k_rep_ack);
    EXPECT_EQ(s.feed(bytes().option(k_opt_go, go(k_opt_go, "d0"))).action,
              handshake_action::transmission);
    EXPECT_TRUE(s.hs.result().base_allocation);
}

TEST(nbd_handshake, meta_context_for_other_export_does_not_apply)
{
    session s;
    s.feed(bytes().u32(k_flag_c_fixed_newstyle));
    bytes q;
    q.u32(2).str("ro").u32(1).u32(15).str("base:allocation");
    s.feed(bytes().option(k_opt_structured_reply, {}).option(k_opt_set_meta_context, q));
    EXPECT_EQ(s.feed(bytes().option(k_opt_go, go(k_opt_go, "d0"))).action,
              handshake_action::transmission);
    EXPECT_FALSE(s.hs.result().base_allocation);
}

TEST(nbd_handshake, export_name_old_style)
{
    session s;
    s.feed(bytes().u32(k_flag_c_fixed_newstyle));
    EXPECT_EQ(s.feed(bytes().option(k_opt_export_name, bytes().str("ro"))).action,
              handshake_action::transmission);
    ASSERT_EQ(s.out.size(), 10u + 124u);  // no NO_ZEROES from this client
    EXPECT_EQ(load_be64(s.out.data()), 1u << 20);
    EXPECT_TRUE(load_be16(&s.out[8]) & k_tflag_read_only);
    session t;
    t.feed(bytes().u32(k_flag_c_fixed_newstyle));
    EXPECT_EQ(t.feed(bytes().option(k_opt_export_name, bytes().str("nope"))).action,
              handshake_action::close);
}

TEST(nbd_handshake, oversized_option_is_skipped)
{
    session s;
    s.feed(bytes().u32(k_flag_c_fixed_newstyle));
    bytes big;
    big.u64(k_ihaveopt).u32(k_opt_info).u32(k_max_option_length + 10);
    big.resize(big.size() + k_max_option_length + 10, 0xaa);
    big.option(k_opt_abort, {});
    const auto step = s.feed(big);
    EXPECT_EQ(step.action, handshake_action::close);
    auto r = replies(s.out, 0);
    ASSERT_EQ(r.size(), 2u);
    EXPECT_EQ(r[0].type, k_rep_err_too_big);
    EXPECT_EQ(r[1].type, k_rep_ack);
    EXPECT_EQ(r[1].option, uint32_t(k_opt_abort));
}

TEST(nbd_handshake, tls_require)
{
    session s(tls_mode::require);
    s.feed(bytes().u32(k_flag_c_fixed_newstyle));
    s.feed(bytes().option(k_opt_list, {}));
    EXPECT_EQ(replies(s.out, 0).at(0).type, k_rep_err_tls_reqd);
    s.feed(bytes().option(k_opt_go, go(k_opt_go, "d0")));
    EXPECT_EQ(replies(s.out, 0).at(0).type, k_rep_err_tls_reqd);
    EXPECT_EQ(s.feed(bytes().option(k_opt_starttls, {})).action, handshake_action::start_tls);
    EXPECT_EQ(replies(s.out, 0).at(0).type, k_rep_ack);
    s.hs.tls_established();
    EXPECT_EQ(s.feed(bytes().option(k_opt_starttls, {})).action, handshake_action::need_more);
    EXPECT_EQ(replies(s.out, 0).at(0).type, k_rep_err_invalid);
    EXPECT_EQ(s.feed(bytes().option(k_opt_go, go(k_opt_go, "d0"))).action,
              handshake_action::transmission);

    session e(tls_mode::require);
    e.feed(bytes().u32(k_flag_c_fixed_newstyle));
    EXPECT_EQ(e.feed(bytes().option(k_opt_export_name, bytes().str("d0"))).action,
              handshake_action::close);

    session off(tls_mode::off);
    off.feed(bytes().u32(k_flag_c_fixed_newstyle));
    off.feed(bytes().option(k_opt_starttls, {}));
    EXPECT_EQ(replies(off.out, 0).at(0).type, k_rep_err_unsup);
}

TEST(nbd_handshake, bad_option_magic_closes)
{
    session s;
    s.feed(bytes().u32(k_flag_c_fixed_newstyle));
    EXPECT_EQ(s.feed(bytes().u64(0x1234).u32(1).u32(0)).action, handshake_action::close);
}

// ---------------------------------------------------------------- requests

namespace {

negotiated params(bool ro = false, bool structured = true, bool meta = true)
{
    auto e = std::make_shared<export_details>();
    e->name = "d0";
    e->size = 1 << 20;
    e->read_only = ro;
    e->can_trim = true;
    return negotiated{e, 0, structured, meta, e->size};
}

request_header req(uint16_t type, uint64_t offset, uint32_t length, uint16_t flags = 0)
{
    uint8_t b[28];
    store_be32(b, k_request_magic);
    store_be16(b + 4, flags);
    store_be16(b + 6, type);
    store_be64(b + 8, 0xc00c1e);
    store_be64(b + 16, offset);
    store_be32(b + 24, length);
    request_header h;
    EXPECT_TRUE(parse_request(b, h));
    EXPECT_EQ(h.cookie, 0xc00c1eu);
    return h;
}

}  // namespace

TEST(nbd_requests, bad_magic)
{
    uint8_t b[28] = {};
    request_header h;
    EXPECT_FALSE(parse_request(b, h));
}

TEST(nbd_requests, validation)
{
    const auto n = params();
    EXPECT_EQ(check_request(req(k_cmd_read, 0, 4096), n).disposition, request_disposition::execute);
    EXPECT_EQ(check_request(req(k_cmd_read, 0, 4096, k_cmd_flag_df), n).disposition,
              request_disposition::execute);
    EXPECT_EQ(check_request(req(k_cmd_read, 1 << 20, 512), n).error, k_einval);  // past the end
    EXPECT_EQ(check_request(req(k_cmd_read, UINT64_MAX - 511, 512), n).error, k_einval);  // wraps
    EXPECT_EQ(check_request(req(k_cmd_read, 100, 512), n).error, k_einval);  // misaligned
    EXPECT_EQ(check_request(req(k_cmd_read, 0, 0), n).error, k_einval);
    EXPECT_EQ(check_request(req(k_cmd_read, 0, 512, k_cmd_flag_no_hole), n).error, k_einval);
    EXPECT_EQ(check_request(req(k_cmd_read, 0, 512, 1u << 9), n).error, k_einval);  // unknown flag
    const auto w = check_request(req(k_cmd_write, (1 << 20) - 512, 1024), n);
    EXPECT_EQ(w.error, k_enospc);
    EXPECT_EQ(w.payload, 1024u);  // still consumed
    EXPECT_EQ(check_request(req(k_cmd_write, 0, 64u << 20), n).disposition,
              request_disposition::disconnect);
    EXPECT_EQ(check_request(
                  req(k_cmd_write_zeroes, 0, 4096, k_cmd_flag_no_hole | k_cmd_flag_fast_zero), n)
                  .disposition,
              request_disposition::execute);
    EXPECT_EQ(check_request(req(k_cmd_trim, 0, 4096, k_cmd_flag_fua), n).disposition,
              request_disposition::execute);
    EXPECT_EQ(check_request(req(k_cmd_flush, 0, 0), n).disposition, request_disposition::execute);
    EXPECT_EQ(check_request(req(k_cmd_flush, 0, 512), n).error, k_einval);
    EXPECT_EQ(check_request(req(k_cmd_cache, 0, 4096), n).disposition,
              request_disposition::execute);
    EXPECT_EQ(check_request(req(k_cmd_block_status, 0, 1 << 20, k_cmd_flag_req_one), n).disposition,
              request_disposition::execute);
    EXPECT_EQ(check_request(req(k_cmd_disc, 0, 0), n).disposition, request_disposition::disconnect);
    EXPECT_EQ(check_request(req(k_cmd_resize, 0, 0), n).error, k_einval);
    EXPECT_EQ(check_request(req(77, 0, 0), n).error, k_einval);
}

TEST(nbd_requests, read_only_and_simple_replies)
{
    const auto ro = params(true, false, false);
    const auto w = check_request(req(k_cmd_write, 0, 4096), ro);
    EXPECT_EQ(w.error, k_eperm);
    EXPECT_EQ(w.payload, 4096u);
    EXPECT_EQ(check_request(req(k_cmd_trim, 0, 4096), ro).error, k_eperm);
    EXPECT_EQ(check_request(req(k_cmd_write_zeroes, 0, 4096), ro).error, k_eperm);
    EXPECT_EQ(check_request(req(k_cmd_read, 0, 512, k_cmd_flag_df), ro).error,
              k_einval);  // DF needs structured
    EXPECT_EQ(check_request(req(k_cmd_block_status, 0, 512), ro).error, k_einval);  // no context
}

TEST(nbd_replies, encoding)
{
    uint8_t b[64];
    ASSERT_EQ(encode_simple_reply(b, 7, k_eio), 16u);
    EXPECT_EQ(load_be32(b), k_simple_reply_magic);
    EXPECT_EQ(load_be32(b + 4), k_eio);
    EXPECT_EQ(load_be64(b + 8), 7u);
    ASSERT_EQ(encode_read_chunk(b, 9, 4096, 512, true), k_read_chunk_size);
    EXPECT_EQ(load_be32(b), k_structured_reply_magic);
    EXPECT_EQ(load_be16(b + 4), k_reply_flag_done);
    EXPECT_EQ(load_be16(b + 6), k_reply_type_offset_data);
    EXPECT_EQ(load_be32(b + 16), 8u + 512u);
    EXPECT_EQ(load_be64(b + 20), 4096u);
    ASSERT_EQ(encode_error_chunk(b, 9, k_enospc), k_error_chunk_size);
    EXPECT_EQ(load_be16(b + 6), k_reply_type_error);
    EXPECT_EQ(load_be32(b + 20), k_enospc);
    std::vector<uint8_t> out;
    const status_extent x[] = {{4096, 0}, {8192, k_state_hole | k_state_zero}};
    encode_block_status(out, 5, k_base_allocation_id, x);
    ASSERT_EQ(out.size(), 20u + 4u + 16u);
    EXPECT_EQ(load_be16(&out[6]), k_reply_type_block_status);
    EXPECT_EQ(load_be32(&out[20]), k_base_allocation_id);
    EXPECT_EQ(load_be32(&out[32]), 8192u);
    EXPECT_EQ(load_be32(&out[36]), 3u);
    EXPECT_EQ(nbd_error_from_errno(-EROFS), k_eperm);
    EXPECT_EQ(nbd_error_from_errno(-EOPNOTSUPP), k_enotsup);
    EXPECT_EQ(nbd_error_from_errno(-ETIMEDOUT), k_eio);
}
