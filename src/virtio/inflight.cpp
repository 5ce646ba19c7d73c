#include <softblk/virtio/inflight.hpp>

#include <algorithm>
#include <cstring>

namespace softblk::virtio {

bool inflight_tracker::attach(void* region, uint32_t queue_size)
{
    _header = static_cast<inflight_queue_header*>(region);
    _desc = reinterpret_cast<inflight_desc*>(_header + 1);
    _num = queue_size;
    _batch = 0;
    _counter = 1;
    if (_header->version != 1 || _header->desc_num != queue_size) {
        // Never used, or the front end changed the queue size (a reset):
        // nothing of it can be in flight.
        std::memset(region, 0, inflight_queue_bytes(queue_size));
        _header->version = 0;  // recover() marks it used and sets used_idx
        _header->desc_num = static_cast<uint16_t>(queue_size);
        return false;
    }
    return true;
}

unsigned inflight_tracker::recover(uint16_t used_idx_in_ring, std::vector<uint16_t>& heads)
{
    heads.clear();
    if (_header->version != 1) {
        _header->version = 1;
        _header->used_idx = used_idx_in_ring;
        _header->last_batch_head = 0;
        return 0;
    }
    if (_header->used_idx != used_idx_in_ring) {
        // The previous back end published a batch and died before it
        // cleared the batch's inflight marks: clear them now.
        const uint16_t batch = static_cast<uint16_t>(used_idx_in_ring - _header->used_idx);
        uint32_t i = _header->last_batch_head;
        for (uint32_t k = 0; k < batch && k < _num && i < _num; ++k) {
            _desc[i].inflight = 0;
            i = _desc[i].next;
        }
        _header->used_idx = used_idx_in_ring;
    }
    uint64_t highest = 0;
    for (uint32_t i = 0; i < _num; ++i) {
        if (_desc[i].inflight == 1) {
            heads.push_back(static_cast<uint16_t>(i));
            highest = std::max(highest, _desc[i].counter);
        } else {
            _desc[i].inflight = 0;
        }
    }
    std::stable_sort(heads.begin(), heads.end(), [this](uint16_t a, uint16_t b) {
        return _desc[a].counter < _desc[b].counter;
    });
    _counter = highest + 1;
    return static_cast<unsigned>(heads.size());
}

void inflight_tracker::taken(uint16_t head)
{
    if (head < _num) {
        _desc[head].counter = _counter++;
        _desc[head].inflight = 1;
    }
}

void inflight_tracker::returned(uint16_t head)
{
    if (head < _num) {
        _desc[head].next = _header->last_batch_head;
        _header->last_batch_head = head;
        ++_batch;
    }
}

void inflight_tracker::published(uint16_t used_idx)
{
    uint32_t i = _header->last_batch_head;
    for (uint16_t k = 0; k < _batch && i < _num; ++k) {
        _desc[i].inflight = 0;
        i = _desc[i].next;
    }
    _header->used_idx = used_idx;
    _batch = 0;
}

}  // namespace softblk::virtio
