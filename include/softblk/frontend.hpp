// How front ends (FUSE single-file export, NBD, ublk ...) plug into the
// daemon: each registers an export type; `softblk add ... --export NAME`
// starts one on a device. The daemon, the CLI and the FAT tools reach them
// through this table only: the default export (default_rank), a line of
// `list` (summary), what `features` reports of the machine (host_features)
// and how another process opens an export (reach) are what each front end
// registers here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <softblk/device.hpp>
#include <softblk/options.hpp>
#include <softblk/types.hpp>

namespace softblk {

// Where the daemon keeps its state and what it may do.
struct export_context {
    // Per-daemon state directory (/run/softblk or $XDG_RUNTIME_DIR/softblk);
    // a front end puts its mount points and sockets below it.
    std::string run_dir;
    // Running as root: may attach loop devices, use /dev/ublk-control ...
    bool privileged = false;
};

// One running export of one device.
class device_export {
public:
    virtual ~device_export() = default;

    // What a user needs to reach the device, for `add`'s output and `list`:
    // e.g. {"file": "/run/softblk/fuse/d0/d0", "loop": "/dev/loop3"} or
    // {"uri": "nbd+unix:///d0?socket=/run/softblk/nbd.sock"}. Any thread.
    virtual nlohmann::json describe() const = 0;

    // Stops serving: detaches, unmounts, closes connections, joins its
    // threads. After it returns the device has no I/O from this export in
    // flight. Refuses (the export stays as it was) when in_use() says why;
    // the destructor stops whatever holds it. Idempotent. Runs on the
    // daemon's control thread or on a teardown thread of its own (so that
    // an export that cannot stop holds up no one else), never at the same
    // time as another call on this export; other exports may start and stop
    // meanwhile.
    virtual result<void> stop() = 0;

    // Why stop() would refuse now, e.g. "/dev/loop3 is mounted on /mnt
    // (ext4)"; empty when it would not. The daemon asks before a shutdown,
    // so that it does not pull a device from under a mounted file system.
    // Control thread; answers at once.
    virtual std::string in_use() const { return {}; }

    // Export options that make the export started again after a power
    // cycle reach the same kernel device (ublk: "id=N", the same
    // /dev/ublkbN); empty when there is no such thing. The daemon adds the
    // ones the user did not give, and starts without them if the device is
    // taken meanwhile. Control thread.
    virtual std::vector<std::string> restart_options() const { return {}; }

    // The kernel block device this export yields, as named under
    // /sys/block ("ublkb3", "loop5"); empty when it yields none (NBD,
    // vhost-user-blk, a FUSE file without loop). start_export applies the
    // device's queue choices to it (no_sched=1: the I/O scheduler "none").
    // Any thread.
    virtual std::string kernel_disk() const { return {}; }
};

// An export whose state outlives its process under a run directory (ublk's
// RUN_DIR/ublk/NAME.json), as its front end sees it now: whether starting
// that export takes over what the dead process left. Only the front end's
// own facts: what re-creates the device and the export (target type,
// options, export options) is the host library's state file.
struct saved_export {
    std::string device;  // the device's name
    // Starting the export on a device of this name, re-created as above,
    // takes over what was left (ublk: START/END_USER_RECOVERY on the same
    // /dev/ublkbN) instead of starting afresh: its process is gone and the
    // kernel kept the device for it.
    bool recoverable = false;
    // The front end's own view, for people and tests, e.g. {"dev_id": 0,
    // "state": "QUIESCED", "daemon_pid": 4711}.
    nlohmann::json state = nlohmann::json::object();
};

// How a process other than the one serving the export reaches it as a
// block device (export_type::reach): exactly one way is set.
struct export_reach {
    // Files or block nodes to open, the first that opens wins (a ublk
    // node; a FUSE file, then its loop device).
    std::vector<std::string> paths;
    // Or an NBD URI to connect to.
    std::string nbd_uri;
    // Or a softblk target type that drives the export, with its options
    // (vhost-user-blk: softblk's virtio driver on the socket).
    std::string target_type;
    std::vector<std::string> target_options;
    // Why opening may fail and what to do, appended to the error.
    std::string hint;
};

// One sample of an export's counters for `softblk metrics` (Prometheus'
// text format, src/host/metrics.hpp): the family's name after
// "softblk_export_" with its unit ("requests_total", "poll_seconds_total"),
// its help, whether it is a counter (else a gauge), the labels beside
// device and export ({"op", "read"}) and the value.
struct export_metric {
    std::string name;
    std::string help;
    bool counter = true;
    std::vector<std::pair<std::string, std::string>> labels;
    double value = 0;
};

struct export_type {
    std::string_view name;  // "fuse", "nbd", "ublk"
    std::string_view description;
    // Starts exporting `dev` (which outlives the export) with front-end
    // options ("key=value", e.g. "loop=0", "port=10809"). Control thread.
    std::function<result<std::unique_ptr<device_export>>(device& dev, const export_context& ctx,
                                                         std::span<const std::string> options)>
        start;
    // Removes what a crashed daemon left behind under ctx.run_dir (stale
    // FUSE mounts, loop devices, sockets). May be empty. Control thread.
    std::function<void(const export_context& ctx)> cleanup_stale;
    // Every export of this type whose state survives under ctx.run_dir
    // (what `cleanup_stale` keeps because a later process can take it
    // over, and the exports running now), in name order. May be empty: the
    // type keeps no state across processes. Control thread.
    std::function<result<std::vector<saved_export>>(const export_context& ctx)> saved_exports = {};
    // What this machine offers the front end beyond `available` (ublk: the
    // kernel driver's feature bits by name), as a JSON object; the error
    // says why the front end could not be asked. May be empty (nothing to
    // report). Control thread.
    std::function<result<nlohmann::json>()> host_features = {};
    // True when this front end works on this machine now (e.g. /dev/fuse
    // or /dev/ublk-control exists). May be empty (always available).
    std::function<bool()> available;
    // The export options `start` accepts (`--export-opt key=value`), for
    // `softblk features`. Empty when the type takes none.
    std::span<const option_def> options;
    // The front end carries zoned devices (zone geometry, report and
    // management, zone append). start_export refuses a zoned device to one
    // that does not. A zoned front end's threads attach as the owners of
    // the queues they drive (io_queue::attach_owner), so that the daemon's
    // zone commands reach an exported device through them.
    bool zoned = false;
    // The largest logical block size the front end carries with these
    // export options, and why (e.g. {4096, "ublk_drv limits logical_bs_shift
    // to the page size"}); start_export refuses a device with larger blocks,
    // naming the limit. Empty: no limit of its own.
    std::function<std::pair<uint32_t, std::string>(std::span<const std::string> options)>
        max_block_size = {};
    // Where the type stands among the exports `add` chooses from when it
    // names none: the available type of lowest rank that can carry the
    // device (zones, block size) is chosen. 0: never chosen by default.
    unsigned default_rank = 0;
    // The export's one-line state for `softblk list` from its describe()
    // (without the type's name, which the caller prints first), e.g.
    // "/dev/ublkb0 LIVE pid 4711 queues 1 depth 128". May be empty: the
    // caller then shows the first path of the description. Any thread.
    std::function<std::string(const nlohmann::json& description)> summary = {};
    // How another process on this machine opens the export as a block
    // device, from its describe() (for `softblk fat softblk:NAME`). May be
    // empty: the export cannot be opened from outside.
    std::function<result<export_reach>(const nlohmann::json& description)> reach = {};
    // The export's counters and current values from its describe(), for
    // `softblk metrics`; a family name means the same in every front end
    // that gives it (requests_total: requests served). May be empty: the
    // export has only the metrics every export has. Any thread.
    std::function<std::vector<export_metric>(const nlohmann::json& description)> metrics = {};
};

// Starts `type` on `dev`: what every caller uses instead of calling
// type.start directly, so that the checks every front end shares live in
// one place (a zoned device only to a front end with a zoned model, named
// in the error with the ones that have it), and so that an export with a
// kernel_disk() gets the device's scheduler choice (no_sched=1: "none"
// written to /sys/block/DISK/queue/scheduler; its describe() then has
// "scheduler", and "scheduler_error" with "warning" when the write failed,
// the device being served all the same). Control thread.
result<std::unique_ptr<device_export>> start_export(const export_type& type, device& dev,
                                                    const export_context& ctx,
                                                    std::span<const std::string> options);

// Why `type` cannot carry `dev` with export `options` (a zoned device to a
// front end without a zoned model, blocks larger than it takes), as the
// error start_export gives; success when it can. Any thread.
result<void> export_carries(const export_type& type, const device& dev,
                            std::span<const std::string> options);

// The export type `add` starts on `dev` when it names none: of the
// available types with a default_rank, the lowest-ranked that carries it.
// The error says why each candidate cannot (not available, no zones, block
// size) and to give --export. Control thread.
result<const export_type*> choose_default_export(const device& dev);

// The type choose_default_export picks for a device without (zoned=false)
// or with zones, on this machine now, ignoring block size; null when none
// can. For `softblk features`. Any thread.
const export_type* default_export_for(bool zoned);

// Where a person or program finds an export, from its describe(): the
// kernel block device first, then the file, URI or socket it offers
// instead; empty when it names none. Any thread.
std::string export_location(const nlohmann::json& description);

// True when `type` works on this machine now (its `available`). Any thread.
bool export_available(const export_type& type);

// Registers an export type (static initialiser in the front end's folder).
bool register_export_type(const export_type& type);
const export_type* find_export_type(std::string_view name);
std::vector<const export_type*> export_types();

}  // namespace softblk
