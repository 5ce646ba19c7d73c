// The shape of null_blk's configfs tree (/sys/kernel/config/nullb), made
// from the null target's option table: which names a device directory
// holds, which are directories (the fault-injection groups), what
// `features` says. No FUSE and no daemon here, so that the shape can be
// tested alone; nullb_fs.cpp serves it.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <sys/types.h>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <softblk/options.hpp>

namespace softblk::cli {

// The file softblk adds to each device directory: where the powered-on
// device is exported (/dev/ublkbN, /dev/loopN, the FUSE file or the NBD
// URI), empty while powered off.
inline constexpr std::string_view k_device_file = "device";

class nullb_tree {
public:
    struct entry {
        std::string name;
        bool directory = false;
        mode_t mode = 0;  // permission bits, as configfs gives them
    };

    // `defs`: every option of the null target type (options_for("null")).
    explicit nullb_tree(std::span<const option_def> defs);

    // What a device directory holds: each attribute (0644; write-only ones
    // 0200), each fault-injection group directory (0755), and `device`
    // (0444). Module parameters (creation-only options) are not files.
    std::vector<entry> device_entries() const;
    // The files of group directory `group` ("timeout_inject").
    std::vector<entry> group_entries(std::string_view group) const;
    bool is_group(std::string_view name) const;

    // The attribute at `path` below a device directory ("size",
    // "timeout_inject/probability"), or nullptr.
    const option_def* attribute(std::string_view path) const;

    // The read of /sys/kernel/config/nullb/features: Linux 6.12's list, in
    // its order, of the attributes softblk has, then softblk's other
    // top-level attributes, comma-separated, with a newline.
    std::string features() const;

    // The `device` file's content from the export's describe() (the kernel
    // device, else the file or the URI), newline-terminated; empty when
    // powered off or not exported.
    static std::string device_text(int power, const nlohmann::json& exp);

private:
    std::vector<option_def> _defs;  // the ones that are files
};

}  // namespace softblk::cli
