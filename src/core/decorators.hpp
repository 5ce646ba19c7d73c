// Cross-cutting behaviour that null_blk builds into one driver, written once
// as decorators that wrap any target (see target_decorator in target.hpp):
//   fault injection  timeout / requeue / init_hctx  (outermost)
//   throttle         mbps
//   bad blocks       badblocks, badblocks_once, badblocks_partial_io
//   write-back cache cache_size, with FUA and FLUSH                (innermost)
// The order is null_blk's: fault checks in queue_rq, then the throttle, then
// bad blocks, then the cache in front of the store.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>

#include <softblk/device.hpp>
#include <softblk/options.hpp>
#include <softblk/target.hpp>

namespace softblk::core {

class bad_block_table;
class fault_attr;

// What the decorators keep for a device across power cycles, as null_blk
// keeps it in the configfs item: the bad-block list and the three fault
// attributes (their counters included). Changed live by set_option; read
// by the decorators of each power on. Owned by the device.
struct decorator_state {
    std::shared_ptr<bad_block_table> bad_blocks;
    // timeout_inject, requeue_inject, init_hctx_fault_inject.
    std::shared_ptr<fault_attr> faults[3];
};

// The decorators' option table (part of core_options()).
std::span<const option_def> decorator_options();

// The state of a new device from its options (badblocks, the fault
// module parameters timeout=/requeue=/init_hctx= and then the per-field
// attributes). Errors name the attribute. Control thread.
result<std::shared_ptr<decorator_state>> make_decorator_state(const option_set& options);

// Applies a live change of a decorator option to `state` (on or off): the
// new value is in `options`, which is updated to the canonical form (the
// bad-block list as its ranges). Returns false when `def` is not a live
// decorator option. Errors carry the errno of the kernel's write.
result<bool> apply_decorator_option(decorator_state& state, const option_def& def,
                                    option_set& options);

// The configfs read of a decorator attribute backed by the state (the
// bad-block list, the fault counters times and space), or nullopt.
std::optional<std::string> decorator_option_text(const decorator_state& state,
                                                 std::string_view name);

// Wraps `inner` in the decorators: fault injection and bad blocks always
// (their state changes while powered on), the throttle and the cache when
// `options` switch them on. Errors name the attribute. Control thread.
result<std::unique_ptr<target>> apply_decorators(std::unique_ptr<target> inner,
                                                 const option_set& options,
                                                 const queue_config& queues,
                                                 const decorator_state& state);

}  // namespace softblk::core
