"""Plans `rnull` and `nullblk-4k` (VM lab): the kernel's C null_blk
against softblk's null target over ublk with the same settings
(memory-backed, 4 KiB blocks, irqmode 0, hw_queue_depth 256, scheduler
none), cell by cell in one boot (tests/vm/tests/rnull_compare.sh under
tests/vm/run-vm, QEMU TCG), fio psync as the rnull cover letter ran it.
One boot per round; within a boot the two devices alternate which goes
first. rnull: the cover letter's matrix (6 workloads x block sizes x
jobs; --quick 4k and 1m x 1-2 jobs, default 5 x 1-2-4, --full its 12
x 1-6); nullblk-4k: the C driver's single 4 KiB random-read figure."""

import os
import re

from runner import Failed, Skip, Unit, keep_log

WORKLOADS = ["randread", "randrw", "randwrite", "read", "readwrite", "write"]
ALL_BS = ["4k", "8k", "16k", "32k", "64k", "128k", "256k", "512k", "1m", "2m", "4m", "8m"]


def _bytes(bs):
    return int(bs[:-1]) << (10 if bs.endswith("k") else 20)


def matrix(name, mode):
    """(workloads, block sizes, jobs) of a plan in a mode."""
    if name == "nullblk-4k":
        return ["randread"], ["4k"], [1]
    if mode == "smoke":
        return ["randread"], ["4k"], [1]
    if mode == "quick":  # 24 cells: two rounds of 2 s runs in about four minutes
        return WORKLOADS, ["4k", "1m"], [1, 2]
    if mode == "full":
        return WORKLOADS, ALL_BS, [1, 2, 3, 4, 5, 6]
    return WORKLOADS, ["4k", "16k", "128k", "1m", "8m"], [1, 2, 4]


def parse(text):
    """rnull_compare.sh's lines -> (vm info, [sample records])."""
    vm = {}
    m = re.search(r"softblk-vm: init started at [0-9.]+ s, kernel (\S+), (\d+) cpus", text)
    if m:
        vm = {"kernel": m.group(1), "cpus": int(m.group(2))}
    records = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 9 or f[0] != "CELL":
            continue
        engine, wl, bs, jobs, dev, r, w, err = f[1:9]
        iops = float(r) + float(w)
        rec = {"case": {"workload": wl, "bs": _bytes(bs), "jobs": int(jobs),
                        "qd": 32 if engine == "io_uring" else 1, "engine": engine},
               "system": "null_blk" if dev == "null_blk" else "softblk",
               "iops": iops, "mib_s": iops * _bytes(bs) / 1048576.0,
               "extra": {"read_iops": float(r), "write_iops": float(w),
                         "export": None if dev == "null_blk" else "ublk"}}
        if err != "0":
            rec["status"] = "failed"
            rec["error"] = f"fio error {err}"
        records.append(rec)
    return vm, records


def guest_settings(name, mode, runtime):
    """What rnull_compare.sh runs for a plan in a mode: {"args" (the
    script's), "cpus", "mem" (MiB), "cells", "size", "region" (MiB)}."""
    workloads, bss, jobs = matrix(name, mode)
    size, region = (4096, 1024) if mode == "full" else (64, 16) if mode == "smoke" else (1024, 256)
    args = ["--engines", "psync", "--workloads", " ".join(workloads), "--bs", " ".join(bss),
            "--jobs", " ".join(str(j) for j in jobs), "--runtime", runtime, "--size", size,
            "--region", region]
    return {"args": args, "cpus": max(2, max(jobs)), "mem": 2 * region + 1024,
            "cells": len(workloads) * len(bss) * len(jobs), "size": size, "region": region}


def vm_skip_reason(p):
    """run-vm's exit 77: the SKIP line it or the guest printed."""
    why = next((x for x in p.stdout.splitlines() + p.stderr.splitlines() if "SKIP" in x),
               "the VM lab cannot run here")
    return f"VM lab: {why.strip()}"


class Plan:
    NEEDS_ROOT = False

    def __init__(self, name, description):
        self.NAME = name
        self.DESCRIPTION = description

    def setup(self, ctx):
        root = ctx.tools.get("source")
        run_vm = os.path.join(root, "tests", "vm", "run-vm") if root else None
        if not run_vm or not os.access(run_vm, os.X_OK):
            raise Skip("the VM lab (tests/vm/run-vm of softblk's source tree) is not here")
        driver = ctx.tools.get("driver")
        if not driver:
            raise Skip("softblk-driver is not built (ninja softblk-driver)")
        mode = ctx.settings["mode"]
        runtime = ctx.settings["runtime_s"]
        g = guest_settings(self.NAME, mode, runtime)
        cpus, mem, cells = g["cpus"], g["mem"], g["cells"]
        timeout = int(cells * 2 * (runtime + 1) + 240)
        cmd = [run_vm, os.path.join(root, "tests", "vm", "tests", "rnull_compare.sh"), "--cpus", cpus,
               "--mem", mem, "--timeout", timeout, "--bin", driver, "--", *g["args"]]
        ctx.results.machine["vm"] = {"accel": "tcg", "kernel": None, "cpus": cpus, "mem_mib": mem}
        ctx.results.machine.setdefault("plan_settings", {})[self.NAME] = {
            "size_mib": g["size"], "region_mib": g["region"], "engine": "psync", "cells": cells}
        plan = self.NAME

        def measure(ctx):
            p = ctx.run(cmd, timeout=timeout + 120, check=False)
            keep_log(ctx, plan, p)
            if p.returncode == 77:
                raise Skip(vm_skip_reason(p))
            vm, records = parse(p.stdout)
            if vm:
                ctx.results.machine["vm"].update(vm)
            if p.returncode != 0 or not records:
                tail = (p.stdout.strip() + "\n" + p.stderr.strip()).strip()[-400:]
                raise Failed(f"run-vm exited with {p.returncode} after {len(records)} cells: {tail}")
            text = " ".join(str(c) for c in cmd)
            for r in records:
                r["command"] = text
            return records

        return [Unit(plan, {"cells": cells, "engine": "psync"}, "null_blk+softblk", measure,
                     seconds=cells * 2 * (runtime + 0.5) + 15)]


RNULL = Plan("rnull", "VM lab: C null_blk against softblk's null over ublk, the rnull matrix (psync)")
NULLBLK_4K = Plan("nullblk-4k", "VM lab: the single 4 KiB random-read figure, null_blk against softblk")
