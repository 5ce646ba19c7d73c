// libFuzzer target for the NBD handshake (option negotiation) alone. The
// input describes the server's exports (how many, their names, sizes, block
// sizes, read-only/trim flags), the TLS mode and how the client's bytes are
// cut, then the client's byte stream. Unlike codec_fuzzer, which mostly
// wants to reach transmission, this one checks what the server says back
// after every piece: the greeting, then only well-formed option replies
// (magic, a type the protocol has, a length that matches the data, INFO
// and LIST and META_CONTEXT payloads of the right shape, each reply for an
// option the client sent), nothing but TLS_REQD before STARTTLS when TLS is
// required, and on reaching transmission an export that exists with flags
// that match it.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "codec.hpp"

using namespace softblk::nbd;

namespace {

// A broken promise: say which (for the crash report), then crash.
#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (!(cond)) {                                                              \
            std::fprintf(stderr, "handshake_fuzzer.cpp:%d: %s\n", __LINE__, #cond); \
            __builtin_trap();                                                       \
        }                                                                           \
    } while (0)

uint16_t be16(const uint8_t* p)
{
    return static_cast<uint16_t>(p[0] << 8 | p[1]);
}

uint32_t be32(const uint8_t* p)
{
    return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3];
}

uint64_t be64(const uint8_t* p)
{
    return uint64_t{be32(p)} << 32 | be32(p + 4);
}

// Reads the fuzzer's input front to back; past the end it yields zeros.
struct reader {
    const uint8_t* p;
    size_t left;
    uint8_t byte()
    {
        if (left == 0) {
            return 0;
        }
        --left;
        return *p++;
    }
};

class catalog : public export_catalog {
public:
    std::shared_ptr<const export_details> find(std::string_view name) const override
    {
        if (name.empty()) {
            return exports.size() == 1 ? exports.begin()->second : nullptr;
        }
        auto it = exports.find(std::string(name));
        return it == exports.end() ? nullptr : it->second;
    }
    std::vector<std::shared_ptr<const export_details>> list() const override
    {
        std::vector<std::shared_ptr<const export_details>> v;
        for (const auto& [n, e] : exports) {
            v.push_back(e);
        }
        return v;
    }
    std::map<std::string, std::shared_ptr<export_details>> exports;
};

// Mirrors the client's stream: which options it has sent whole headers of.
struct client_mirror {
    std::vector<uint8_t> bytes;
    size_t pos = 0;
    bool flags_done = false;
    uint64_t skip = 0;
    std::set<uint32_t> options;
    uint32_t last = 0;
    bool done = false;
    bool no_zeroes() const { return bytes.size() >= 4 && (bytes[3] & k_flag_c_no_zeroes) != 0; }
    void add(const uint8_t* p, size_t n)
    {
        if (done) {
            return;
        }
        bytes.insert(bytes.end(), p, p + n);
        for (;;) {
            if (!flags_done) {
                if (bytes.size() - pos < 4) {
                    return;
                }
                pos += 4;
                flags_done = true;
            }
            if (skip != 0) {
                const uint64_t n2 = std::min<uint64_t>(skip, bytes.size() - pos);
                pos += n2;
                skip -= n2;
                if (skip != 0) {
                    return;
                }
            }
            if (bytes.size() - pos < 16) {
                return;
            }
            last = be32(&bytes[pos + 8]);
            options.insert(last);
            skip = be32(&bytes[pos + 12]);
            pos += 16;
            if (last == k_opt_export_name) {
                done = true;  // what follows is transmission
                return;
            }
        }
    }
};

bool known_reply_type(uint32_t t)
{
    if ((t & k_rep_flag_error) != 0) {
        const uint32_t e = t & ~k_rep_flag_error;
        return e >= 1 && e <= 9;
    }
    return t == k_rep_ack || t == k_rep_server || t == k_rep_info || t == k_rep_meta_context;
}

// Checks the option replies in out[from, end) and returns where the last
// complete one ends. Replies are never split across feed calls.
size_t check_replies(const std::vector<uint8_t>& out, size_t from, size_t end,
                     const client_mirror& client, const catalog& cat, bool tls_required)
{
    size_t p = from;
    while (end - p >= 20) {
        const uint8_t* r = &out[p];
        CHECK(be64(r) == k_option_reply_magic);
        const uint32_t option = be32(r + 8);
        const uint32_t type = be32(r + 12);
        const uint32_t len = be32(r + 16);
        CHECK(client.options.count(option) != 0);
        CHECK(known_reply_type(type));
        CHECK(end - p - 20 >= len);  // the whole reply was written
        const uint8_t* d = r + 20;
        if (tls_required && option != k_opt_starttls && option != k_opt_abort) {
            CHECK(type == k_rep_err_tls_reqd);
        }
        if ((type & k_rep_flag_error) == 0 && option == k_opt_starttls) {
            CHECK(type == k_rep_ack && len == 0);
        }
        if (type == k_rep_info) {
            CHECK(len >= 2);
            const uint16_t info = be16(d);
            if (info == k_info_export) {
                CHECK(len == 12);
                CHECK((be16(d + 10) & k_tflag_has_flags) != 0);
            } else if (info == k_info_block_size) {
                CHECK(len == 14);
                const uint32_t min = be32(d + 2);
                const uint32_t pref = be32(d + 6);
                const uint32_t max = be32(d + 10);
                CHECK(min != 0 && (min & (min - 1)) == 0 && min <= pref && pref <= max);
            } else {
                CHECK(info == k_info_name || info == k_info_description);
            }
        } else if (type == k_rep_server) {
            CHECK(option == k_opt_list && len >= 4);
            const uint32_t name_len = be32(d);
            CHECK(name_len <= len - 4);
            const std::string name(reinterpret_cast<const char*>(d + 4), name_len);
            CHECK(cat.exports.count(name) != 0);
        } else if (type == k_rep_meta_context) {
            CHECK(option == k_opt_set_meta_context || option == k_opt_list_meta_context);
            CHECK(len > 4);
            CHECK(std::string_view(reinterpret_cast<const char*>(d + 4), len - 4) ==
                  k_base_allocation);
        }
        p += 20 + len;
    }
    return p;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    reader in{data, size};
    catalog cat;
    const unsigned count = in.byte() % 4;
    for (unsigned i = 0; i < count; ++i) {
        auto e = std::make_shared<export_details>();
        const unsigned name_len = in.byte() % 24;
        for (unsigned k = 0; k < name_len; ++k) {
            e->name.push_back(static_cast<char>(in.byte()));
        }
        const uint8_t bits = in.byte();
        static constexpr uint32_t k_blocks[] = {1, 512, 4096, 65536};
        e->min_block = k_blocks[bits & 3];
        e->preferred_block = std::max<uint32_t>(e->min_block, 4096);
        e->read_only = (bits & 4) != 0;
        e->can_trim = (bits & 8) != 0;
        e->rotational = (bits & 16) != 0;
        e->can_multi_conn = (bits & 32) != 0;
        e->size = uint64_t{in.byte()} << (in.byte() % 48);
        e->description = std::string(in.byte() % 8, 'd');
        cat.exports[e->name] = e;
    }
    const auto tls = static_cast<tls_mode>(in.byte() % 3);
    const size_t piece = 1 + in.byte() % 32;

    handshake hs(cat, tls);
    std::vector<uint8_t> out;
    hs.greet(out);
    CHECK(out.size() == 18 && be64(out.data()) == k_nbd_magic &&
          be64(out.data() + 8) == k_ihaveopt);
    size_t checked = 18;
    client_mirror client;
    std::vector<uint8_t> pending;
    bool tls_active = false;
    while (in.left > 0) {
        const size_t n = std::min(piece, in.left);
        pending.insert(pending.end(), in.p, in.p + n);
        client.add(in.p, n);
        in.p += n;
        in.left -= n;
        const bool tls_required = tls == tls_mode::require && !tls_active;
        const handshake_step step = hs.feed(pending, out);
        CHECK(step.consumed <= pending.size());
        pending.erase(pending.begin(), pending.begin() + static_cast<long>(step.consumed));
        if (step.action == handshake_action::transmission && client.last == k_opt_export_name) {
            // EXPORT_NAME's answer: size, flags and (without NO_ZEROES) 124 zeros.
            const size_t tail = client.no_zeroes() ? 10 : 134;
            CHECK(out.size() - checked >= tail);
            const size_t end = out.size() - tail;
            CHECK(check_replies(out, checked, end, client, cat, tls_required) == end);
            CHECK(be64(&out[end]) == hs.result().exp->size);
        } else {
            checked = check_replies(out, checked, out.size(), client, cat, tls_required);
            if (step.action != handshake_action::close) {
                CHECK(checked == out.size());  // nothing half-written
            }
        }
        if (step.action == handshake_action::close) {
            return 0;
        }
        if (step.action == handshake_action::start_tls) {
            CHECK(tls != tls_mode::off && !tls_active);
            hs.tls_established();  // as if the TLS handshake succeeded
            tls_active = true;
        }
        if (step.action == handshake_action::transmission) {
            CHECK(!tls_required);
            const negotiated& r = hs.result();
            CHECK(r.exp != nullptr);
            CHECK(cat.exports.count(r.exp->name) != 0);
            CHECK((r.transmission_flags & k_tflag_has_flags) != 0);
            CHECK(((r.transmission_flags & k_tflag_read_only) != 0) == r.exp->read_only);
            if (!r.exp->can_trim || r.exp->read_only) {
                CHECK((r.transmission_flags & k_tflag_send_trim) == 0);
            }
            return 0;
        }
        if (out.size() > (4u << 20)) {
            out.clear();  // all of it was checked
            checked = 0;
        }
    }
    return 0;
}
