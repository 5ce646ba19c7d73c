// libsoftblk from C++ through the header-only softblk.hpp: a memory-backed
// null device written and read back. Exits 0 when the data matched.
#include <softblk.hpp>

#include <cstdio>
#include <vector>

int main()
{
    auto dev = softblk::lib::device::create("example-cpp", "null", "memory_backed=1 size=16");
    if (!dev) {
        std::fprintf(stderr, "softblk_example_cpp: %s\n", dev.error().message.c_str());
        return 1;
    }
    auto q = dev->get_queue(0);
    if (!q) {
        std::fprintf(stderr, "softblk_example_cpp: %s\n", q.error().message.c_str());
        return 1;
    }
    std::vector<std::byte> out(64 * 1024);
    std::vector<std::byte> in(out.size());
    for (size_t i = 0; i < out.size(); ++i) {
        out[i] = static_cast<std::byte>(i * 13);
    }
    auto written = q->wait_one(q->write(8192, out));
    auto read = written ? q->wait_one(q->read(8192, in)) : written;
    if (!read) {
        std::fprintf(stderr, "softblk_example_cpp: %s\n", read.error().message.c_str());
        return 1;
    }
    if (in != out) {
        std::fprintf(stderr, "softblk_example_cpp: the data read back differs\n");
        return 1;
    }
    std::printf("c++: %zu bytes written and read back\n", out.size());
    return 0;
}
