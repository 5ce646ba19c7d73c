// Built only while src/core/decorators/ has no sources: no decorator is
// offered, so their options are unknown (an error), never silently ignored.
#include "decorators.hpp"

namespace softblk::core {

std::span<const option_def> decorator_options()
{
    return {};
}

result<std::unique_ptr<target>> apply_decorators(std::unique_ptr<target> inner, const option_set&,
                                                 const queue_config&)
{
    return inner;
}

}  // namespace softblk::core
