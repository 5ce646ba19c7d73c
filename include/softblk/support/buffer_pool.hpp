// Page-aligned I/O buffers in power-of-two size classes (4 KiB << 0..15,
// up to 128 MiB), recycled so that a front end's steady state allocates
// nothing. Free buffers beyond `keep_bytes` go back to the allocator.
// One owner thread (a front end's event loop or worker); not thread-safe.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <vector>

namespace softblk {

class buffer_pool {
public:
    static constexpr unsigned k_classes = 16;
    static constexpr uint32_t k_smallest = 4096;

    explicit buffer_pool(uint64_t keep_bytes = 128ull << 20) : _keep(keep_bytes) {}
    ~buffer_pool()
    {
        for (auto& list : _free) {
            for (void* p : list) {
                std::free(p);
            }
        }
    }
    buffer_pool(const buffer_pool&) = delete;
    buffer_pool& operator=(const buffer_pool&) = delete;

    // The class of the smallest buffer that holds `bytes`, or k_classes if
    // none does.
    static unsigned size_class(uint64_t bytes)
    {
        unsigned c = 0;
        while (c < k_classes && (uint64_t{k_smallest} << c) < bytes) {
            ++c;
        }
        return c;
    }
    static uint64_t class_bytes(unsigned cls) { return uint64_t{k_smallest} << cls; }

    // A buffer of at least `bytes` (4 KiB aligned), its class in `cls`;
    // nullptr when `bytes` is above the largest class or memory is out.
    // The caller gives it back with put(buffer, cls).
    uint8_t* get(uint64_t bytes, unsigned& cls)
    {
        cls = size_class(bytes);
        if (cls >= k_classes) {
            return nullptr;
        }
        if (!_free[cls].empty()) {
            void* p = _free[cls].back();
            _free[cls].pop_back();
            _free_bytes -= class_bytes(cls);
            return static_cast<uint8_t*>(p);
        }
        return static_cast<uint8_t*>(std::aligned_alloc(k_smallest, class_bytes(cls)));
    }

    void put(uint8_t* p, unsigned cls)
    {
        const uint64_t size = class_bytes(cls);
        if (_free_bytes + size > _keep) {
            std::free(p);
            return;
        }
        _free[cls].push_back(p);
        _free_bytes += size;
    }

    // Bytes held in free buffers (not counting those handed out).
    uint64_t free_bytes() const { return _free_bytes; }

private:
    uint64_t _keep;
    std::vector<void*> _free[k_classes];
    uint64_t _free_bytes = 0;
};

}  // namespace softblk
