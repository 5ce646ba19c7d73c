// softblk-zone-steps: one random sequence of zone operations and writes on a
// zoned block device, with a transcript line per step (what was done, the
// errno, and every zone's condition and write pointer afterwards). Run with
// the same seed on two devices of the same geometry and limits (the
// kernel's null_blk and softblk's zoned null over ublk), the transcripts
// must be identical: tests/vm/tests/zoned_ublk.sh compares them.
//
//   softblk-zone-steps DEVICE SEED STEPS
//
// Operations: writes at the write pointer (some crossing the zone
// capacity), writes off it, reads (a checksum of data below and beyond the
// write pointer), BLKOPENZONE, BLKCLOSEZONE, BLKFINISHZONE, BLKRESETZONE of
// one zone and of the whole device (reset all). Writes are O_DIRECT.
// Exit 0 when every step ran (whatever their errors), 1 on a usage or
// set-up error.
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <linux/blkzoned.h>
#include <linux/fs.h>
#include <random>
#include <string>
#include <sys/ioctl.h>
#include <unistd.h>
#include <vector>

namespace {

struct device_info {
    int fd = -1;
    uint32_t block = 512;  // logical block size, bytes
    uint64_t zone_sectors = 0;
    uint32_t nr_zones = 0;
};

std::vector<blk_zone> report(const device_info& d)
{
    const size_t bytes = sizeof(blk_zone_report) + size_t{d.nr_zones} * sizeof(blk_zone);
    std::vector<char> buf(bytes);
    auto* r = reinterpret_cast<blk_zone_report*>(buf.data());
    r->sector = 0;
    r->nr_zones = d.nr_zones;
    if (ioctl(d.fd, BLKREPORTZONE, r) != 0) {
        std::fprintf(stderr, "BLKREPORTZONE: %s\n", std::strerror(errno));
        std::exit(1);
    }
    std::vector<blk_zone> zones(r->nr_zones);
    std::memcpy(zones.data(), buf.data() + sizeof(blk_zone_report),
                zones.size() * sizeof(blk_zone));
    return zones;
}

// "cond:wp" per zone, wp relative to the zone start in blocks ("-" when the
// zone has none: conventional, full, read-only, offline, per the driver).
std::string state(const device_info& d, const std::vector<blk_zone>& zones)
{
    std::string s;
    for (const blk_zone& z : zones) {
        char item[48];
        const bool none = z.type == BLK_ZONE_TYPE_CONVENTIONAL || z.wp == UINT64_MAX ||
                          z.cond == BLK_ZONE_COND_FULL;
        if (none) {
            std::snprintf(item, sizeof item, " %u:-", unsigned{z.cond});
        } else {
            const uint64_t blocks = (uint64_t{z.wp} - uint64_t{z.start}) * 512 / d.block;
            std::snprintf(item, sizeof item, " %u:%" PRIu64, unsigned{z.cond}, blocks);
        }
        s += item;
    }
    return s;
}

const char* name_of(int err)
{
    if (err == 0) {
        return "ok";
    }
    const char* n = strerrorname_np(err);
    return n != nullptr ? n : "E?";
}

uint64_t fnv(const char* p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; ++i) {
        h = (h ^ static_cast<unsigned char>(p[i])) * 1099511628211ull;
    }
    return h;
}

}  // namespace

int main(int argc, char** argv)
{
    if (argc != 4) {
        std::fprintf(stderr, "usage: %s DEVICE SEED STEPS\n", argv[0]);
        return 1;
    }
    device_info d;
    d.fd = open(argv[1], O_RDWR | O_DIRECT);
    if (d.fd < 0) {
        std::fprintf(stderr, "%s: %s\n", argv[1], std::strerror(errno));
        return 1;
    }
    int lbs = 0;
    uint32_t zone_sectors = 0;
    uint32_t nr_zones = 0;
    if (ioctl(d.fd, BLKSSZGET, &lbs) != 0 || ioctl(d.fd, BLKGETZONESZ, &zone_sectors) != 0 ||
        ioctl(d.fd, BLKGETNRZONES, &nr_zones) != 0 || zone_sectors == 0) {
        std::fprintf(stderr, "%s: not a zoned block device\n", argv[1]);
        return 1;
    }
    d.block = static_cast<uint32_t>(lbs);
    d.zone_sectors = zone_sectors;
    d.nr_zones = nr_zones;
    const uint64_t seed = std::strtoull(argv[2], nullptr, 0);
    const long steps = std::strtol(argv[3], nullptr, 0);
    std::mt19937_64 rng(seed);

    const size_t max_blocks = 64;
    void* mem = nullptr;
    if (posix_memalign(&mem, 4096, max_blocks * d.block) != 0) {
        return 1;
    }
    char* buf = static_cast<char*>(mem);
    const uint64_t zone_bytes = d.zone_sectors * 512;
    std::printf("geometry block=%u zone_sectors=%" PRIu64 " zones=%u\n", d.block, d.zone_sectors,
                d.nr_zones);
    // One report per step: the state printed after a step is the state the
    // next step starts from (a report is a round trip to the driver, the
    // bulk of a step's time in the VM lab).
    std::vector<blk_zone> zones = report(d);
    std::printf("0 start ->%s\n", state(d, zones).c_str());

    for (long step = 1; step <= steps; ++step) {
        const uint32_t zi = static_cast<uint32_t>(rng() % d.nr_zones);
        const blk_zone& z = zones[zi];
        const uint64_t start = z.start * 512;
        const uint64_t cap = z.capacity * 512;
        const bool has_wp = z.type != BLK_ZONE_TYPE_CONVENTIONAL && z.wp != UINT64_MAX &&
                            z.cond != BLK_ZONE_COND_FULL;
        const uint64_t wp = has_wp ? z.wp * 512 : start;
        const unsigned pick = static_cast<unsigned>(rng() % 100);
        size_t blocks = 1 + rng() % max_blocks;
        char what[96];
        int err = 0;
        if (pick < 45) {
            // A write: mostly at the write pointer, sometimes off it, sometimes
            // crossing the zone capacity.
            const unsigned kind = static_cast<unsigned>(rng() % 10);
            uint64_t off = wp;
            if (kind == 0) {
                off = start + (rng() % (cap / d.block)) * d.block;  // anywhere in the zone
            } else if (kind == 1 && cap / d.block > blocks) {
                off = start + cap - (blocks / 2 + 1) * d.block;  // across the capacity
            }
            if (off + blocks * d.block > start + zone_bytes) {
                blocks = (start + zone_bytes - off) / d.block;
            }
            if (blocks == 0) {
                blocks = 1;
                off = start;
            }
            for (size_t i = 0; i < blocks * d.block; ++i) {
                buf[i] = static_cast<char>((step * 31 + i) & 0xff);
            }
            const ssize_t n = pwrite(d.fd, buf, blocks * d.block, static_cast<off_t>(off));
            err = n < 0 ? errno : (static_cast<size_t>(n) != blocks * d.block ? EIO : 0);
            std::snprintf(what, sizeof what, "write z%u +%" PRIu64 " %zu", zi,
                          (off - start) / d.block, blocks);
        } else if (pick < 55) {
            // A read around the write pointer: the checksum covers data below
            // it and what the device returns beyond it.
            uint64_t off = wp >= start + 8 * d.block ? wp - 8 * d.block : start;
            if (off + blocks * d.block > start + zone_bytes) {
                blocks = (start + zone_bytes - off) / d.block;
            }
            const ssize_t n = pread(d.fd, buf, blocks * d.block, static_cast<off_t>(off));
            err = n < 0 ? errno : 0;
            std::snprintf(what, sizeof what, "read z%u +%" PRIu64 " %zu sum %016" PRIx64, zi,
                          (off - start) / d.block, blocks,
                          n > 0 ? fnv(buf, static_cast<size_t>(n)) : 0);
        } else {
            blk_zone_range range{.sector = z.start, .nr_sectors = d.zone_sectors};
            unsigned long request = 0;
            const char* op = nullptr;
            if (pick < 68) {
                request = BLKOPENZONE;
                op = "open";
            } else if (pick < 80) {
                request = BLKCLOSEZONE;
                op = "close";
            } else if (pick < 89) {
                request = BLKFINISHZONE;
                op = "finish";
            } else if (pick < 98) {
                request = BLKRESETZONE;
                op = "reset";
            } else {
                request = BLKRESETZONE;
                op = "reset-all";
                range.sector = 0;
                range.nr_sectors = uint64_t{d.nr_zones} * d.zone_sectors;
            }
            err = ioctl(d.fd, request, &range) != 0 ? errno : 0;
            std::snprintf(what, sizeof what, "%s z%u", op, zi);
        }
        zones = report(d);
        std::printf("%ld %s -> %s%s\n", step, what, name_of(err), state(d, zones).c_str());
    }
    std::free(mem);
    close(d.fd);
    return 0;
}
