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
#include <span>

#include <softblk/device.hpp>
#include <softblk/options.hpp>
#include <softblk/target.hpp>

namespace softblk::core {

// The decorators' option table (part of core_options()).
std::span<const option_def> decorator_options();

// Wraps `inner` in the decorators that `options` switch on; returns `inner`
// unchanged when none is. Errors name the attribute (e.g. a malformed
// badblocks range or fault spec). Control thread.
result<std::unique_ptr<target>> apply_decorators(std::unique_ptr<target> inner,
                                                 const option_set& options,
                                                 const queue_config& queues);

}  // namespace softblk::core
