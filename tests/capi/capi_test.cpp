// libsoftblk's C ABI (include/softblk.h) as a C program sees it: this test
// links only the shared library and calls only softblk_* functions (and the
// header-only softblk.hpp over them). Error paths first: each must fail
// with the documented errno and a message that says what to change.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <softblk.h>
#include <softblk.hpp>

namespace {

using ::testing::HasSubstr;

constexpr uint32_t k_block = 4096;

std::string last_message()
{
    return softblk_get_error_msg();
}

// A device destroyed with the test.
struct device_guard {
    softblk_device* dev = nullptr;
    ~device_guard() { softblk_destroy(&dev); }
};

softblk_device* make(device_guard& g, const char* type, const char* options)
{
    const int rc = softblk_create("capi0", type, options, &g.dev);
    EXPECT_EQ(rc, 0) << last_message();
    return g.dev;
}

softblk_queue* queue_of(softblk_device* dev, unsigned index = 0)
{
    softblk_queue* q = nullptr;
    EXPECT_EQ(softblk_get_queue(dev, index, &q), 0) << last_message();
    return q;
}

// Waits for one completion of `q`.
softblk_completion reap_one(softblk_queue* q)
{
    softblk_completion c{};
    EXPECT_EQ(softblk_queue_do_io(q, &c, 1, 1, -1), 1) << last_message();
    return c;
}

TEST(capi, version_matches_the_header)
{
    EXPECT_EQ(softblk_version(), SOFTBLK_VERSION);
    EXPECT_STREQ(softblk_get_error_msg(), "");
}

TEST(capi, unknown_option_names_it)
{
    softblk_device* dev = nullptr;
    EXPECT_EQ(softblk_create("capi0", "null", "memory_backed=1 sizee=16", &dev), -ENOENT);
    EXPECT_EQ(dev, nullptr);
    EXPECT_THAT(last_message(), HasSubstr("sizee"));
}

TEST(capi, malformed_and_out_of_range_values_name_the_option)
{
    softblk_device* dev = nullptr;
    EXPECT_EQ(softblk_create("capi0", "null", "size=lots", &dev), -EINVAL);
    EXPECT_THAT(last_message(), HasSubstr("size"));
    EXPECT_EQ(softblk_create("capi0", "null", "hw_queue_depth=0", &dev), -EINVAL);
    EXPECT_THAT(last_message(), HasSubstr("hw_queue_depth"));
    EXPECT_EQ(dev, nullptr);
}

TEST(capi, unknown_target_type_lists_the_known_ones)
{
    softblk_device* dev = nullptr;
    EXPECT_EQ(softblk_create("capi0", "nul", "", &dev), -ENOENT);
    EXPECT_THAT(last_message(), HasSubstr("nul: unknown target type"));
    EXPECT_THAT(last_message(), HasSubstr("null"));
    char types[256];
    ASSERT_GT(softblk_get_target_types(types, sizeof(types)), 0);
    EXPECT_THAT(std::string(types), HasSubstr("zloop-ram"));
}

TEST(capi, bad_name_and_null_arguments_fail_cleanly)
{
    softblk_device* dev = nullptr;
    EXPECT_EQ(softblk_create("a/b", "null", nullptr, &dev), -EINVAL);
    EXPECT_THAT(last_message(), HasSubstr("a device name is"));
    EXPECT_EQ(softblk_create(nullptr, "null", nullptr, &dev), -EINVAL);
    EXPECT_EQ(softblk_create("capi0", "null", nullptr, nullptr), -EINVAL);
    const char* args[] = {"size=16", nullptr};
    EXPECT_EQ(softblk_create_argv("capi0", "null", args, 2, &dev), -EINVAL);
    EXPECT_THAT(last_message(), HasSubstr("option 1 is NULL"));
    softblk_destroy(nullptr);
    softblk_destroy(&dev);
}

TEST(capi, options_as_an_array_keep_white_space_in_values)
{
    // A value with a space cannot go through the string form; the array
    // form passes it to the option parser as it is (which refuses it here:
    // the point is that the message shows the whole value).
    const char* args[] = {"memory_backed=1", "size=16 MiB"};
    softblk_device* dev = nullptr;
    EXPECT_EQ(softblk_create_argv("capi0", "null", args, 2, &dev), -EINVAL);
    EXPECT_THAT(last_message(), HasSubstr("size"));
}

TEST(capi, properties_and_options)
{
    device_guard g;
    softblk_device* dev = make(g, "null", "memory_backed=1 size=16 bs=4096 submit_queues=2");
    ASSERT_NE(dev, nullptr);
    uint64_t v = 0;
    ASSERT_EQ(softblk_get_uint64(dev, "capacity", &v), 0);
    EXPECT_EQ(v, 16u << 20);
    ASSERT_EQ(softblk_get_uint64(dev, "logical_block_size", &v), 0);
    EXPECT_EQ(v, k_block);
    ASSERT_EQ(softblk_get_uint64(dev, "num_queues", &v), 0);
    EXPECT_EQ(v, 3u);  // two submit queues and null_blk's one poll queue
    bool b = true;
    ASSERT_EQ(softblk_get_bool(dev, "zoned", &b), 0);
    EXPECT_FALSE(b);
    ASSERT_EQ(softblk_get_bool(dev, "powered", &b), 0);
    EXPECT_TRUE(b);
    EXPECT_EQ(softblk_get_uint64(dev, "size", &v), -ENOENT);
    EXPECT_THAT(last_message(), HasSubstr("known: capacity"));

    char text[8];
    EXPECT_EQ(softblk_get_option(dev, "size", text, sizeof(text)), 2);
    EXPECT_STREQ(text, "16");
    // Cut to the buffer, the whole length returned (snprintf's rule).
    EXPECT_EQ(softblk_get_str(dev, "name", text, 3), 5);
    EXPECT_STREQ(text, "ca");
    EXPECT_EQ(softblk_get_option(dev, "nosuch", text, sizeof(text)), -ENOENT);

    // A powered-off-only option while powered on: configfs' EBUSY.
    EXPECT_EQ(softblk_set_option(dev, "size", "32"), -EBUSY);
    ASSERT_EQ(softblk_stop(dev), 0) << last_message();
    softblk_queue* q = nullptr;
    EXPECT_EQ(softblk_get_queue(dev, 0, &q), -ENODEV);
    EXPECT_THAT(last_message(), HasSubstr("powered off"));
    ASSERT_EQ(softblk_set_option(dev, "size", "32"), 0) << last_message();
    ASSERT_EQ(softblk_start(dev), 0) << last_message();
    ASSERT_EQ(softblk_get_uint64(dev, "capacity", &v), 0);
    EXPECT_EQ(v, 32u << 20);
    EXPECT_EQ(softblk_get_queue(dev, 3, &q), -EINVAL);
    EXPECT_THAT(last_message(), HasSubstr("the device has 3 queues"));
}

TEST(capi, writes_read_back_on_every_queue)
{
    device_guard g;
    softblk_device* dev = make(g, "null", "memory_backed=1 size=16 submit_queues=2 irqmode=1");
    ASSERT_NE(dev, nullptr);
    for (unsigned qi = 0; qi < 3; ++qi) {
        softblk_queue* q = queue_of(dev, qi);
        ASSERT_NE(q, nullptr);
        // 192 KiB: more than one piece for a device whose max_transfer is
        // smaller; the library hands the core one bio.
        std::vector<unsigned char> out(48 * k_block);
        std::vector<unsigned char> in(out.size());
        for (size_t i = 0; i < out.size(); ++i) {
            out[i] = static_cast<unsigned char>(i * 31 + qi);
        }
        const uint64_t at = uint64_t{qi} * out.size();
        ASSERT_EQ(softblk_queue_write(q, at, out.data(), out.size(), &out, SOFTBLK_REQ_FUA), 0);
        ASSERT_EQ(softblk_queue_flush(q, &in, 0), 0);
        softblk_completion c[2];
        ASSERT_EQ(softblk_queue_do_io(q, c, 2, 2, -1), 2) << last_message();
        for (const auto& one : c) {
            EXPECT_EQ(one.ret, 0) << one.error_msg;
            EXPECT_EQ(one.error_msg, nullptr);
        }
        EXPECT_EQ(c[0].user_data, &out);
        EXPECT_EQ(c[0].transferred, out.size());
        ASSERT_EQ(softblk_queue_read(q, at, in.data(), in.size(), nullptr, 0), 0);
        EXPECT_EQ(reap_one(q).ret, 0);
        EXPECT_EQ(in, out);
        EXPECT_EQ(softblk_queue_in_flight(q), 0u);
    }
}

TEST(capi, queues_on_threads_of_their_own)
{
    // Each queue is driven by one thread; two threads on two queues share
    // nothing in the library (the error message is per thread too).
    device_guard g;
    softblk_device* dev = make(g, "null", "memory_backed=1 size=16 submit_queues=2 irqmode=1");
    ASSERT_NE(dev, nullptr);
    softblk_queue* queues[2] = {queue_of(dev, 0), queue_of(dev, 1)};
    ASSERT_NE(queues[0], nullptr);
    ASSERT_NE(queues[1], nullptr);
    int failures[2] = {0, 0};
    auto drive = [&](unsigned t) {
        softblk_queue* q = queues[t];
        std::vector<unsigned char> out(4 * k_block);
        std::vector<unsigned char> in(out.size());
        softblk_completion c[4];
        for (unsigned round = 0; round < 200; ++round) {
            const uint64_t at = (t * 256 + round % 256) * 4 * uint64_t{k_block};
            for (size_t i = 0; i < out.size(); ++i) {
                out[i] = static_cast<unsigned char>(i + round * 7 + t);
            }
            for (unsigned i = 0; i < 4; ++i) {
                failures[t] += softblk_queue_write(q, at + i * k_block, &out[i * k_block], k_block,
                                                   nullptr, 0) != 0;
            }
            failures[t] += softblk_queue_do_io(q, c, 4, 4, -1) != 4;
            for (const auto& one : c) {
                failures[t] += one.ret != 0;
            }
            failures[t] += softblk_queue_read(q, at, in.data(), in.size(), nullptr, 0) != 0;
            failures[t] += softblk_queue_do_io(q, c, 1, 1, -1) != 1 || c[0].ret != 0;
            failures[t] += in != out;
        }
    };
    std::thread other(drive, 1u);
    drive(0);
    other.join();
    EXPECT_EQ(failures[0], 0);
    EXPECT_EQ(failures[1], 0);
}

TEST(capi, write_zeroes_and_discard)
{
    device_guard g;
    softblk_device* dev = make(g, "null", "memory_backed=1 size=16 discard=1");
    softblk_queue* q = queue_of(dev);
    ASSERT_NE(q, nullptr);
    std::vector<unsigned char> buf(4 * k_block, 0xab);
    ASSERT_EQ(softblk_queue_write(q, 0, buf.data(), buf.size(), nullptr, 0), 0);
    EXPECT_EQ(reap_one(q).ret, 0);
    ASSERT_EQ(softblk_queue_write_zeroes(q, k_block, k_block, nullptr, SOFTBLK_REQ_NO_UNMAP), 0);
    EXPECT_EQ(reap_one(q).ret, 0);
    ASSERT_EQ(softblk_queue_discard(q, 2 * k_block, k_block, nullptr, 0), 0);
    EXPECT_EQ(reap_one(q).ret, 0) << last_message();
    ASSERT_EQ(softblk_queue_read(q, 0, buf.data(), buf.size(), nullptr, 0), 0);
    EXPECT_EQ(reap_one(q).ret, 0);
    EXPECT_EQ(buf[0], 0xab);
    EXPECT_EQ(buf[k_block], 0);
    EXPECT_EQ(buf[2 * k_block], 0);
    EXPECT_EQ(buf[3 * k_block], 0xab);
}

TEST(capi, request_beyond_the_end_says_so)
{
    device_guard g;
    softblk_device* dev = make(g, "null", "memory_backed=1 size=16");
    softblk_queue* q = queue_of(dev);
    ASSERT_NE(q, nullptr);
    std::vector<unsigned char> buf(2 * k_block);
    // Starts inside, ends outside: the whole request is refused.
    ASSERT_EQ(softblk_queue_write(q, (16u << 20) - k_block, buf.data(), buf.size(), &buf, 0), 0);
    const softblk_completion c = reap_one(q);
    EXPECT_LT(c.ret, 0);
    EXPECT_EQ(c.user_data, &buf);
    ASSERT_NE(c.error_msg, nullptr);
    EXPECT_THAT(std::string(c.error_msg), HasSubstr("beyond the end of the device (16777216"));
    EXPECT_THAT(std::string(c.error_msg), HasSubstr("write of 8192 bytes at 16773120"));
}

TEST(capi, misaligned_request_names_the_block_size)
{
    device_guard g;
    softblk_device* dev = make(g, "null", "memory_backed=1 size=16 bs=4096");
    softblk_queue* q = queue_of(dev);
    ASSERT_NE(q, nullptr);
    std::vector<unsigned char> buf(k_block);
    ASSERT_EQ(softblk_queue_read(q, 512, buf.data(), buf.size(), nullptr, 0), 0);
    const softblk_completion c = reap_one(q);
    EXPECT_EQ(c.ret, -EINVAL);
    ASSERT_NE(c.error_msg, nullptr);
    EXPECT_THAT(std::string(c.error_msg), HasSubstr("logical block size (4096 bytes)"));
}

TEST(capi, zone_operation_on_a_device_that_is_not_zoned)
{
    device_guard g;
    softblk_device* dev = make(g, "null", "memory_backed=1 size=16");
    softblk_queue* q = queue_of(dev);
    ASSERT_NE(q, nullptr);
    std::vector<unsigned char> buf(k_block);
    ASSERT_EQ(softblk_queue_zone_append(q, 0, buf.data(), buf.size(), nullptr, 0), 0);
    softblk_completion c = reap_one(q);
    EXPECT_EQ(c.ret, -EOPNOTSUPP);
    ASSERT_NE(c.error_msg, nullptr);
    EXPECT_THAT(std::string(c.error_msg), HasSubstr("zone_append at 0: the device is not zoned"));
    ASSERT_EQ(softblk_queue_zone_reset(q, 0, nullptr, 0), 0);
    c = reap_one(q);
    EXPECT_EQ(c.ret, -EOPNOTSUPP);
    EXPECT_THAT(std::string(c.error_msg), HasSubstr("not zoned"));
}

TEST(capi, submission_errors_submit_nothing)
{
    device_guard g;
    // irqmode=2 with a long completion time: nothing completes unless
    // do_io waits for it.
    softblk_device* dev = make(
        g, "null", "memory_backed=1 size=16 hw_queue_depth=2 irqmode=2 completion_nsec=1000000");
    softblk_queue* q = queue_of(dev);
    ASSERT_NE(q, nullptr);
    std::vector<unsigned char> buf(k_block);
    EXPECT_EQ(softblk_queue_read(q, 0, buf.data(), buf.size(), nullptr, 0x80), -EINVAL);
    EXPECT_THAT(last_message(), HasSubstr("unknown flags 0x80"));
    EXPECT_EQ(softblk_queue_read(nullptr, 0, buf.data(), buf.size(), nullptr, 0), -EINVAL);
    EXPECT_EQ(softblk_queue_in_flight(q), 0u);
    // min_completions above what is in flight would wait forever.
    softblk_completion c[3];
    EXPECT_EQ(softblk_queue_do_io(q, c, 1, 3, -1), -EINVAL);
    EXPECT_THAT(last_message(), HasSubstr("would never end"));
    EXPECT_EQ(softblk_queue_do_io(q, c, 2, 1, 0), -EINVAL);
    // Two slots (hw_queue_depth=2): the third submission waits for a reap.
    ASSERT_EQ(softblk_queue_read(q, 0, buf.data(), buf.size(), nullptr, 0), 0);
    ASSERT_EQ(softblk_queue_read(q, 0, buf.data(), buf.size(), nullptr, 0), 0);
    EXPECT_EQ(softblk_queue_read(q, 0, buf.data(), buf.size(), nullptr, 0), -EAGAIN);
    EXPECT_THAT(last_message(), HasSubstr("all 2 requests of the queue"));
    EXPECT_EQ(softblk_queue_in_flight(q), 2u);
    // A zero timeout returns at once with what is there (nothing yet).
    EXPECT_EQ(softblk_queue_do_io(q, c, 2, 3, 0), 0);
    // Options that re-make the queues, and power, wait for the reap too.
    EXPECT_EQ(softblk_stop(dev), -EBUSY);
    EXPECT_THAT(last_message(), HasSubstr("2 requests not reaped"));
    EXPECT_EQ(softblk_set_option(dev, "submit_queues", "2"), -EBUSY);
    EXPECT_EQ(softblk_queue_do_io(q, c, 2, 3, -1), 2);
    EXPECT_EQ(c[0].ret, 0);
    EXPECT_EQ(softblk_queue_in_flight(q), 0u);
    ASSERT_EQ(softblk_set_option(dev, "submit_queues", "2"), 0) << last_message();
    uint64_t n = 0;
    ASSERT_EQ(softblk_get_uint64(dev, "num_queues", &n), 0);
    EXPECT_EQ(n, 3u);
}

TEST(capi, queue_slots_follow_the_depth_after_a_power_cycle)
{
    // The queue handles are made anew at each power on, with as many slots
    // as the new hw_queue_depth (even where a new queue lands at the
    // address of the old one).
    device_guard g;
    softblk_device* dev =
        make(g, "null", "size=16 hw_queue_depth=2 irqmode=2 completion_nsec=1000000");
    ASSERT_NE(dev, nullptr);
    for (const char* depth : {"4", "3"}) {
        ASSERT_EQ(softblk_stop(dev), 0) << last_message();
        ASSERT_EQ(softblk_set_option(dev, "hw_queue_depth", depth), 0) << last_message();
        ASSERT_EQ(softblk_start(dev), 0) << last_message();
        softblk_queue* q = queue_of(dev);
        ASSERT_NE(q, nullptr);
        const unsigned n = static_cast<unsigned>(std::stoul(depth));
        for (unsigned i = 0; i < n; ++i) {
            ASSERT_EQ(softblk_queue_flush(q, nullptr, 0), 0) << last_message();
        }
        EXPECT_EQ(softblk_queue_flush(q, nullptr, 0), -EAGAIN);
        std::vector<softblk_completion> c(n);
        EXPECT_EQ(softblk_queue_do_io(q, c.data(), n, n, -1), static_cast<int>(n));
    }
}

TEST(capi, destroy_finishes_requests_in_flight)
{
    // Writes submitted and never reaped are finished by softblk_destroy,
    // not dropped: their data is in the image after it.
    char dir_template[] = "/tmp/softblk-capi-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    const std::string image = std::string(dir_template) + "/image";
    const std::string options = "path=" + image + " size=16M create=1";
    softblk_device* dev = nullptr;
    ASSERT_EQ(softblk_create("capi0", "file", options.c_str(), &dev), 0) << last_message();
    softblk_queue* q = queue_of(dev);
    ASSERT_NE(q, nullptr);
    constexpr unsigned k_writes = 8;
    std::vector<unsigned char> buf(k_writes * k_block);
    for (size_t i = 0; i < buf.size(); ++i) {
        buf[i] = static_cast<unsigned char>(i % 251 + 1);
    }
    for (unsigned i = 0; i < k_writes; ++i) {
        ASSERT_EQ(softblk_queue_write(q, i * k_block, &buf[i * k_block], k_block, nullptr, 0), 0);
    }
    EXPECT_EQ(softblk_queue_in_flight(q), k_writes);
    softblk_destroy(&dev);
    EXPECT_EQ(dev, nullptr);
    std::vector<unsigned char> back(buf.size());
    FILE* f = std::fopen(image.c_str(), "rb");
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(std::fread(back.data(), 1, back.size(), f), back.size());
    std::fclose(f);
    EXPECT_EQ(back, buf);
    std::filesystem::remove_all(dir_template);
}

TEST(capi, zoned_append_report_and_reset)
{
    device_guard g;
    softblk_device* dev =
        make(g, "null", "memory_backed=1 size=16 zoned=1 zone_size=4 zone_nr_conv=1");
    ASSERT_NE(dev, nullptr);
    uint64_t zone = 0;
    uint64_t zones_n = 0;
    ASSERT_EQ(softblk_get_uint64(dev, "zone_size", &zone), 0);
    ASSERT_EQ(softblk_get_uint64(dev, "nr_zones", &zones_n), 0);
    EXPECT_EQ(zone, 4u << 20);
    EXPECT_EQ(zones_n, 4u);
    softblk_queue* q = queue_of(dev);
    ASSERT_NE(q, nullptr);
    std::vector<unsigned char> buf(k_block, 0x5a);
    for (unsigned i = 0; i < 3; ++i) {
        ASSERT_EQ(softblk_queue_zone_append(q, zone, buf.data(), buf.size(), nullptr, 0), 0);
        const softblk_completion c = reap_one(q);
        ASSERT_EQ(c.ret, 0) << c.error_msg;
        EXPECT_EQ(c.result_offset, zone + i * k_block);
    }
    // Every zone, from a report larger than the device.
    std::vector<softblk_zone> zones(8);
    ASSERT_EQ(softblk_queue_report_zones(q, 0, zones.data(), 8, nullptr, 0), 0);
    softblk_completion c = reap_one(q);
    ASSERT_EQ(c.ret, 0) << c.error_msg;
    ASSERT_EQ(c.transferred, 4u);
    EXPECT_EQ(zones[0].type, SOFTBLK_ZONE_TYPE_CONVENTIONAL);
    EXPECT_EQ(zones[0].condition, SOFTBLK_ZONE_COND_NOT_WP);
    for (unsigned i = 0; i < 4; ++i) {
        EXPECT_EQ(zones[i].start, i * zone);
        EXPECT_EQ(zones[i].length, zone);
        EXPECT_EQ(zones[i].capacity, zone);
    }
    EXPECT_EQ(zones[1].type, SOFTBLK_ZONE_TYPE_SEQWRITE_REQ);
    EXPECT_EQ(zones[1].condition, SOFTBLK_ZONE_COND_IMP_OPEN);
    EXPECT_EQ(zones[1].write_pointer, zone + 3 * k_block);
    EXPECT_EQ(zones[2].condition, SOFTBLK_ZONE_COND_EMPTY);
    EXPECT_EQ(zones[2].write_pointer, 2 * zone);
    EXPECT_EQ(zones[3].write_pointer, 3 * zone);

    // Finish, then the zone is full; reset, then empty.
    ASSERT_EQ(softblk_queue_zone_finish(q, zone, nullptr, 0), 0);
    ASSERT_EQ(reap_one(q).ret, 0);
    ASSERT_EQ(softblk_queue_report_zones(q, zone, zones.data(), 1, nullptr, 0), 0);
    ASSERT_EQ(reap_one(q).transferred, 1u);
    EXPECT_EQ(zones[0].condition, SOFTBLK_ZONE_COND_FULL);
    ASSERT_EQ(softblk_queue_zone_reset(q, zone, nullptr, 0), 0);
    ASSERT_EQ(reap_one(q).ret, 0);
    ASSERT_EQ(softblk_queue_zone_open(q, 2 * zone, nullptr, 0), 0);
    ASSERT_EQ(reap_one(q).ret, 0);
    ASSERT_EQ(softblk_queue_report_zones(q, zone, zones.data(), 2, nullptr, 0), 0);
    ASSERT_EQ(reap_one(q).transferred, 2u);
    EXPECT_EQ(zones[0].condition, SOFTBLK_ZONE_COND_EMPTY);
    EXPECT_EQ(zones[0].write_pointer, zone);
    EXPECT_EQ(zones[1].condition, SOFTBLK_ZONE_COND_EXP_OPEN);
    ASSERT_EQ(softblk_queue_zone_close(q, 2 * zone, nullptr, 0), 0);
    EXPECT_EQ(reap_one(q).ret, 0);
    ASSERT_EQ(softblk_queue_zone_reset_all(q, nullptr, 0), 0);
    EXPECT_EQ(reap_one(q).ret, 0);

    // An append to a zone's middle is refused, with the offset named.
    ASSERT_EQ(softblk_queue_zone_append(q, zone + k_block, buf.data(), buf.size(), nullptr, 0), 0);
    c = reap_one(q);
    EXPECT_LT(c.ret, 0);
    EXPECT_THAT(std::string(c.error_msg), HasSubstr("zone_append of 4096 bytes at 4198400"));
}

TEST(capi, zloop_ram_appends)
{
    device_guard g;
    softblk_device* dev = make(g, "zloop-ram", "capacity_mb=64 zone_size_mb=4 conv_zones=2");
    ASSERT_NE(dev, nullptr);
    bool zoned = false;
    ASSERT_EQ(softblk_get_bool(dev, "zoned", &zoned), 0);
    EXPECT_TRUE(zoned);
    uint64_t zone = 0;
    uint64_t conv = 0;
    ASSERT_EQ(softblk_get_uint64(dev, "zone_size", &zone), 0);
    ASSERT_EQ(softblk_get_uint64(dev, "conventional_zones", &conv), 0);
    softblk_queue* q = queue_of(dev);
    ASSERT_NE(q, nullptr);
    std::vector<unsigned char> buf(k_block, 1);
    const uint64_t first_seq = conv * zone;
    ASSERT_EQ(softblk_queue_zone_append(q, first_seq, buf.data(), buf.size(), nullptr, 0), 0);
    const softblk_completion c = reap_one(q);
    ASSERT_EQ(c.ret, 0) << c.error_msg;
    EXPECT_EQ(c.result_offset, first_seq);
}

TEST(capi, exports_by_front_end_name)
{
    device_guard g;
    softblk_device* dev = make(g, "null", "memory_backed=1 size=16");
    ASSERT_NE(dev, nullptr);
    char dir_template[] = "/tmp/softblk-capi-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    const std::string run_dir = dir_template;
    softblk_export* exp = nullptr;
    EXPECT_EQ(softblk_export_start(dev, "nbdd", nullptr, run_dir.c_str(), &exp), -ENOENT);
    EXPECT_THAT(last_message(), HasSubstr("nbdd: unknown export type (known: "));
    EXPECT_THAT(last_message(), HasSubstr("nbd"));
    EXPECT_EQ(softblk_export_start(dev, "nbd", nullptr, "relative", &exp), -EINVAL);
    EXPECT_THAT(last_message(), HasSubstr("run_dir must be an absolute path"));

    ASSERT_EQ(softblk_export_start(dev, "nbd", nullptr, run_dir.c_str(), &exp), 0)
        << last_message();
    ASSERT_NE(exp, nullptr);
    char json[512];
    ASSERT_GT(softblk_export_describe(exp, json, sizeof(json)), 0);
    EXPECT_THAT(std::string(json), HasSubstr("nbd+unix:///capi0"));
    EXPECT_TRUE(std::filesystem::exists(run_dir + "/nbd.sock"));
    // The export's threads drive the queues now.
    softblk_queue* q = nullptr;
    EXPECT_EQ(softblk_get_queue(dev, 0, &q), -EBUSY);
    EXPECT_EQ(softblk_stop(dev), -EBUSY);
    EXPECT_THAT(last_message(), HasSubstr("an export runs on the device"));
    ASSERT_EQ(softblk_export_stop(&exp), 0) << last_message();
    EXPECT_EQ(exp, nullptr);
    EXPECT_EQ(softblk_get_queue(dev, 0, &q), 0);
    std::filesystem::remove_all(run_dir);
}

TEST(capi, zoned_device_refused_by_a_front_end_without_zones)
{
    device_guard g;
    softblk_device* dev = make(g, "null", "memory_backed=1 size=16 zoned=1 zone_size=4");
    ASSERT_NE(dev, nullptr);
    char dir_template[] = "/tmp/softblk-capi-XXXXXX";
    ASSERT_NE(mkdtemp(dir_template), nullptr);
    softblk_export* exp = nullptr;
    EXPECT_LT(softblk_export_start(dev, "nbd", nullptr, dir_template, &exp), 0);
    EXPECT_EQ(exp, nullptr);
    EXPECT_THAT(last_message(), HasSubstr("zoned"));
    std::filesystem::remove_all(dir_template);
}

TEST(capi, cpp_layer_over_the_c_abi)
{
    auto bad = softblk::lib::device::create("capi0", "null", "memory_backed=1 size=x");
    ASSERT_FALSE(bad);
    EXPECT_EQ(bad.error().code, EINVAL);
    EXPECT_THAT(bad.error().message, HasSubstr("size"));

    const std::vector<std::string> args = {"memory_backed=1", "size=16"};
    auto dev = softblk::lib::device::create("capi0", "null", args);
    ASSERT_TRUE(dev) << dev.error().message;
    EXPECT_EQ(dev->u64("capacity").value_or(0), 16u << 20);
    EXPECT_EQ(dev->option("memory_backed").value_or(""), "1");
    auto q = dev->get_queue(0);
    ASSERT_TRUE(q) << q.error().message;
    std::vector<std::byte> out(k_block, std::byte{7});
    std::vector<std::byte> in(k_block);
    ASSERT_TRUE(q->wait_one(q->write(k_block, out)));
    ASSERT_TRUE(q->wait_one(q->read(k_block, in)));
    EXPECT_EQ(in, out);
    auto beyond = q->wait_one(q->read(16u << 20, in));
    ASSERT_FALSE(beyond);
    EXPECT_THAT(beyond.error().message, HasSubstr("beyond the end"));
    auto missing = dev->get_queue(9);
    ASSERT_FALSE(missing);
    EXPECT_EQ(missing.error().code, EINVAL);
}

}  // namespace
