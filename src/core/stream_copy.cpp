// The memory store's choice of copy (stream_copy.hpp).
#include "stream_copy.hpp"

#include <unistd.h>

#include <fmt/format.h>

#include <softblk/memory_store.hpp>

namespace softblk::core {

uint64_t last_level_cache_bytes()
{
    for (const int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
        if (const long bytes = sysconf(name); bytes > 0) {
            return static_cast<uint64_t>(bytes);
        }
    }
    return 0;
}

copy_choice choose_copy(uint64_t capacity_bytes, uint64_t cache_bytes)
{
    if (!k_can_stream) {
        return {false, "this build has no streaming stores (x86-64 only)"};
    }
    if (cache_bytes == 0) {
        return {false, "the last-level cache's size is unknown"};
    }
    const bool streaming = capacity_bytes / k_stream_factor >= cache_bytes;
    return {streaming,
            fmt::format("capacity {} {} {} times the last-level cache of {}: a random write's "
                        "lines are {}",
                        human_bytes(capacity_bytes), streaming ? "is at least" : "is below",
                        k_stream_factor, human_bytes(cache_bytes),
                        streaming ? "seldom cached, streaming skips reading them"
                                  : "often cached, cached stores keep them there")};
}

}  // namespace softblk::core
