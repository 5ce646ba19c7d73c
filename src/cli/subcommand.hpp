// The `softblk` command line: a table of subcommands (main.cpp), each
// defined with what it runs in the file of its concern, and what they share
// (how they print results and errors, how they reach the daemon). The CLI
// edge: exceptions (CLI11's) are caught in main() only.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <softblk/types.hpp>

#include "client.hpp"

namespace softblk::cli {

constexpr int k_exit_failure = 1;
constexpr int k_exit_usage = 2;

// One subcommand: the CLI11 app that parses it (a nested one for `zone
// report`, `nullb mount` ...) and what runs when it was parsed, returning
// the exit code. `run` owns the subcommand's parsed values.
struct subcommand {
    CLI::App* app = nullptr;
    std::function<int()> run;
};
using subcommand_table = std::vector<subcommand>;

// Each concern's subcommands: defined on `app`, appended to `table` in the
// order `softblk --help` lists them (main.cpp's table).
void define_add(CLI::App& app, subcommand_table& table);       // device_commands.cpp
void define_set(CLI::App& app, subcommand_table& table);       // device_commands.cpp
void define_get(CLI::App& app, subcommand_table& table);       // device_commands.cpp
void define_zone(CLI::App& app, subcommand_table& table);      // zone_command.cpp
void define_nullb(CLI::App& app, subcommand_table& table);     // nullb_command.cpp
void define_del(CLI::App& app, subcommand_table& table);       // device_commands.cpp
void define_list(CLI::App& app, subcommand_table& table);      // device_commands.cpp
void define_apply(CLI::App& app, subcommand_table& table);     // config_commands.cpp
void define_save(CLI::App& app, subcommand_table& table);      // config_commands.cpp
void define_features(CLI::App& app, subcommand_table& table);  // features_command.cpp
void define_metrics(CLI::App& app, subcommand_table& table);   // metrics_command.cpp
void define_daemon(CLI::App& app, subcommand_table& table);    // daemon_commands.cpp
void define_status(CLI::App& app, subcommand_table& table);    // daemon_commands.cpp
void define_recover(CLI::App& app, subcommand_table& table);   // daemon_commands.cpp
void define_shutdown(CLI::App& app, subcommand_table& table);  // daemon_commands.cpp

// `softblk list` (also what `recover` prints): the daemon's devices, as a
// table or with `json_output` as JSON (device_commands.cpp).
int run_list(bool json_output);

// `softblk fat ...` (argv[0] "fat"): the FAT tools, which reach daemon
// devices through this daemon's `list` (fat_command.cpp).
int run_fat(int argc, char** argv);

// ---- what the subcommands share (subcommand.cpp)

// Prints "softblk: MESSAGE" on stderr; returns k_exit_failure.
int fail(const error& err);
// fail(), and with --json the error as the daemon gave it on stdout
// instead, {"error": {"errno": N, "name": "EBUSY", "message": ...}}, so
// that a script reads one stream and sees the errno a configfs write of
// the same attribute would give.
int fail_json(const error& err, bool json_output);
// `value` as indented JSON (invalid UTF-8 replaced).
std::string dump(const nlohmann::json& value);
// A client of this user's daemon; `autostart` starts one when none runs.
result<control_client> connect(bool autostart);
// The string fields of an export's description (paths, URIs, sockets).
std::vector<std::pair<std::string, std::string>> export_paths(const nlohmann::json& exp);
// An export's one-line state for `list` and `set`: its type, then the
// front end's own summary (export_type::summary) or where it is.
std::string export_summary(const nlohmann::json& exp);

}  // namespace softblk::cli
