// The daemon's control plane in-process, with an export type of the test's
// own whose start() and stop() can be held (a back end that does not
// answer, a front end that cannot stop) and which can say it is in use (a
// mounted loop device): the control thread never waits for a device (add,
// power on, recovery, teardown), del gives up after the stop timeout,
// shutdown refuses while an export is in use, and a termination signal
// stops what may stop and waits for the rest (docs/reliability.md).
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <mutex>
#include <thread>

#include <fcntl.h>

#include <softblk/frontend.hpp>

#include "daemon.hpp"
#include "raw_client.hpp"

using namespace softblk;
using namespace softblk::cli;
using namespace softblk::test;
namespace fs = std::filesystem;

namespace {

// What the test's exports do, shared with the test body.
struct gate {
    std::mutex lock;
    std::condition_variable opened;
    bool open = true;        // stop() returns only while open
    bool start_open = true;  // start() returns only while open
    std::string busy;        // in_use(); stop() refuses while set
    std::atomic<int> stops{0};
    std::atomic<int> starts_waiting{0};
} g_gate;

class gated_export final : public device_export {
public:
    nlohmann::json describe() const override { return {{"gated", true}}; }
    result<void> stop() override
    {
        std::unique_lock guard(g_gate.lock);
        if (!g_gate.busy.empty()) {
            return make_error(EBUSY, g_gate.busy);
        }
        g_gate.opened.wait(guard, [] { return g_gate.open; });
        ++g_gate.stops;
        return {};
    }
    std::string in_use() const override
    {
        std::lock_guard guard(g_gate.lock);
        return g_gate.busy;
    }
};

[[maybe_unused]] const bool k_registered = register_export_type(export_type{
    .name = "test_gated",
    .description = "test export whose stop can be held and which can be in use",
    .start = [](device&, const export_context&,
                std::span<const std::string>) -> result<std::unique_ptr<device_export>> {
        std::unique_lock guard(g_gate.lock);
        ++g_gate.starts_waiting;
        g_gate.opened.wait(guard, [] { return g_gate.start_open; });
        --g_gate.starts_waiting;
        return std::make_unique<gated_export>();
    },
    .cleanup_stale = {},
    .available = {},
    .options = {},
});

void set_gate(bool open, std::string busy = {})
{
    {
        std::lock_guard guard(g_gate.lock);
        g_gate.open = open;
        g_gate.busy = std::move(busy);
    }
    g_gate.opened.notify_all();
}

void set_start_gate(bool open)
{
    {
        std::lock_guard guard(g_gate.lock);
        g_gate.start_open = open;
    }
    g_gate.opened.notify_all();
}

// The daemon's control thread, its device table and server, in a thread of
// the test; `signal()` plays a termination signal.
class control_plane_test : public ::testing::Test {
protected:
    void SetUp() override
    {
        set_gate(true);
        set_start_gate(true);
        char tmpl[] = "/tmp/softblk-plane.XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        _paths = run_paths_in(tmpl);
        ASSERT_TRUE(prepare_run_dir(_paths));
        ASSERT_EQ(::pipe2(_signal, O_CLOEXEC | O_NONBLOCK), 0);
        start();
    }
    // Starts the daemon's loop (again: a new daemon that recovers).
    void start()
    {
        _stopped = false;
        std::promise<void> listening;
        auto ready = listening.get_future();
        _thread = std::thread([this, &listening] { serve(listening); });
        ready.wait();
    }
    void TearDown() override
    {
        set_gate(true);
        set_start_gate(true);
        if (_thread.joinable()) {
            raw_client c(_paths.socket);
            (void)c.call({{"method", "shutdown"}, {"params", {{"force", true}}}});
            _thread.join();
        }
        ::close(_signal[0]);
        ::close(_signal[1]);
        fs::remove_all(_paths.dir);
    }

    void serve(std::promise<void>& listening)
    {
        device_host host(export_context{.run_dir = _paths.dir, .privileged = false},
                         _paths.devices);
        auto server = control_server::listen(_paths.socket, server_limits{});
        daemon_options options;
        options.stop_timeout = std::chrono::milliseconds(500);
        control_service service(host, _paths, **server, options);
        (void)host.begin_recover();
        listening.set_value();
        loop_hooks hooks;
        hooks.fds = {_signal[0], host.wake_fd()};
        hooks.on_ready = [&](int fd) {
            if (fd == host.wake_fd()) {
                host.clear_wake();
                return;
            }
            char c = 0;
            while (::read(_signal[0], &c, 1) == 1) {
                service.on_signal("SIGTERM");
            }
        };
        hooks.on_tick = [&] { service.tick(); };
        (void)(*server)->run([&](const request& req,
                                 const reply_token& token) { return service.handle(req, token); },
                             hooks);
        _stopped = true;
    }

    void signal() { ASSERT_EQ(::write(_signal[1], "t", 1), 1); }

    json call(const json& request)
    {
        raw_client c(_paths.socket);
        return c.call(request);
    }
    json add(const std::string& name, const std::string& exp)
    {
        return call(
            {{"method", "add"},
             {"params",
              {{"type", "null"}, {"name", name}, {"options", {"size=8"}}, {"export", exp}}}});
    }
    json list() { return call({{"method", "list"}})["result"]; }
    // A request's round trip over the socket (a new connection each).
    std::chrono::milliseconds timed(const json& request, json* reply = nullptr)
    {
        const auto start = std::chrono::steady_clock::now();
        json r = call(request);
        const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now() - start);
        if (reply != nullptr) {
            *reply = std::move(r);
        }
        return took;
    }
    // Sends an add on its own connection without waiting for the reply.
    void send_add(raw_client& c, int id, const std::string& name,
                  const std::vector<std::string>& options = {"size=8"})
    {
        json params = {
            {"type", "null"}, {"name", name}, {"options", options}, {"export", "test_gated"}};
        ASSERT_TRUE(c.send(json{{"id", id}, {"method", "add"}, {"params", params}}.dump() + "\n"));
    }
    static void wait_starts(int n)
    {
        for (int i = 0; i < 500 && g_gate.starts_waiting.load() < n; ++i) {
            std::this_thread::sleep_for(5ms);
        }
        ASSERT_EQ(g_gate.starts_waiting.load(), n);
    }
    std::string state_of(const std::string& name)
    {
        for (const json& d : list()) {
            if (d["name"] == name) {
                return d["state"];
            }
        }
        return "absent";
    }
    bool wait_stopped(std::chrono::milliseconds timeout)
    {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        while (!_stopped && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(10ms);
        }
        if (_stopped) {
            _thread.join();
        }
        return _stopped;
    }

    run_paths _paths;
    int _signal[2] = {-1, -1};
    std::thread _thread;
    std::atomic<bool> _stopped{false};
};

TEST_F(control_plane_test, a_del_that_cannot_finish_does_not_hold_up_the_others)
{
    ASSERT_TRUE(add("stuck", "test_gated").contains("result"));
    ASSERT_TRUE(add("other", "none").contains("result"));
    set_gate(false);

    raw_client deleter(_paths.socket);
    ASSERT_TRUE(deleter.send(R"({"id": 7, "method": "del", "params": {"name": "stuck"}})"
                             "\n"));
    // No reply yet, but the others are served at once.
    EXPECT_TRUE(deleter.read_reply(100ms).is_discarded());
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(state_of("stuck"), "stopping");
    EXPECT_TRUE(call({{"method", "status"}}).contains("result"));
    EXPECT_TRUE(add("new", "none").contains("result"));
    EXPECT_EQ(error_code(add("stuck", "none")), -EEXIST);  // the name is still taken
    EXPECT_LT(std::chrono::steady_clock::now() - start, 300ms);

    // The del gives up after the stop timeout; the device keeps stopping.
    json reply = deleter.read_reply(5s);
    ASSERT_TRUE(reply.is_object());
    EXPECT_EQ(reply["id"], 7);
    EXPECT_EQ(error_code(reply), -ETIMEDOUT);
    EXPECT_NE(reply["error"]["message"].get<std::string>().find("background"), std::string::npos);
    EXPECT_EQ(state_of("stuck"), "stopping");
    EXPECT_TRUE(fs::exists(_paths.devices + "/stuck.json"));

    // The same connection is served again; a second del waits for the
    // same teardown, which ends when the export can stop.
    ASSERT_TRUE(deleter.send(R"({"id": 8, "method": "del", "params": {"name": "stuck"}})"
                             "\n"));
    std::this_thread::sleep_for(100ms);
    set_gate(true);
    reply = deleter.read_reply(5s);
    ASSERT_TRUE(reply.contains("result")) << reply.dump();
    EXPECT_EQ(reply["result"]["name"], "stuck");
    EXPECT_EQ(state_of("stuck"), "absent");
    EXPECT_FALSE(fs::exists(_paths.devices + "/stuck.json"));
    EXPECT_EQ(g_gate.stops.load() >= 1, true);
}

TEST_F(control_plane_test, shutdown_refuses_while_an_export_is_in_use)
{
    ASSERT_TRUE(add("mounted", "test_gated").contains("result"));
    ASSERT_TRUE(add("idle", "none").contains("result"));
    set_gate(true, "/dev/loop9 is mounted on /mnt/x (ext4)");

    json refused = call({{"method", "shutdown"}});
    EXPECT_EQ(error_code(refused), -EBUSY);
    const std::string message = refused["error"]["message"];
    for (const char* word : {"mounted", "/dev/loop9 is mounted on /mnt/x", "--force"}) {
        EXPECT_NE(message.find(word), std::string::npos) << word << " not in " << message;
    }
    EXPECT_EQ(state_of("mounted"), "running");
    EXPECT_EQ(state_of("idle"), "running");
    // del refuses too, naming the holder, and the device stays.
    json del = call({{"method", "del"}, {"params", {{"name", "mounted"}}}});
    EXPECT_EQ(error_code(del), -EBUSY);
    EXPECT_NE(del["error"]["message"].get<std::string>().find("/mnt/x"), std::string::npos);
    EXPECT_EQ(state_of("mounted"), "running");
    EXPECT_FALSE(_stopped);
}

TEST_F(control_plane_test, a_signal_stops_what_may_stop_and_waits_for_the_rest)
{
    ASSERT_TRUE(add("mounted", "test_gated").contains("result"));
    ASSERT_TRUE(add("idle", "none").contains("result"));
    set_gate(true, "/dev/loop9 is mounted on /mnt/x (ext4)");
    signal();
    std::this_thread::sleep_for(300ms);
    EXPECT_FALSE(_stopped);
    json devices = list();
    ASSERT_EQ(devices.size(), 1u) << devices.dump();
    EXPECT_EQ(devices[0]["name"], "mounted");
    EXPECT_EQ(devices[0]["state"], "running");
    json status = call({{"method", "status"}});
    EXPECT_EQ(status["result"]["state"], "stopping");
    EXPECT_EQ(error_code(add("late", "none")), -ESHUTDOWN);

    set_gate(true);  // unmounted
    ASSERT_TRUE(wait_stopped(5s));
    // Both keep their state for the next daemon.
    EXPECT_TRUE(fs::exists(_paths.devices + "/mounted.json"));
    EXPECT_TRUE(fs::exists(_paths.devices + "/idle.json"));
}

TEST_F(control_plane_test, shutdown_gives_up_on_a_stuck_export_after_the_stop_timeout)
{
    ASSERT_TRUE(add("stuck", "test_gated").contains("result"));
    set_gate(false);
    const auto start = std::chrono::steady_clock::now();
    json reply = call({{"method", "shutdown"}});
    ASSERT_TRUE(reply.contains("result")) << reply.dump();
    EXPECT_EQ(reply["result"]["stop_timeout_ms"], 500);
    EXPECT_TRUE(call({{"method", "list"}}).contains("result"));  // still serving meanwhile
    // The loop ends; the host is left with the teardown (the daemon then
    // exits; here the test opens the gate so that the thread ends).
    while (!_stopped && std::chrono::steady_clock::now() < start + 5s) {
        std::this_thread::sleep_for(10ms);
    }
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_TRUE(_stopped);
    EXPECT_GE(took, 450ms);
    EXPECT_LT(took, 3s);
    set_gate(true);
    _thread.join();
}

// ------------------------------------------------ the control thread never waits on a device

// The bound on a request's round trip while another device's add waits
// (docs/reliability.md, "Control plane").
constexpr auto k_answer_bound = 100ms;

TEST_F(control_plane_test, an_add_that_waits_holds_up_no_other_request)
{
    ASSERT_TRUE(add("other", "none").contains("result"));
    ASSERT_TRUE(add("spare", "none").contains("result"));
    set_start_gate(false);
    raw_client adder(_paths.socket);
    send_add(adder, 5, "slow");
    wait_starts(1);
    EXPECT_TRUE(adder.read_reply(50ms).is_discarded());  // it waits

    json reply;
    EXPECT_LT(timed({{"method", "list"}}, &reply), k_answer_bound);
    bool listed = false;
    for (const json& d : reply["result"]) {
        if (d["name"] == "slow") {
            listed = true;
            EXPECT_EQ(d["state"], "adding") << d.dump();
            EXPECT_TRUE(d.contains("busy_ms"));
        }
    }
    EXPECT_TRUE(listed) << reply.dump();
    EXPECT_LT(timed({{"method", "status"}}, &reply), k_answer_bound);
    EXPECT_EQ(reply["result"]["devices"], 3);
    EXPECT_LT(
        timed({{"method", "get"}, {"params", {{"name", "other"}, {"keys", {"size"}}}}}, &reply),
        k_answer_bound);
    EXPECT_EQ(reply["result"]["values"]["size"], "8\n");
    EXPECT_LT(timed({{"method", "del"}, {"params", {{"name", "spare"}}}}, &reply), k_answer_bound);
    EXPECT_TRUE(reply.contains("result")) << reply.dump();
    // The name is taken; the device answers nothing else meanwhile.
    EXPECT_EQ(error_code(add("slow", "none")), -EEXIST);
    EXPECT_EQ(error_code(call({{"method", "get"}, {"params", {{"name", "slow"}}}})), -EBUSY);
    EXPECT_FALSE(fs::exists(_paths.devices + "/slow.json"));

    set_start_gate(true);
    reply = adder.read_reply(5s);
    ASSERT_TRUE(reply.contains("result")) << reply.dump();
    EXPECT_EQ(reply["id"], 5);
    EXPECT_EQ(reply["result"]["name"], "slow");
    EXPECT_EQ(state_of("slow"), "running");
    EXPECT_TRUE(fs::exists(_paths.devices + "/slow.json"));
}

TEST_F(control_plane_test, a_del_of_a_device_being_added_removes_it_when_the_add_ends)
{
    set_start_gate(false);
    raw_client adder(_paths.socket);
    send_add(adder, 1, "slow");
    wait_starts(1);
    raw_client deleter(_paths.socket);
    ASSERT_TRUE(deleter.send(R"({"id": 2, "method": "del", "params": {"name": "slow"}})"
                             "\n"));
    // The del waits for the add, past its stop timeout (500 ms): it says so.
    json reply = deleter.read_reply(5s);
    EXPECT_EQ(error_code(reply), -ETIMEDOUT) << reply.dump();
    EXPECT_NE(reply["error"]["message"].get<std::string>().find("still adding"), std::string::npos)
        << reply.dump();
    // A del that waits for it when the add ends.
    ASSERT_TRUE(deleter.send(R"({"id": 3, "method": "del", "params": {"name": "slow"}})"
                             "\n"));
    std::this_thread::sleep_for(100ms);
    set_start_gate(true);
    reply = adder.read_reply(5s);
    EXPECT_EQ(error_code(reply), -ECANCELED) << reply.dump();
    EXPECT_NE(reply["error"]["message"].get<std::string>().find("deleted"), std::string::npos);
    reply = deleter.read_reply(5s);
    EXPECT_EQ(reply["id"], 3);
    EXPECT_EQ(reply["result"]["name"], "slow") << reply.dump();
    for (int i = 0; i < 100 && state_of("slow") != "absent"; ++i) {
        std::this_thread::sleep_for(10ms);
    }
    EXPECT_EQ(state_of("slow"), "absent");
    EXPECT_FALSE(fs::exists(_paths.devices + "/slow.json"));
}

TEST_F(control_plane_test, power_on_runs_off_the_control_thread)
{
    json added = call({{"method", "add"},
                       {"params",
                        {{"type", "null"},
                         {"name", "p"},
                         {"options", {"size=8", "power=0"}},
                         {"export", "test_gated"}}}});
    ASSERT_TRUE(added.contains("result")) << added.dump();
    EXPECT_EQ(state_of("p"), "off");
    set_start_gate(false);
    raw_client setter(_paths.socket);
    ASSERT_TRUE(
        setter.send(R"({"id": 9, "method": "set", "params": {"name": "p", "options": ["power=1"]}})"
                    "\n"));
    wait_starts(1);
    json reply;
    EXPECT_LT(timed({{"method", "list"}}, &reply), k_answer_bound);
    ASSERT_EQ(reply["result"].size(), 1u);
    EXPECT_EQ(reply["result"][0]["state"], "starting");
    EXPECT_LT(timed({{"method", "status"}}), k_answer_bound);
    set_start_gate(true);
    reply = setter.read_reply(5s);
    ASSERT_TRUE(reply.contains("result")) << reply.dump();
    EXPECT_EQ(reply["result"]["power"], 1);
    EXPECT_EQ(state_of("p"), "running");
}

TEST_F(control_plane_test, shutdown_during_an_add_is_bounded)
{
    set_start_gate(false);
    raw_client adder(_paths.socket);
    send_add(adder, 4, "slow");
    wait_starts(1);
    const auto start = std::chrono::steady_clock::now();
    json reply = call({{"method", "shutdown"}});
    ASSERT_TRUE(reply.contains("result")) << reply.dump();
    reply = adder.read_reply(5s);
    EXPECT_EQ(error_code(reply), -ESHUTDOWN) << reply.dump();
    while (!_stopped && std::chrono::steady_clock::now() < start + 5s) {
        std::this_thread::sleep_for(10ms);
    }
    EXPECT_TRUE(_stopped);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
    set_start_gate(true);  // the host (here, not a process that exits) waits for it
    _thread.join();
    EXPECT_FALSE(fs::exists(_paths.devices + "/slow.json"));
}

TEST_F(control_plane_test, recovery_at_start_holds_up_no_request)
{
    ASSERT_TRUE(add("r", "test_gated").contains("result"));
    ASSERT_TRUE(call({{"method", "shutdown"}}).contains("result"));
    ASSERT_TRUE(wait_stopped(5s));
    set_start_gate(false);
    start();  // a new daemon that recovers r, whose export does not start
    wait_starts(1);
    json reply;
    EXPECT_LT(timed({{"method", "list"}}, &reply), k_answer_bound);
    ASSERT_EQ(reply["result"].size(), 1u);
    EXPECT_EQ(reply["result"][0]["state"], "recovering");
    EXPECT_LT(timed({{"method", "status"}}), k_answer_bound);
    EXPECT_TRUE(add("new", "none").contains("result"));
    set_start_gate(true);
    for (int i = 0; i < 100 && state_of("r") != "running"; ++i) {
        std::this_thread::sleep_for(10ms);
    }
    EXPECT_EQ(state_of("r"), "running");
}

}  // namespace
