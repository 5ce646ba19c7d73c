// The kernel block device an export yields (device_export::kernel_disk()):
// the device's queue choices applied to it through sysfs, in one place for
// every front end (start_export calls apply_disk_choices).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <softblk/device.hpp>
#include <softblk/frontend.hpp>
#include <softblk/types.hpp>

namespace softblk {

// The active I/O scheduler of `disk` ("none", "mq-deadline": the bracketed
// one of SYS_BLOCK/DISK/queue/scheduler). Errors: the file cannot be read
// or names none.
result<std::string> disk_scheduler(std::string_view sys_block, std::string_view disk);

// Writes `scheduler` to SYS_BLOCK/DISK/queue/scheduler. The error names the
// file and the errno (e.g. the scheduler is not built into this kernel).
result<void> set_disk_scheduler(std::string_view sys_block, std::string_view disk,
                                std::string_view scheduler);

// `exp` with `dev`'s choices applied to its kernel disk, if it has one
// (otherwise `exp` itself): no_sched=1 (null_blk's, which gives its disk no
// scheduler) writes "none" to the disk's scheduler; without it the kernel's
// default stays. A failed write leaves the export serving: the returned
// export's describe() adds "scheduler_error" and a "warning" saying so,
// and "scheduler" (read at describe time) always. On stop() the export puts
// back the scheduler the disk had, if the disk is still there with "none"
// (a loop device goes back to the pool as it was found). `sys_block`:
// "/sys/block" (another root in tests). Control thread.
std::unique_ptr<device_export> apply_disk_choices(device& dev, std::unique_ptr<device_export> exp,
                                                  std::string sys_block = "/sys/block");

}  // namespace softblk
