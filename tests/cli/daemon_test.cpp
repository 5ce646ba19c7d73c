// The `softblk` executable and its daemon, end to end (the fixture is in
// daemon_fixture.hpp).
#include "daemon_fixture.hpp"

using namespace softblk::test;

namespace {

// ------------------------------------------------------------------ the CLI

TEST_F(daemon_test, first_command_starts_the_daemon_with_a_private_socket)
{
    EXPECT_EQ(daemon_pid(), 0);
    run_result r = softblk({"list"});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("no devices"), std::string::npos);
    const pid_t pid = daemon_pid();
    ASSERT_GT(pid, 0);
    EXPECT_FALSE(gone(pid));

    struct stat st {};
    ASSERT_EQ(::stat(socket_path().c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    EXPECT_EQ(st.st_mode & 07777, 0600u);
    EXPECT_EQ(st.st_uid, ::geteuid());
    ASSERT_EQ(::stat((_dir + "/devices").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0077, 0u);
    EXPECT_TRUE(fs::exists(_dir + "/daemon.log"));

    // A second command talks to the same daemon.
    json status = softblk_json({"status"});
    EXPECT_EQ(status["pid"], pid);
    EXPECT_EQ(status["run_dir"], _dir);
}

TEST_F(daemon_test, concurrent_first_commands_start_exactly_one_daemon)
{
    std::vector<pid_t> clients;
    for (int i = 0; i < 4; ++i) {
        const pid_t pid = ::fork();
        if (pid == 0) {
            const int null_fd = ::open("/dev/null", O_WRONLY);
            ::dup2(null_fd, STDOUT_FILENO);
            ::execl(SOFTBLK_BIN, SOFTBLK_BIN, "list", static_cast<char*>(nullptr));
            _exit(127);
        }
        ASSERT_GT(pid, 0);
        clients.push_back(pid);
    }
    for (pid_t pid : clients) {
        int status = 0;
        ASSERT_EQ(::waitpid(pid, &status, 0), pid);
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
    }
    remember_daemon();
    // Daemons that lost the race for the lock leave at once.
    const auto deadline = std::chrono::steady_clock::now() + 5s;
    std::vector<pid_t> running = processes_of_this_run_dir();
    while (running.size() > 1 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(50ms);
        running = processes_of_this_run_dir();
    }
    ASSERT_EQ(running.size(), 1u);
    EXPECT_EQ(running[0], daemon_pid());
}

TEST_F(daemon_test, adds_lists_and_deletes_several_devices)
{
    run_result a = softblk({"add", "null", "memory_backed=1", "size=64", "bs=4096", "--export",
                            "none", "--name", "a"});
    ASSERT_EQ(a.status, 0) << a.err;
    EXPECT_EQ(a.out.substr(0, a.out.find('\n')), "a");
    ASSERT_EQ(softblk({"add", "null", "size=32", "--export", "none"}).status, 0);
    ASSERT_EQ(softblk({"add", "null", "size=16", "submit_queues=2", "hw_queue_depth=8", "--export",
                       "none"})
                  .status,
              0);

    json devices = list();
    ASSERT_TRUE(devices.is_array());
    ASSERT_EQ(devices.size(), 3u);
    EXPECT_EQ(names(devices), (std::set<std::string>{"a", "null0", "null1"}));
    EXPECT_EQ(devices[0]["name"], "a");
    EXPECT_EQ(devices[0]["capacity_bytes"], 64u << 20);
    EXPECT_EQ(devices[0]["logical_block_size"], 4096);
    EXPECT_EQ(devices[0]["state"], "running");
    EXPECT_EQ(devices[0]["export"]["type"], "none");
    EXPECT_TRUE(devices[0].contains("memory_bytes"));
    EXPECT_TRUE(devices[0].contains("stats"));
    EXPECT_EQ(devices[2]["submit_queues"], 2);
    EXPECT_EQ(devices[2]["queue_depth"], 8);
    for (const char* name : {"a", "null0", "null1"}) {
        EXPECT_TRUE(fs::exists(_dir + "/devices/" + name + ".json")) << name;
    }

    run_result table = softblk({"list"});
    ASSERT_EQ(table.status, 0);
    EXPECT_NE(table.out.find("64.0 MiB"), std::string::npos) << table.out;

    run_result del = softblk({"del", "null0"});
    ASSERT_EQ(del.status, 0) << del.err;
    EXPECT_EQ(names(list()), (std::set<std::string>{"a", "null1"}));
    EXPECT_FALSE(fs::exists(_dir + "/devices/null0.json"));

    run_result missing = softblk({"del", "nope"});
    EXPECT_EQ(missing.status, 1);
    EXPECT_NE(missing.err.find("nope"), std::string::npos);
    run_result dup = softblk({"add", "null", "--name", "a", "--export", "none"});
    EXPECT_EQ(dup.status, 1);
    EXPECT_NE(dup.err.find("exists"), std::string::npos);

    ASSERT_EQ(softblk({"del", "--all"}).status, 0);
    EXPECT_TRUE(list().empty());
    EXPECT_TRUE(fs::is_empty(_dir + "/devices"));
}

TEST_F(daemon_test, bad_options_name_the_attribute_and_the_daemon_stays_up)
{
    ASSERT_EQ(softblk({"add", "null", "size=8", "--export", "none", "--name", "keep"}).status, 0);
    const pid_t pid = daemon_pid();
    struct bad_case {
        std::vector<std::string> args;
        std::string named;
    };
    const bad_case cases[] = {
        {{"add", "null", "size=17592186044416", "--export", "none"}, "size"},
        {{"add", "null", "hw_queue_depth=0", "--export", "none"}, "hw_queue_depth"},
        {{"add", "null", "memory_backed=maybe", "--export", "none"}, "memory_backed"},
        {{"add", "null", "frobnicate=1", "--export", "none"}, "frobnicate"},
        {{"add", "null", "size", "--export", "none"}, "size"},
        {{"add", "null", "bs=3000", "--export", "none"}, "blocksize"},
        {{"add", "nosuchtype", "--export", "none"}, "nosuchtype"},
        {{"add", "null", "--export", "nosuchexport"}, "nosuchexport"},
        {{"add", "null", "--name", "../escape", "--export", "none"}, "../escape"},
        {{"add", "null", "size=32", "--size", "64M", "--export", "none"}, "size"},
    };
    for (const bad_case& c : cases) {
        run_result r = softblk(c.args);
        EXPECT_EQ(r.status, 1) << c.args[2];
        EXPECT_NE(r.err.find(c.named), std::string::npos)
            << "error does not name " << c.named << ": " << r.err;
    }
    EXPECT_EQ(daemon_pid(), pid);
    EXPECT_FALSE(gone(pid));
    json devices = list();
    ASSERT_EQ(devices.size(), 1u);
    EXPECT_EQ(devices[0]["name"], "keep");
    EXPECT_FALSE(fs::exists(_dir + "/escape.json"));
    EXPECT_EQ(std::distance(fs::directory_iterator(_dir + "/devices"), fs::directory_iterator{}),
              1);
}

TEST_F(daemon_test, friendly_flags_mean_the_same_as_key_value_options)
{
    ASSERT_EQ(softblk({"add", "null", "--size", "1G", "--bs", "4096", "--memory-backed", "--queues",
                       "2", "--depth", "16", "--export", "none", "--name", "f"})
                  .status,
              0);
    ASSERT_EQ(softblk({"add", "null", "size=1024", "bs=4096", "memory_backed=1", "submit_queues=2",
                       "hw_queue_depth=16", "--export", "none", "--name", "k"})
                  .status,
              0);
    json devices = list();
    ASSERT_EQ(devices.size(), 2u);
    for (const char* key :
         {"capacity_bytes", "logical_block_size", "submit_queues", "queue_depth"}) {
        EXPECT_EQ(devices[0][key], devices[1][key]) << key;
    }
    EXPECT_EQ(devices[0]["capacity_bytes"], 1ull << 30);
    EXPECT_EQ(devices[0]["options"], devices[1]["options"]);
}

TEST_F(daemon_test, features_lists_options_with_defaults_and_export_types)
{
    json f = softblk_json({"features", "null"});
    ASSERT_EQ(f["targets"].size(), 1u);
    bool found = false;
    for (const json& o : f["targets"][0]["options"]) {
        if (o["name"] == "memory_backed") {
            found = true;
            EXPECT_EQ(o["default"], "0");
            EXPECT_FALSE(o["help"].get<std::string>().empty());
        }
    }
    EXPECT_TRUE(found);
    EXPECT_FALSE(f["exports"].empty());
    // Each export type names its --export-opt options (the ublk binary is
    // built here whenever softblk_ublk is).
    for (const json& e : f["exports"]) {
        ASSERT_TRUE(e.contains("options")) << e.dump();
        if (e["name"] == "ublk") {
            std::set<std::string> names;
            for (const json& o : e["options"]) {
                names.insert(o["name"].get<std::string>());
            }
            EXPECT_TRUE(names.contains("recovery")) << e.dump();
            EXPECT_TRUE(names.contains("unprivileged")) << e.dump();
        }
    }
    run_result text = softblk({"features"});
    EXPECT_EQ(text.status, 0);
    EXPECT_NE(text.out.find("hw_queue_depth"), std::string::npos);
    EXPECT_NE(text.out.find("export types"), std::string::npos);
    run_result bad = softblk({"features", "nosuchtype"});
    EXPECT_EQ(bad.status, 1);
    EXPECT_NE(bad.err.find("null"), std::string::npos);
}

// ------------------------------------------------------------------ hostile clients

TEST_F(daemon_test, malformed_requests_get_error_replies_and_harm_nothing)
{
    ASSERT_EQ(softblk({"add", "null", "size=8", "--export", "none", "--name", "keep"}).status, 0);
    const pid_t pid = daemon_pid();
    raw_client c(socket_path());
    ASSERT_TRUE(c.connected());

    const std::string bad_lines[] = {
        "this is not json",
        "{\"method\": \"list\"",
        "[1, 2, 3]",
        "\"add\"",
        "null",
        "{}",
        R"({"method": 42})",
        R"({"method": "list", "params": "x"})",
        R"({"id": [1, 2], "method": "list"})",
        R"({"id": 1, "method": "no_such_method"})",
        R"({"id": 2, "method": "add", "params": {}})",
        R"({"id": 3, "method": "add", "params": {"type": 5}})",
        R"({"id": 4, "method": "add", "params": {"type": "null", "options": "size=8"}})",
        R"({"id": 5, "method": "add", "params": {"type": "null", "options": [1, 2]}})",
        R"({"id": 6, "method": "add", "params": {"type": "null", "name": "../../etc/x", "export": "none"}})",
        R"({"id": 7, "method": "add", "params": {"type": "null", "name": "keep", "export": "none"}})",
        R"({"id": 8, "method": "del", "params": {}})",
        R"({"id": 9, "method": "del", "params": {"name": "keep", "all": true}})",
        R"({"id": 10, "method": "del", "params": {"all": "yes"}})",
        R"({"id": 11, "method": "features", "params": {"type": ["null"]}})",
        "{\"id\": 12, \"method\": \"add\", \"params\": {\"type\": \"null\", \"name\": "
        "\"\xff\xfe\"}}",
        R"({"method": "list", "params": {"x": )" + std::string(5000, '[') + std::string(5000, ']') +
            "}}",
        std::string("{\"method\": \"li\0st\"}", 18),
    };
    for (const std::string& line : bad_lines) {
        ASSERT_TRUE(c.send(line + "\n")) << line.substr(0, 80);
        json reply = c.read_reply();
        ASSERT_TRUE(reply.is_object()) << "no reply to: " << line.substr(0, 80);
        EXPECT_LT(error_code(reply), 0) << line.substr(0, 80) << " -> " << reply.dump();
        EXPECT_FALSE(reply["error"].value("message", std::string()).empty());
    }
    // The connection still works, with the id echoed.
    json ok = c.call({{"id", "last"}, {"method", "list"}});
    EXPECT_EQ(ok["id"], "last");
    ASSERT_TRUE(ok.contains("result")) << ok.dump();
    ASSERT_EQ(ok["result"].size(), 1u);
    EXPECT_EQ(ok["result"][0]["name"], "keep");
    json features = c.call({{"id", 1}, {"method", "features"}, {"params", {{"type", "null"}}}});
    ASSERT_TRUE(features.contains("result")) << features.dump();
    EXPECT_EQ(features["result"]["targets"][0]["name"], "null");
    EXPECT_EQ(daemon_pid(), pid);
    EXPECT_FALSE(gone(pid));
    EXPECT_FALSE(fs::exists(_dir + "/etc"));
}

TEST_F(daemon_test, truncated_huge_and_vanishing_clients_leave_the_daemon_serving)
{
    ASSERT_EQ(softblk({"add", "null", "size=8", "--export", "none", "--name", "keep"}).status, 0);
    const pid_t pid = daemon_pid();

    {  // half a request, then gone
        raw_client c(socket_path());
        ASSERT_TRUE(c.send(R"({"id": 1, "method": "add", "params": {"type": "nu)"));
    }
    {  // a request without its newline, then end of input: handled as complete
        raw_client c(socket_path());
        ASSERT_TRUE(c.send(R"({"id": 2, "method": "status"})"));
        ::shutdown(c.fd(), SHUT_WR);
        json reply = c.read_reply();
        EXPECT_EQ(reply["result"]["pid"], pid) << reply.dump();
        EXPECT_TRUE(c.wait_closed(5s));
    }
    {  // more than the 1 MiB limit without a newline
        raw_client c(socket_path());
        const std::string chunk(64 * 1024, 'x');
        bool sent = true;
        for (int i = 0; i < 40 && sent; ++i) {  // 2.5 MiB
            sent = c.send(chunk);
        }
        json reply = c.read_reply();
        if (reply.is_object()) {
            EXPECT_EQ(error_code(reply), -E2BIG) << reply.dump();
        }
        EXPECT_TRUE(c.wait_closed(5s));
    }
    {  // a client that sends a request and disconnects before the reply
        raw_client c(socket_path());
        ASSERT_TRUE(
            c.send("{\"id\": 3, \"method\": \"add\", \"params\": {\"type\": \"null\", \"options\": "
                   "[\"size=8\"], \"export\": \"none\", \"name\": \"orphan\"}}\n"));
    }
    {  // many requests at once, never reading the replies
        raw_client c(socket_path());
        std::string burst;
        for (int i = 0; i < 2000; ++i) {
            burst += R"({"method": "list"})"
                     "\n";
        }
        ASSERT_TRUE(c.send(burst));
    }
    // The daemon still answers, and the device is untouched.
    json devices = list();
    EXPECT_EQ(daemon_pid(), pid);
    EXPECT_FALSE(gone(pid));
    EXPECT_TRUE(names(devices).contains("keep"));
    // The orphaned add either happened completely or not at all.
    if (names(devices).contains("orphan")) {
        EXPECT_TRUE(fs::exists(_dir + "/devices/orphan.json"));
    } else {
        EXPECT_FALSE(fs::exists(_dir + "/devices/orphan.json"));
    }
}

TEST_F(daemon_test, slow_clients_time_out_without_blocking_others)
{
    run_result started = softblk({"daemon", "--client-timeout", "500"});
    ASSERT_EQ(started.status, 0) << started.err;
    const pid_t pid = daemon_pid();
    ASSERT_GT(pid, 0);

    raw_client slow(socket_path());
    ASSERT_TRUE(slow.send(R"({"id": 1, "method": "st)"));
    // Others are served while the slow one dawdles.
    raw_client other(socket_path());
    json reply = other.call({{"id", 1}, {"method", "status"}});
    EXPECT_EQ(reply["result"]["pid"], pid);
    // The slow one is told and cut off.
    json timeout = slow.read_reply(5s);
    ASSERT_TRUE(timeout.is_object());
    EXPECT_EQ(error_code(timeout), -ETIMEDOUT) << timeout.dump();
    EXPECT_TRUE(slow.wait_closed(5s));
    EXPECT_FALSE(gone(pid));
}

TEST_F(daemon_test, too_many_clients_are_refused_and_the_rest_keep_working)
{
    ASSERT_EQ(softblk({"list"}).status, 0);
    std::vector<std::unique_ptr<raw_client>> clients;
    for (int i = 0; i < 80; ++i) {
        clients.push_back(std::make_unique<raw_client>(socket_path()));
        ASSERT_TRUE(clients.back()->connected());
    }
    // All stay connected: the first 64 the daemon accepts are served, the
    // others get -EBUSY as their first reply (whatever they asked).
    int refused = 0;
    int served = 0;
    for (auto& c : clients) {
        json r = c->call({{"method", "status"}});
        if (r.contains("result")) {
            ++served;
        } else if (error_code(r) == -EBUSY) {
            ++refused;
        }
    }
    EXPECT_EQ(served, 64);
    EXPECT_EQ(refused, 16);
    clients.clear();
    EXPECT_EQ(softblk({"status"}).status, 0);
}

TEST_F(daemon_test, other_users_are_refused)
{
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to connect as another uid";
    }
    ASSERT_EQ(softblk({"list"}).status, 0);
    // Open the file mode so that the uid check itself (SO_PEERCRED) is tested.
    ASSERT_EQ(::chmod(socket_path().c_str(), 0666), 0);
    ASSERT_EQ(::chmod(_dir.c_str(), 0755), 0);
    int pipe_fds[2];
    ASSERT_EQ(::pipe(pipe_fds), 0);
    const pid_t child = ::fork();
    if (child == 0) {
        ::close(pipe_fds[0]);
        if (::setgid(65534) != 0 || ::setuid(65534) != 0) {
            _exit(2);
        }
        raw_client c(socket_path());
        std::string answer = "no-connect";
        if (c.connected()) {
            json r = c.call({{"method", "list"}});
            answer = r.is_object() ? r.dump() : "no-reply";
        }
        (void)::write(pipe_fds[1], answer.data(), answer.size());
        _exit(0);
    }
    ::close(pipe_fds[1]);
    std::string answer;
    char buf[4096];
    for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof buf)) > 0;) {
        answer.append(buf, static_cast<size_t>(n));
    }
    ::close(pipe_fds[0]);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "child: " << (WIFEXITED(status) ? "exit " : "signal ")
        << (WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status)) << " " << answer;
    json reply = json::parse(answer, nullptr, false);
    ASSERT_TRUE(reply.is_object()) << answer;
    EXPECT_EQ(error_code(reply), -EACCES) << answer;
    EXPECT_FALSE(reply.contains("result"));
}

// ------------------------------------------------------------------ lifecycle

TEST_F(daemon_test, a_killed_daemon_is_replaced_and_its_devices_recovered)
{
    ASSERT_EQ(softblk({"add", "null", "memory_backed=1", "size=64", "bs=4096", "hw_queue_depth=32",
                       "--export", "none", "--name", "one"})
                  .status,
              0);
    ASSERT_EQ(
        softblk({"add", "null", "gb=1", "submit_queues=2", "--export", "none", "--name", "two"})
            .status,
        0);
    json before = list();
    const pid_t old_pid = daemon_pid();
    ASSERT_GT(old_pid, 0);
    ASSERT_EQ(::kill(old_pid, SIGKILL), 0);
    ASSERT_TRUE(wait_gone(old_pid, 10s));

    json after = list();  // starts a new daemon, which recovers
    const pid_t new_pid = daemon_pid();
    EXPECT_NE(new_pid, old_pid);
    EXPECT_FALSE(gone(new_pid));
    ASSERT_EQ(after.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
        for (const char* key : {"name", "capacity_bytes", "logical_block_size", "submit_queues",
                                "queue_depth", "options", "state"}) {
            EXPECT_EQ(after[i][key], before[i][key]) << key;
        }
    }
    EXPECT_EQ(after[0]["queue_depth"], 32);
    EXPECT_EQ(after[1]["capacity_bytes"], 1ull << 30);
    std::ifstream log(_dir + "/daemon.log");
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("recovered one"), std::string::npos);
}

TEST_F(daemon_test, broken_state_files_show_as_failed_and_can_be_deleted)
{
    fs::create_directories(_dir + "/devices");
    std::ofstream(_dir + "/devices/broken.json")
        << "{\"name\": \"broken\", \"type\": \"null\", \"options\": [\"size=17592186044416\"]}";
    std::ofstream(_dir + "/devices/junk.json") << "\x01\x02 not json";
    json devices = list();
    ASSERT_EQ(devices.size(), 2u);
    for (const json& d : devices) {
        EXPECT_EQ(d["state"], "failed") << d.dump();
    }
    run_result table = softblk({"list"});
    EXPECT_NE(table.out.find("failed"), std::string::npos);
    ASSERT_EQ(softblk({"del", "broken", "junk"}).status, 0);
    EXPECT_TRUE(list().empty());
    EXPECT_TRUE(fs::is_empty(_dir + "/devices"));
}

TEST_F(daemon_test, shutdown_stops_the_daemon_and_leaves_no_process)
{
    ASSERT_EQ(softblk({"add", "null", "size=8", "--export", "none", "--name", "kept"}).status, 0);
    const pid_t pid = daemon_pid();
    run_result r = softblk({"shutdown"});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.out.find("stopped"), std::string::npos);
    EXPECT_TRUE(wait_gone(pid, 10s));
    EXPECT_TRUE(processes_of_this_run_dir().empty());
    EXPECT_FALSE(fs::exists(socket_path()));
    EXPECT_FALSE(fs::exists(_dir + "/daemon.pid"));
    // The device's state stays for the next daemon.
    EXPECT_TRUE(fs::exists(_dir + "/devices/kept.json"));
    run_result status = softblk({"status"});
    EXPECT_EQ(status.status, 1);
    EXPECT_EQ(softblk({"shutdown"}).status, 0);  // nothing to stop: fine

    EXPECT_EQ(names(list()), std::set<std::string>{"kept"});
    ASSERT_EQ(softblk({"del", "--all"}).status, 0);
    const pid_t second = daemon_pid();
    ::kill(second, SIGTERM);  // a signal stops it cleanly too
    EXPECT_TRUE(wait_gone(second, 10s));
    EXPECT_FALSE(fs::exists(socket_path()));
    EXPECT_TRUE(processes_of_this_run_dir().empty());
}

// The daemon removes its control socket at exit only while the path is
// still the socket it bound: a file put in its place since stays.
TEST_F(daemon_test, exit_leaves_a_file_put_in_place_of_the_socket)
{
    ASSERT_EQ(softblk({"status"}).status, 1);  // no daemon yet
    ASSERT_EQ(softblk({"list"}).status, 0);    // starts one
    const pid_t pid = daemon_pid();
    ASSERT_GT(pid, 0);
    const std::string moved = _dir + "/control.sock.moved";
    ASSERT_EQ(::rename(socket_path().c_str(), moved.c_str()), 0);
    {
        std::ofstream(socket_path()) << "not the daemon's";
    }
    ::kill(pid, SIGTERM);
    EXPECT_TRUE(wait_gone(pid, 10s));
    EXPECT_TRUE(fs::is_regular_file(socket_path())) << "the daemon removed a file it did not bind";
    ::unlink(socket_path().c_str());
    ::unlink(moved.c_str());
}

TEST_F(daemon_test, devices_come_and_go_without_disturbing_the_others)
{
    ASSERT_EQ(
        softblk({"add", "null", "memory_backed=1", "size=16", "--export", "none", "--name", "stay"})
            .status,
        0);
    raw_client c(socket_path());
    ASSERT_TRUE(c.connected());
    for (int i = 0; i < 25; ++i) {
        const std::string name = "tmp" + std::to_string(i % 5);
        json added = c.call(
            {{"id", i},
             {"method", "add"},
             {"params",
              {{"type", "null"}, {"name", name}, {"options", {"size=8"}}, {"export", "none"}}}});
        ASSERT_TRUE(added.contains("result")) << added.dump();
        if (i % 2 == 0) {
            json removed = c.call({{"method", "del"}, {"params", {{"name", name}}}});
            ASSERT_TRUE(removed.contains("result")) << removed.dump();
        }
        if (i % 5 == 4) {
            json all = c.call({{"method", "list"}});
            ASSERT_TRUE(all["result"].is_array());
            EXPECT_TRUE(names(all["result"]).contains("stay"));
            for (const json& d : all["result"]) {
                if (d["name"] != "stay") {
                    json removed = c.call({{"method", "del"}, {"params", {{"name", d["name"]}}}});
                    ASSERT_TRUE(removed.contains("result")) << removed.dump();
                }
            }
        }
    }
    json devices = list();
    ASSERT_EQ(devices.size(), 1u);
    EXPECT_EQ(devices[0]["name"], "stay");
    EXPECT_EQ(devices[0]["state"], "running");
}

}  // namespace
