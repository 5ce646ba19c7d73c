// Built only while src/core/decorators/ has no sources: no decorator is
// offered, so their options are unknown (an error), never silently ignored.
#include "decorators.hpp"

namespace softblk::core {

std::span<const option_def> decorator_options()
{
    return {};
}

result<std::shared_ptr<decorator_state>> make_decorator_state(const option_set&)
{
    return std::make_shared<decorator_state>();
}

result<bool> apply_decorator_option(decorator_state&, const option_def&, option_set&)
{
    return false;
}

std::optional<std::string> decorator_option_text(const decorator_state&, std::string_view)
{
    return std::nullopt;
}

result<std::unique_ptr<target>> apply_decorators(std::unique_ptr<target> inner, const option_set&,
                                                 const queue_config&, const decorator_state&)
{
    return inner;
}

}  // namespace softblk::core
