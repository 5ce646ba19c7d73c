// The control protocol's request parser and reply formatter, fed bytes.
#include <gtest/gtest.h>

#include <string>

#include "protocol.hpp"

using namespace softblk::cli;
using nlohmann::json;

namespace {

int parse_error_code(std::string_view line, json* id_out = nullptr)
{
    json id;
    auto req = parse_request(line, id);
    if (id_out != nullptr) {
        *id_out = id;
    }
    return req ? 0 : req.error().code.value();
}

}  // namespace

TEST(protocol, parses_a_request_with_id_method_and_params)
{
    json id;
    auto req = parse_request(R"({"id": 7, "method": "add", "params": {"type": "null"}})", id);
    ASSERT_TRUE(req) << req.error().message;
    EXPECT_EQ(req->id, 7);
    EXPECT_EQ(id, 7);
    EXPECT_EQ(req->method, "add");
    EXPECT_EQ(req->params["type"], "null");
}

TEST(protocol, params_and_id_may_be_left_out)
{
    json id;
    auto req = parse_request(R"({"method": "list"})", id);
    ASSERT_TRUE(req);
    EXPECT_TRUE(req->id.is_null());
    EXPECT_TRUE(req->params.is_object());
    EXPECT_TRUE(req->params.empty());
}

TEST(protocol, rejects_what_is_not_a_request_object)
{
    EXPECT_EQ(parse_error_code("hello"), EINVAL);
    EXPECT_EQ(parse_error_code("{\"method\": \"list\""), EINVAL);  // truncated
    EXPECT_EQ(parse_error_code("[1,2,3]"), EINVAL);
    EXPECT_EQ(parse_error_code("42"), EINVAL);
    EXPECT_EQ(parse_error_code("{}"), EINVAL);
    EXPECT_EQ(parse_error_code(R"({"method": 5})"), EINVAL);
    EXPECT_EQ(parse_error_code(R"({"method": "list", "params": "x"})"), EINVAL);
    EXPECT_EQ(parse_error_code(R"({"method": "list", "params": [1]})"), EINVAL);
    EXPECT_EQ(parse_error_code("{\"method\": \"\xff\xfe\"}"), EINVAL);  // not UTF-8
}

TEST(protocol, keeps_the_id_of_a_request_it_rejects)
{
    json id;
    EXPECT_EQ(parse_error_code(R"({"id": "a", "params": {}})", &id), EINVAL);
    EXPECT_EQ(id, "a");
}

TEST(protocol, an_id_must_be_a_number_a_string_or_null)
{
    json id;
    EXPECT_EQ(parse_error_code(R"({"id": [1], "method": "list"})", &id), EINVAL);
    EXPECT_TRUE(id.is_null());
    EXPECT_EQ(parse_error_code(R"({"id": {"a": 1}, "method": "list"})", &id), EINVAL);
    EXPECT_TRUE(id.is_null());
}

TEST(protocol, rejects_deep_nesting_before_parsing)
{
    std::string deep = R"({"method": "list", "params": {"x": )" + std::string(10000, '[') +
                       std::string(10000, ']') + "}}";
    EXPECT_EQ(parse_error_code(deep), EINVAL);
    EXPECT_EQ(nesting_depth(R"({"a": "[[[[[[[[[[[[[[[[[[[[[[[[["})", 16),
              1);  // brackets in strings do not count
    EXPECT_EQ(nesting_depth(R"({"a": "\"[[["})", 16), 1);
    EXPECT_EQ(nesting_depth("[[[]]]", 16), 3);
    EXPECT_EQ(nesting_depth("[[[]]]", 2), 3);
}

TEST(protocol, rejects_requests_over_the_size_limit)
{
    std::string huge =
        R"({"method": "list", "params": {"x": ")" + std::string(k_max_request_bytes, 'a') + "\"}}";
    EXPECT_EQ(parse_error_code(huge), E2BIG);
}

TEST(protocol, error_replies_carry_a_negative_errno_and_never_throw_on_bad_utf8)
{
    const std::string reply = format_error(
        json(3),
        softblk::error{std::error_code(EINVAL, std::generic_category()), "bad \xff value"});
    ASSERT_EQ(reply.back(), '\n');
    json parsed = json::parse(reply);
    EXPECT_EQ(parsed["id"], 3);
    EXPECT_EQ(parsed["error"]["code"], -EINVAL);
    EXPECT_NE(parsed["error"]["message"].get<std::string>().find("bad"), std::string::npos);

    json ok = json::parse(format_result(json("x"), json{{"a", 1}}));
    EXPECT_EQ(ok["id"], "x");
    EXPECT_EQ(ok["result"]["a"], 1);
}

// Every reply has a size bound: a result past it becomes an error that says
// so (the client gets an answer, not a closed connection), a result within
// it is written as format_result writes it.
TEST(protocol, replies_past_the_size_bound_become_an_error)
{
    static_assert(k_max_reply_bytes == 16u << 20);
    const json small = json{{"values", {{"badblocks", std::string(4096, 'x')}}}};
    EXPECT_EQ(format_reply(json(1), small, "get"), format_result(json(1), small));
    // (A smaller bound than the protocol's, for speed: the same code.)
    constexpr size_t bound = 64 * 1024;
    const json big = json{{"values", {{"badblocks", std::string(bound, 'x')}}}};
    json parsed = json::parse(format_reply(json(2), big, "get", bound));
    EXPECT_EQ(parsed["id"], 2);
    EXPECT_EQ(parsed["error"]["code"], -EMSGSIZE);
    const std::string message = parsed["error"]["message"];
    EXPECT_NE(message.find("reply to get"), std::string::npos) << message;
    EXPECT_NE(message.find(std::to_string(bound)), std::string::npos) << message;
    // An error stays an error.
    parsed = json::parse(
        format_reply(json(3),
                     softblk::result<json>(std::unexpected(softblk::error{
                         std::error_code(ENOENT, std::generic_category()), "no device named 'x'"})),
                     "get"));
    EXPECT_EQ(parsed["error"]["code"], -ENOENT);
}

TEST(protocol, typed_parameters_name_the_parameter_on_error)
{
    json params = {{"name", 5}, {"options", {"a=1", 2}}, {"all", "yes"}, {"list", "x"}};
    auto name = param_string(params, "name", true);
    ASSERT_FALSE(name);
    EXPECT_NE(name.error().message.find("\"name\""), std::string::npos);
    auto options = param_strings(params, "options");
    ASSERT_FALSE(options);
    EXPECT_NE(options.error().message.find("\"options\""), std::string::npos);
    EXPECT_FALSE(param_bool(params, "all", false));
    EXPECT_FALSE(param_strings(params, "list"));
    EXPECT_FALSE(param_string(params, "missing", true));
    EXPECT_EQ(*param_string(params, "missing", false, "dflt"), "dflt");
    EXPECT_TRUE(param_strings(params, "missing")->empty());
}

TEST(protocol, device_names_are_safe_file_names)
{
    EXPECT_TRUE(valid_device_name("null0"));
    EXPECT_TRUE(valid_device_name("a-b_c.d"));
    EXPECT_FALSE(valid_device_name(""));
    EXPECT_FALSE(valid_device_name("../etc"));
    EXPECT_FALSE(valid_device_name("a/b"));
    EXPECT_FALSE(valid_device_name(".hidden"));
    EXPECT_FALSE(valid_device_name("sp ace"));
    EXPECT_FALSE(valid_device_name(std::string(65, 'a')));
}

TEST(protocol, new_device_names_are_neither_options_nor_the_features_file)
{
    EXPECT_TRUE(check_new_device_name("null0"));
    EXPECT_TRUE(check_new_device_name("a-b_c.d"));
    EXPECT_TRUE(check_new_device_name("_x"));
    EXPECT_TRUE(check_new_device_name("features2"));
    // Still recovered from the state files of older versions (and so
    // deletable, with `softblk del -- -x`), but not given to new devices.
    EXPECT_TRUE(valid_device_name("-x"));
    EXPECT_TRUE(valid_device_name("features"));
    auto dash = check_new_device_name("-x");
    ASSERT_FALSE(dash);
    EXPECT_EQ(dash.error().code.value(), EINVAL);
    EXPECT_NE(dash.error().message.find("option"), std::string::npos) << dash.error().message;
    auto features = check_new_device_name("features");
    ASSERT_FALSE(features);
    EXPECT_EQ(features.error().code.value(), EEXIST);
    EXPECT_NE(features.error().message.find("configfs"), std::string::npos)
        << features.error().message;
    EXPECT_FALSE(check_new_device_name(".hidden"));
    EXPECT_FALSE(check_new_device_name("a/b"));
}
