// `softblk`: creates, lists and removes softblk devices through the daemon
// that hosts them (started on demand), and runs that daemon. main() is the
// table of subcommands; each is defined, with what it runs, in the file of
// its concern (subcommand.hpp). The CLI edge: the only place where
// exceptions (CLI11's) are caught.
#include <cstring>

#include <CLI/CLI.hpp>

#include "bench_command.hpp"
#include "subcommand.hpp"
#include "version.hpp"

int main(int argc, char** argv)
{
    using namespace softblk::cli;
    // Commands with argument parsers of their own.
    if (argc >= 2 && std::strcmp(argv[1], "fat") == 0) {
        return run_fat(argc - 1, argv + 1);
    }
    if (argc >= 2 && std::strcmp(argv[1], "bench") == 0) {
        return run_bench(argc - 1, argv + 1);
    }

    CLI::App app{
        "softblk: userspace block devices (null_blk-compatible options), hosted by a daemon that "
        "the first command starts"};
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("softblk ") + softblk::version_string());
    app.footer(
        "Run directory: /run/softblk (root), $XDG_RUNTIME_DIR/softblk, or $SOFTBLK_RUN_DIR.\n"
        "`softblk fat ...` works on FAT file systems on softblk devices and images.\n"
        "`softblk bench PLAN` runs a benchmark plan (`softblk bench --list`).");

    // The subcommands, in the order `softblk --help` lists them.
    constexpr void (*k_subcommands[])(CLI::App&, subcommand_table&) = {
        define_add,     define_set,    define_get,    define_zone,    define_nullb,
        define_del,     define_list,   define_apply,  define_save,    define_features,
        define_metrics, define_daemon, define_status, define_recover, define_shutdown,
    };
    subcommand_table table;
    for (auto define : k_subcommands) {
        define(app, table);
    }

    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : k_exit_usage;  // 0: --version
    }
    for (const subcommand& sub : table) {
        if (sub.app->parsed()) {
            return sub.run();
        }
    }
    return k_exit_usage;
}
