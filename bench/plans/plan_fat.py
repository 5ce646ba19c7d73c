"""Plan `fat`: the host part of the unikernel FAT before/after table
(../shared/references/hermit-virtio-blk-fat-pr.txt: sequential reads with
a 64 KiB buffer, writes with a 16 KiB buffer, MiB/s; requests; create
latency). softblk-bench-fat --before runs the FAT library on a
memory-backed softblk device "before" (one sector per request, the
smallest caches, no read-ahead) and "after" (its defaults), with the
1 MiB write-behind variant, the FUSE mount (root), mtools and a memcpy of
the same buffers as the bound. One program run per round."""

import os
import re

from runner import Failed, Skip, Unit, missing_tools

NAME = "fat"
NEEDS_ROOT = False  # the FUSE rows need it and are skipped without it
DESCRIPTION = "FAT library before/after (one sector per request), FUSE mount, mtools"

# Row of softblk-bench-fat's table -> (system, config)
_ROWS = [
    (r"^library, before", "softblk", "before"),
    (r"^library, 1 MiB write-behind", "softblk", "after, 1 MiB write-behind"),
    (r"^library \(fat::memory_block_device\)", "softblk", "after, library memory device"),
    (r"^library$", "softblk", "after"),
    (r"^FUSE mount, -o direct_io", "softblk", "FUSE mount, direct_io"),
    (r"^FUSE mount \(default options\)", "softblk", "FUSE mount, default options"),
    (r"^FUSE mount, -o ", "softblk", "FUSE mount, given options"),
    (r"^mtools", "mtools", "mcopy, image in /dev/shm"),
    (r"^memcpy", "memcpy", "one copy of the same buffers (bound)"),
]


def _num(cell):
    try:
        return float(cell)
    except ValueError:
        return None


def parse(text):
    """softblk-bench-fat's Markdown table -> [(system, config, columns)]."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("| path") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) not in (9, 10):  # 10: with the write-only open's writes
            continue
        for pattern, system, config in _ROWS:
            if re.search(pattern, cells[0]):
                rows.append((system, config, [_num(c) for c in cells[1:]]))
                break
    if not rows:
        raise Failed("softblk-bench-fat printed no table")
    return rows


def samples(rows, command):
    out = []
    for system, config, c in rows:
        seq_w, seq_r, rand_r, rand_w, create_us, delete_us, req_w, req_r = c[:8]
        seq_w_only = c[8] if len(c) > 8 else None
        base = {"config": config}
        figures = [
            ({"workload": "seq-write", "bs": 16384}, None, seq_w, {"requests_per_mib": req_w}),
            ({"workload": "seq-write-wronly", "bs": 16384}, None, seq_w_only, {}),
            ({"workload": "seq-read", "bs": 65536}, None, seq_r, {"requests_per_mib": req_r}),
            ({"workload": "randread", "bs": 4096}, rand_r, None, {}),
            ({"workload": "randwrite", "bs": 4096}, rand_w, None, {}),
            ({"workload": "create"}, 1e6 / create_us if create_us else None, None,
             {"create_us": create_us}),
            ({"workload": "delete"}, 1e6 / delete_us if delete_us else None, None,
             {"delete_us": delete_us}),
        ]
        for case, iops, mib_s, extra in figures:
            if iops is None and mib_s is None:
                continue  # a figure the row does not have (mtools has no random I/O)
            out.append({"case": {**base, **case}, "system": system, "iops": iops, "mib_s": mib_s,
                        "extra": {k: v for k, v in extra.items() if v is not None},
                        "command": command})
    return out


def _sizes(mode):
    if mode == "smoke":
        return ["--volume-mib", "64", "--file-mib", "8", "--files", "200", "--random-ops", "500"]
    if mode == "quick":
        return ["--volume-mib", "256", "--file-mib", "64", "--files", "1000", "--random-ops", "5000"]
    return []  # the program's defaults: 512 MiB volume, 256 MiB file, 5000 files


def setup(ctx):
    program = ctx.tools.get("bench-fat")
    if not program:
        raise Skip("softblk-bench-fat is not built (ninja softblk-bench-fat)")
    args = [program, "--before", *_sizes(ctx.settings["mode"])]
    fuse_reason = None
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        args.append("--no-fuse")
        fuse_reason = "the FUSE mount needs root and /dev/fuse"
    mtools_reason = "mtools is not installed" if missing_tools("mcopy") else None

    def measure(ctx):
        p = ctx.run(args, timeout=1800, check=False)
        rows = parse(p.stdout)
        if p.returncode != 0:
            raise Failed(f"softblk-bench-fat exited with {p.returncode}: "
                         f"{(p.stderr.strip() or p.stdout.strip())[-400:]}")
        out = samples(rows, " ".join(args))
        skipped = [("softblk", "FUSE mount", fuse_reason), ("mtools", "mcopy", mtools_reason)]
        for system, config, reason in skipped:
            if reason:
                out.append({"case": {"config": config}, "system": system, "status": "skipped",
                            "error": reason})
        return out

    return [Unit(NAME, {"configs": "before, after, FUSE, mtools"}, "softblk", measure,
                 seconds=10 if ctx.settings["mode"] == "smoke" else 60)]
