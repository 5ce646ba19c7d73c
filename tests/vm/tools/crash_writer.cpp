// softblk-crash-writer: the writer and the checker of the crash-consistency
// tests of the file target (tests/vm/tests/file_crash.sh) and the zloop
// target (tests/vm/tests/zloop_crash.sh).
//
//   softblk-crash-writer write DEVICE LOG BLOCKS [sequential]
//     Writes 4 KiB blocks to DEVICE (O_DIRECT, one at a time) until a write
//     or flush fails, and records in LOG, after each acknowledgement,
//     "W seq" (the write of sequence number seq returned) and "F seq" (an
//     fdatasync returned after every write up to seq was acknowledged). The
//     sequence continues from the last one in LOG, so rounds append. Write
//     seq goes to block (seq * 65537) mod BLOCKS: no block is written twice
//     while seq < BLOCKS (65537 is prime; BLOCKS must not be a multiple).
//     With `sequential`, write seq goes to block seq: one write after the
//     other at the write pointer of a zoned device (no conventional zones,
//     zone capacity = zone size) fills its zones in order. A line "S seq"
//     in LOG (the test's: after a crash the write pointer may be past the
//     last acknowledged write, by writes that landed unacknowledged) makes
//     the next round start at seq.
//   softblk-crash-writer check IMAGE LOG BLOCKS [sequential]
//     Reads IMAGE (the device's backing file) and checks that every write
//     recorded as flushed is there, whole; counts the acknowledged writes
//     not flushed yet that are there too. Exit 0 when no flushed write is
//     missing, 1 otherwise, and prints one summary line. IMAGE may be the
//     device itself, restarted.
//
// A block holds: magic, seq, a checksum of the rest, then bytes derived
// from seq, so a torn, stale or misplaced block is told from the right one.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

constexpr size_t k_block = 4096;
constexpr uint64_t k_magic = 0x534f4654'424c4b57ull;  // "SOFTBLKW"
constexpr uint64_t k_stride = 65537;                  // prime: seq -> block is one-to-one
constexpr uint64_t k_flush_every = 8;

// Where write seq goes: spread over the device, or one after the other.
bool g_sequential = false;

uint64_t slot_of(uint64_t seq, uint64_t blocks)
{
    return g_sequential ? seq : (seq * k_stride) % blocks;
}

uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

void fill_block(char* b, uint64_t seq)
{
    uint64_t words[k_block / 8];
    for (size_t i = 3; i < k_block / 8; ++i) {
        words[i] = mix(seq * 1024 + i);
    }
    uint64_t sum = 0;
    for (size_t i = 3; i < k_block / 8; ++i) {
        sum = mix(sum ^ words[i]);
    }
    words[0] = k_magic;
    words[1] = seq;
    words[2] = sum;
    std::memcpy(b, words, k_block);
}

// Last "W" and "F" sequence numbers in the log (-1 if none), and every W.
struct log_state {
    int64_t last_write = -1;
    int64_t last_flush = -1;
    int64_t skip_to = -1;
    std::vector<uint64_t> writes;
};

log_state read_log(const char* path)
{
    log_state s;
    FILE* f = std::fopen(path, "r");
    if (f == nullptr) {
        return s;
    }
    char kind = 0;
    unsigned long long seq = 0;
    while (std::fscanf(f, " %c %llu", &kind, &seq) == 2) {
        if (kind == 'W') {
            s.last_write = static_cast<int64_t>(seq);
            s.writes.push_back(seq);
        } else if (kind == 'F') {
            s.last_flush = static_cast<int64_t>(seq);
        } else if (kind == 'S') {
            s.skip_to = static_cast<int64_t>(seq);
        }
    }
    std::fclose(f);
    return s;
}

void record(int log_fd, char kind, uint64_t seq)
{
    char line[32];
    const int n =
        std::snprintf(line, sizeof line, "%c %llu\n", kind, static_cast<unsigned long long>(seq));
    // Unbuffered: the writer may be stopped at any point after this.
    if (::write(log_fd, line, static_cast<size_t>(n)) != n) {
        std::perror("log");
        std::exit(3);
    }
}

int run_write(const char* device, const char* log_path, uint64_t blocks)
{
    const log_state s = read_log(log_path);
    const int fd = ::open(device, O_RDWR | O_DIRECT);
    if (fd < 0) {
        std::fprintf(stderr, "open %s: %s\n", device, std::strerror(errno));
        return 2;
    }
    const int log_fd = ::open(log_path, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (log_fd < 0) {
        std::perror(log_path);
        return 2;
    }
    char* buf = static_cast<char*>(std::aligned_alloc(k_block, k_block));
    uint64_t seq = static_cast<uint64_t>(std::max(s.last_write + 1, s.skip_to));
    uint64_t written = 0;
    for (;; ++seq) {
        if (seq >= blocks) {
            std::fprintf(stderr, "every block written once: give more blocks\n");
            return 2;
        }
        fill_block(buf, seq);
        const ssize_t n =
            ::pwrite(fd, buf, k_block, static_cast<off_t>(slot_of(seq, blocks) * k_block));
        if (n != static_cast<ssize_t>(k_block)) {
            break;  // the daemon died under us: the round ends
        }
        record(log_fd, 'W', seq);
        ++written;
        if (written % k_flush_every == 0) {
            if (::fdatasync(fd) != 0) {
                break;
            }
            record(log_fd, 'F', seq);
        }
    }
    std::printf("writer: %llu writes acknowledged this round, stopped at seq %llu\n",
                static_cast<unsigned long long>(written), static_cast<unsigned long long>(seq));
    return 0;
}

int run_check(const char* image, const char* log_path, uint64_t blocks)
{
    const log_state s = read_log(log_path);
    const int fd = ::open(image, O_RDONLY);
    if (fd < 0) {
        std::fprintf(stderr, "open %s: %s\n", image, std::strerror(errno));
        return 2;
    }
    char got[k_block];
    char want[k_block];
    uint64_t flushed = 0, missing = 0, acked_only = 0, acked_only_present = 0;
    for (uint64_t seq : s.writes) {
        fill_block(want, seq);
        const ssize_t n =
            ::pread(fd, got, k_block, static_cast<off_t>(slot_of(seq, blocks) * k_block));
        const bool present =
            n == static_cast<ssize_t>(k_block) && std::memcmp(got, want, k_block) == 0;
        if (static_cast<int64_t>(seq) <= s.last_flush) {
            ++flushed;
            if (!present) {
                if (missing < 10) {
                    std::fprintf(stderr, "missing: flushed write seq %llu (block %llu)\n",
                                 static_cast<unsigned long long>(seq),
                                 static_cast<unsigned long long>(slot_of(seq, blocks)));
                }
                ++missing;
            }
        } else {
            ++acked_only;
            acked_only_present += present ? 1 : 0;
        }
    }
    std::printf(
        "check: %llu acknowledged+flushed writes, %llu missing; %llu acknowledged not yet "
        "flushed, %llu of them present\n",
        static_cast<unsigned long long>(flushed), static_cast<unsigned long long>(missing),
        static_cast<unsigned long long>(acked_only),
        static_cast<unsigned long long>(acked_only_present));
    return missing == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv)
{
    if (argc != 5 && !(argc == 6 && std::string(argv[5]) == "sequential")) {
        std::fprintf(stderr,
                     "usage: %s write DEVICE LOG BLOCKS [sequential] | check IMAGE LOG BLOCKS "
                     "[sequential]\n",
                     argv[0]);
        return 2;
    }
    g_sequential = argc == 6;
    const uint64_t blocks = std::strtoull(argv[4], nullptr, 10);
    if (blocks < 2 || (!g_sequential && blocks % k_stride == 0)) {
        std::fprintf(stderr, "BLOCKS must be prime to %llu\n",
                     static_cast<unsigned long long>(k_stride));
        return 2;
    }
    const std::string mode = argv[1];
    if (mode == "write") {
        return run_write(argv[2], argv[3], blocks);
    }
    if (mode == "check") {
        return run_check(argv[2], argv[3], blocks);
    }
    std::fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
}
