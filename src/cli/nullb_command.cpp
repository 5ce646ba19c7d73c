// `softblk nullb mount|umount`: the directory shaped like null_blk's
// configfs tree (nullb_fs/), a client of the daemon.
#include <memory>
#include <string>

#include "nullb_fs.hpp"
#include "run_dir.hpp"
#include "subcommand.hpp"

namespace softblk::cli {

void define_nullb(CLI::App& app, subcommand_table& table)
{
    CLI::App* nullb_cmd = app.add_subcommand(
        "nullb", "a directory shaped like null_blk's /sys/kernel/config/nullb (FUSE)");
    nullb_cmd->require_subcommand(1);

    auto nullb = std::make_shared<nullb_fs_options>();
    CLI::App* mount_cmd = nullb_cmd->add_subcommand(
        "mount", "serve the tree at DIR: mkdir DIR/NAME, echo 1 > DIR/NAME/power, rmdir ...");
    mount_cmd->add_option("dir", nullb->mount_point, "an existing directory")->required();
    mount_cmd->add_flag("--foreground", nullb->foreground, "serve in this process until unmounted");
    mount_cmd->add_option("--export", nullb->export_type,
                          "export type of the devices made by mkdir (default: as `add`)");
    mount_cmd
        ->add_option("--export-opt", nullb->export_options,
                     "their export options key=value (repeatable)")
        ->allow_extra_args(false);
    table.push_back({mount_cmd, [nullb] {
                         auto paths = resolve_run_paths();
                         if (!paths) {
                             return fail(paths.error());
                         }
                         return run_nullb_fs(*paths, *nullb);
                     }});

    auto umount_dir = std::make_shared<std::string>();
    CLI::App* umount_cmd = nullb_cmd->add_subcommand("umount", "unmount the tree at DIR");
    umount_cmd->add_option("dir", *umount_dir, "its mount point")->required();
    table.push_back({umount_cmd, [umount_dir] { return unmount_nullb_fs(*umount_dir); }});
}

}  // namespace softblk::cli
