#include "sector_cache.hpp"

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>

namespace softblk::fat::detail {

namespace {
constexpr uint32_t k_max_run_sectors = 1024;
}

sector_cache::sector_cache(block_device& device, uint32_t sector_bytes, uint32_t device_ratio,
                           uint32_t capacity, uint32_t read_ahead, bool pin_dirty)
    : _device(device),
      _sector_bytes(sector_bytes),
      _ratio(device_ratio),
      _capacity(std::max<uint32_t>(capacity, 32)),
      _read_ahead(std::clamp<uint32_t>(read_ahead, 1, std::max<uint32_t>(capacity, 32) / 4)),
      _pin_dirty(pin_dirty)
{
}

void sector_cache::erase(slot_list::iterator it)
{
    _index.erase(it->sector);
    if (it->dirty) {
        _dirty.erase(it->sector);
        it->dirty = false;
        _spare.splice(_spare.end(), _pin_dirty ? _pinned : _lru, it);
    } else {
        _spare.splice(_spare.end(), _lru, it);
    }
}

int sector_cache::make_room()
{
    while (_index.size() >= _capacity) {
        if (_lru.empty()) {
            return 0;  // everything is pinned dirty: grow until the next write-back
        }
        auto victim = std::prev(_lru.end());
        if (victim->dirty) {
            int rc = write_back();
            if (rc < 0) {
                return rc;
            }
            victim = std::prev(_lru.end());
        }
        erase(victim);
    }
    return 0;
}

sector_cache::slot_list::iterator sector_cache::install(uint64_t sector)
{
    if (_spare.empty()) {
        _spare.emplace_back();
        _spare.back().data = std::make_unique<uint8_t[]>(_sector_bytes);
    }
    auto it = _spare.begin();
    it->sector = sector;
    it->dirty = false;
    _lru.splice(_lru.begin(), _spare, it);
    _index.emplace(sector, it);
    _low = std::min(_low, sector);
    _high = std::max(_high, sector);
    return it;
}

int sector_cache::get(uint64_t sector, uint64_t run_end, fill how, uint8_t*& out)
{
    auto found = _index.find(sector);
    if (found != _index.end()) {
        ++_hits;
        auto it = found->second;
        if (!it->dirty || !_pin_dirty) {
            _lru.splice(_lru.begin(), _lru, it);
        }
        out = it->data.get();
        return 0;
    }
    ++_misses;
    int rc = make_room();
    if (rc < 0) {
        return rc;
    }
    if (how == fill::zero) {
        auto it = install(sector);
        std::memset(it->data.get(), 0, _sector_bytes);
        out = it->data.get();
        return 0;
    }
    uint64_t count = std::min<uint64_t>(_read_ahead, run_end > sector ? run_end - sector : 1);
    count = std::max<uint64_t>(count, 1);
    _staging.resize(count * _sector_bytes);
    rc = _device.read(sector * _ratio, static_cast<uint32_t>(count * _ratio), _staging.data());
    if (rc < 0) {
        return rc;
    }
    // Install the following sectors first (older in LRU order), then the
    // one asked for, so it ends up most recent.
    for (uint64_t i = count; i-- > 1;) {
        if (_index.count(sector + i) != 0 || _index.size() + 1 >= _capacity) {
            continue;
        }
        auto it = install(sector + i);
        std::memcpy(it->data.get(), _staging.data() + i * _sector_bytes, _sector_bytes);
    }
    auto it = install(sector);
    std::memcpy(it->data.get(), _staging.data(), _sector_bytes);
    out = it->data.get();
    return 0;
}

void sector_cache::mark_dirty(uint64_t sector)
{
    auto found = _index.find(sector);
    assert(found != _index.end());
    auto it = found->second;
    if (it->dirty) {
        return;
    }
    it->dirty = true;
    _dirty.insert(sector);
    if (_pin_dirty) {
        _pinned.splice(_pinned.begin(), _lru, it);
    }
}

int sector_cache::write_back()
{
    if (_dirty.empty()) {
        return 0;
    }
    std::vector<uint64_t> sectors(_dirty.begin(), _dirty.end());
    size_t i = 0;
    int result = 0;
    while (i < sectors.size()) {
        size_t j = i + 1;
        while (j < sectors.size() && sectors[j] == sectors[j - 1] + 1 &&
               j - i < k_max_run_sectors) {
            ++j;
        }
        size_t count = j - i;
        _staging.resize(count * _sector_bytes);
        for (size_t k = 0; k < count; ++k) {
            std::memcpy(_staging.data() + k * _sector_bytes, _index.at(sectors[i + k])->data.get(),
                        _sector_bytes);
        }
        int rc = _device.write(sectors[i] * _ratio, static_cast<uint32_t>(count * _ratio),
                               _staging.data());
        ++_runs_written;
        if (rc < 0) {
            result = rc;  // keep them dirty; report the first error
        } else {
            for (size_t k = 0; k < count; ++k) {
                auto it = _index.at(sectors[i + k]);
                it->dirty = false;
                _dirty.erase(sectors[i + k]);
                if (_pin_dirty) {
                    _lru.splice(_lru.begin(), _pinned, it);
                }
            }
        }
        i = j;
    }
    return result;
}

void sector_cache::overlay_dirty(uint64_t first, uint64_t count, uint8_t* buffer) const
{
    for (auto it = _dirty.lower_bound(first); it != _dirty.end() && *it < first + count; ++it) {
        std::memcpy(buffer + (*it - first) * _sector_bytes, _index.at(*it)->data.get(),
                    _sector_bytes);
    }
}

void sector_cache::invalidate(uint64_t first, uint64_t count)
{
    if (_index.empty()) {
        _low = UINT64_MAX;
        _high = 0;
        return;
    }
    if (first > _high || first + count <= _low) {
        return;  // outside every sector ever cached since the cache was last empty
    }
    if (count > _index.size() * 4) {
        // Cheaper to walk the cache than the range.
        std::vector<slot_list::iterator> victims;
        for (auto& [sector, it] : _index) {
            if (sector >= first && sector < first + count) {
                victims.push_back(it);
            }
        }
        for (auto it : victims) {
            erase(it);
        }
        return;
    }
    for (uint64_t s = first; s < first + count; ++s) {
        auto found = _index.find(s);
        if (found != _index.end()) {
            erase(found->second);
        }
    }
}

void sector_cache::discard_all()
{
    _index.clear();
    _dirty.clear();
    _lru.clear();
    _pinned.clear();
    _spare.clear();
    _low = UINT64_MAX;
    _high = 0;
}

}  // namespace softblk::fat::detail
