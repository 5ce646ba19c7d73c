// Fault injection, null_blk's timeout / requeue / init_hctx (outermost
// decorator, as null_blk checks them first in queue_rq and init_hctx):
//   timeout    the request is accepted and never completed; the core's
//              io_timeout calls timed_out() and completes it with -ETIMEDOUT.
//              No data moves (null_blk returns before handling the command).
//   requeue    the request is put back and run again (from the next poll),
//              going through the fault checks again; it then succeeds.
//   init_hctx  opening the queue fails with -EFAULT, so device creation fails.
#include "common.hpp"

#include <softblk/external_data.hpp>

#include <cerrno>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

namespace softblk::core {

namespace {

class fault_target;

class fault_queue final : public queue_decorator {
public:
    fault_queue(fault_target& t, std::unique_ptr<target_queue> inner)
        : queue_decorator(std::move(inner)), _target(t)
    {
    }

    void submit(io_request& r) override;

    unsigned poll() override
    {
        unsigned n = 0;
        if (!_requeued.empty()) {
            // Only what was requeued before this pass; a request requeued
            // again waits for the next one.
            request_fifo again = _requeued;
            _requeued = request_fifo{};
            while (io_request* r = again.pop()) {
                submit(*r);
            }
        }
        if (_inner->busy()) {
            n += _inner->poll();
        }
        return n;
    }

    bool busy() const override { return !_requeued.empty() || _inner->busy(); }
    // Faults act before the target sees a request; results are its own.
    bool keeps_ring_write_results() const override { return true; }

    uint64_t next_wakeup_ns() const override
    {
        // A requeued request runs again at once (the kernel kicks the
        // requeue list).
        return _requeued.empty() ? _inner->next_wakeup_ns() : 0;
    }

    bool timed_out(io_request& r) override
    {
        if (_timed.remove(r) || _requeued.remove(r)) {
            return true;
        }
        return _inner->timed_out(r);
    }

private:
    fault_target& _target;
    request_fifo _timed;     // held until the core's timeout
    request_fifo _requeued;  // to run again
};

class fault_target final : public target_decorator {
public:
    fault_target(std::unique_ptr<target> inner, std::shared_ptr<fault_attr> timeout,
                 std::shared_ptr<fault_attr> requeue, std::shared_ptr<fault_attr> init_hctx)
        : target_decorator(std::move(inner)),
          _timeout(std::move(timeout)),
          _requeue(std::move(requeue)),
          _init_hctx(std::move(init_hctx))
    {
    }

    // Passes the consumer's requests on as they are: their data wherever it is.
    external_data_support takes_external_data() const override
    {
        return _inner->takes_external_data();
    }

    result<std::unique_ptr<target_queue>> open_queue(unsigned index, completion_sink& sink) override
    {
        if (_init_hctx && _init_hctx->should_fail()) {
            return make_error(EFAULT, fmt::format("init_hctx fault injection: queue {} failed to "
                                                  "initialise (-EFAULT)",
                                                  index));
        }
        auto inner = _inner->open_queue(index, sink);
        if (!inner) {
            return std::unexpected(inner.error());
        }
        return std::make_unique<fault_queue>(*this, std::move(*inner));
    }

    void describe(nlohmann::json& out) const override
    {
        _inner->describe(out);
        auto one = [](const fault_attr* a) {
            nlohmann::json j = nlohmann::json::object();
            if (a != nullptr) {
                for (unsigned i = 0; i < fault_attr::k_field_count; ++i) {
                    const auto f = static_cast<fault_attr::field>(i);
                    j[fault_attr::name(f)] = a->get(f);
                }
                j["failures"] = a->failures();
            }
            return j;
        };
        out["fault_injection"] = {{"timeout", one(_timeout.get())},
                                  {"requeue", one(_requeue.get())},
                                  {"init_hctx", one(_init_hctx.get())}};
    }

    fault_attr* timeout() { return _timeout.get(); }
    fault_attr* requeue() { return _requeue.get(); }

private:
    std::shared_ptr<fault_attr> _timeout;
    std::shared_ptr<fault_attr> _requeue;
    std::shared_ptr<fault_attr> _init_hctx;
};

void fault_queue::submit(io_request& r)
{
    // null_queue_rq: decide the fake timeout, then the requeue (which wins).
    const bool fake_timeout = _target.timeout() != nullptr && _target.timeout()->should_fail();
    if (_target.requeue() != nullptr && _target.requeue()->should_fail()) {
        _requeued.push(r);
        return;
    }
    if (fake_timeout) {
        _timed.push(r);
        return;
    }
    _inner->submit(r);
}

}  // namespace

std::unique_ptr<target> make_fault_injection(std::unique_ptr<target> inner,
                                             std::shared_ptr<fault_attr> timeout,
                                             std::shared_ptr<fault_attr> requeue,
                                             std::shared_ptr<fault_attr> init_hctx)
{
    return std::make_unique<fault_target>(std::move(inner), std::move(timeout), std::move(requeue),
                                          std::move(init_hctx));
}

}  // namespace softblk::core
