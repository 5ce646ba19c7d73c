// `softblk metrics`: every device's and export's counters in Prometheus'
// text format, as the daemon's publishers give them (docs/metrics.md).
#include <fmt/format.h>

#include "metrics.hpp"
#include "metrics_publisher.hpp"
#include "subcommand.hpp"

namespace softblk::cli {

void define_metrics(CLI::App& app, subcommand_table& table)
{
    CLI::App* cmd = app.add_subcommand(
        "metrics",
        "print the daemon's, every device's and every export's counters in Prometheus' text "
        "format (0.0.4); the daemon also publishes them with --metrics-textfile or "
        "--metrics-listen");
    table.push_back({cmd, [] {
                         auto paths = resolve_run_paths();
                         if (!paths) {
                             return fail(paths.error());
                         }
                         // No daemon is started for it: a scrape of a machine
                         // without one says so instead of starting one.
                         auto families = collect_metrics(*paths);
                         if (!families) {
                             return fail(families.error());
                         }
                         fmt::print("{}", host::metrics_text(*families));
                         return 0;
                     }});
}

}  // namespace softblk::cli
