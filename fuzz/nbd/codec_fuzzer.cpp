// libFuzzer target for the NBD codec: the input is a client's byte stream,
// cut into pieces at points the input chooses. The handshake state machine
// gets it first (with TLS off, on or required); once in transmission the
// rest is parsed as requests, validated, and answered with the encoders,
// as the server does. Nothing may crash, read out of bounds or loop.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "codec.hpp"

using namespace softblk::nbd;

namespace {

class catalog : public export_catalog {
public:
    catalog()
    {
        for (const char* name : {"d0", "ro", ""}) {
            auto e = std::make_shared<export_details>();
            e->name = name;
            e->description = "fuzz";
            e->size = std::string(name) == "ro" ? 1u << 20 : 64u << 20;
            e->read_only = std::string(name) == "ro";
            e->can_trim = true;
            _exports[name] = e;
        }
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
    if (size < 2) {
        return 0;
    }
    static const catalog cat;
    const auto tls = static_cast<tls_mode>(data[0] % 3);
    const size_t piece = 1 + data[1] % 64;  // bytes delivered per "recv"
    data += 2;
    size -= 2;

    handshake hs(cat, tls);
    std::vector<uint8_t> out;
    hs.greet(out);
    std::vector<uint8_t> pending;
    size_t pos = 0;
    bool transmission = false;
    while (pos < size) {
        const size_t n = std::min(piece, size - pos);
        pending.insert(pending.end(), data + pos, data + pos + n);
        pos += n;
        const handshake_step step = hs.feed(pending, out);
        if (step.consumed > pending.size()) {
            __builtin_trap();
        }
        pending.erase(pending.begin(), pending.begin() + static_cast<long>(step.consumed));
        if (step.action == handshake_action::close) {
            return 0;
        }
        if (step.action == handshake_action::start_tls) {
            hs.tls_established();  // as if the TLS handshake succeeded
        }
        if (step.action == handshake_action::transmission) {
            transmission = true;
            break;
        }
        if (out.size() > (16u << 20)) {
            out.clear();
        }
    }
    if (!transmission) {
        return 0;
    }
    const negotiated& n = hs.result();
    pending.insert(pending.end(), data + pos, data + size);
    size_t p = 0;
    uint8_t reply[64];
    while (pending.size() - p >= k_request_size) {
        request_header h;
        if (!parse_request(pending.data() + p, h)) {
            return 0;  // the server hangs up
        }
        p += k_request_size;
        const request_check c = check_request(h, n);
        if (c.disposition == request_disposition::disconnect) {
            return 0;
        }
        if (c.disposition == request_disposition::execute) {
            // What the server relies on before touching the device.
            const export_details& e = *n.exp;
            if (h.type != k_cmd_flush &&
                (h.offset > e.size || h.length > e.size - h.offset || h.length == 0 ||
                 (h.type == k_cmd_read || h.type == k_cmd_write) && h.length > e.max_block)) {
                __builtin_trap();
            }
            if ((h.type == k_cmd_write || h.type == k_cmd_trim || h.type == k_cmd_write_zeroes) &&
                e.read_only) {
                __builtin_trap();
            }
        }
        const size_t skip = std::min<size_t>(c.payload, pending.size() - p);
        p += skip;
        if (n.structured_replies && h.type == k_cmd_read) {
            encode_read_chunk(reply, h.cookie, h.offset, h.length, true);
        } else if (c.disposition == request_disposition::error) {
            encode_error_chunk(reply, h.cookie, c.error);
        } else {
            encode_simple_reply(reply, h.cookie, c.error);
        }
        if (h.type == k_cmd_block_status && c.disposition == request_disposition::execute) {
            std::vector<uint8_t> bs;
            const status_extent x[] = {{h.length / 2, 0},
                                       {h.length - h.length / 2, k_state_hole | k_state_zero}};
            encode_block_status(bs, h.cookie, k_base_allocation_id, x);
        }
    }
    return 0;
}
