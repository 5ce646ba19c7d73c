// The data-memory budgets (include/softblk/memory_store.hpp): the process's
// one, and the charge that names, when refused, the level that refused it
// (the daemon's --memory-limit or a device's memory_limit).
#include <softblk/memory_store.hpp>

#include <cerrno>
#include <iterator>

#include <fmt/format.h>

namespace softblk {

memory_budget& process_memory_budget()
{
    static memory_budget budget;
    return budget;
}

std::string human_bytes(uint64_t bytes)
{
    static constexpr const char* k_units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double value = static_cast<double>(bytes);
    size_t unit = 0;
    while (value >= 1024.0 && unit + 1 < std::size(k_units)) {
        value /= 1024.0;
        ++unit;
    }
    if (unit == 0) {
        return fmt::format("{} B", bytes);
    }
    return fmt::format("{:.1f} {}", value, k_units[unit]);
}

error out_of_memory(std::string_view what, uint64_t bytes)
{
    return error{std::error_code(ENOMEM, std::generic_category()),
                 fmt::format("not enough memory for {} ({}): the system refused it", what,
                             human_bytes(bytes))};
}

result<memory_charge> memory_charge::take(memory_budget& budget, uint64_t bytes,
                                          std::string_view what)
{
    memory_charge charge;
    if (bytes == 0) {
        return charge;
    }
    if (budget.try_charge(bytes)) {
        charge._budget = &budget;
        charge._bytes = bytes;
        return charge;
    }
    // The level that refused: the first whose limit the charge would pass.
    std::string why = "a memory budget refused it";
    for (const memory_budget* b = &budget; b != nullptr; b = b->parent()) {
        const uint64_t limit = b->limit();
        const uint64_t used = b->used();
        if (limit == 0 || (used + bytes <= limit && used + bytes >= used)) {
            continue;
        }
        const uint64_t left = used < limit ? limit - used : 0;
        why = b == &process_memory_budget()
                  ? fmt::format(
                        "the daemon's memory budget has {} left of {} (softblk daemon "
                        "--memory-limit; softblk status shows it)",
                        human_bytes(left), human_bytes(limit))
                  : fmt::format("the device's memory_limit of {} has {} left", human_bytes(limit),
                                human_bytes(left));
        break;
    }
    return make_error(
        ENOMEM, fmt::format("not enough memory for {} ({}): {}", what, human_bytes(bytes), why));
}

}  // namespace softblk
