"""softblk bench smoke's VM lab part: the code paths of the VM plans,
rnull (nullblk-4k is the same path with its one cell, which is the smoke
cell) and zloop, in one boot (vm_smoke_guest.sh runs rnull_compare.sh,
then bench/zoned/vm_guest.sh) instead of a boot each: under TCG a boot
and its initramfs cost about 10 s on a 2-CPU machine. Each part's samples
go under its own plan, parsed by that plan's parser; a part that skips
or fails gives its own plan a skipped or failed sample. The boot runs in
the background, beside the host plans (Unit.background): smoke's figures
show that each path works, they are not measurements."""

import os
import re

import plan_rnull
import plan_zloop
from runner import Skip, Unit, keep_log

NAME = "vm-lab"
NEEDS_ROOT = False
DESCRIPTION = "smoke: rnull's and zloop's guest scripts in one VM boot"
_PART = re.compile(r"^SMOKE-PART-BEGIN (\S+)\n(.*?)^SMOKE-PART-END \1 (\d+)$", re.S | re.M)


def parts(text):
    """vm_smoke_guest.sh's output -> {part: (exit status, its output)}."""
    return {m.group(1): (int(m.group(3)), m.group(2)) for m in _PART.finditer(text)}


def _tail(text):
    return text.strip()[-400:]


def part_records(name, status, text, command):
    """One part's samples, each carrying its plan."""
    if status == 77:
        why = next((x.strip() for x in text.splitlines() if "SKIP" in x), "it skipped")
        return [{"plan": name, "case": {}, "system": "softblk", "status": "skipped",
                 "error": f"VM lab: {why}", "command": command}]
    if name == "rnull":
        _vm, recs = plan_rnull.parse(text)
        for r in recs:
            r["command"] = command
    else:
        _vm, recs = plan_zloop.records(text, command)
    if status != 0 or not recs:
        recs.append({"plan": name, "case": {}, "system": "softblk", "status": "failed",
                     "error": f"its guest script exited with {status} after {len(recs)} "
                              f"measurements: {_tail(text)}", "command": command})
    for r in recs:
        r["plan"] = name
    return recs


def setup(ctx):
    root = ctx.tools.get("source")
    run_vm = os.path.join(root, "tests", "vm", "run-vm") if root else None
    if not run_vm or not os.access(run_vm, os.X_OK):
        raise Skip("the VM lab (tests/vm/run-vm of softblk's source tree) is not here")
    driver = ctx.tools.get("driver")
    if not driver:
        raise Skip("softblk-driver is not built (ninja softblk-driver)")
    mode = ctx.settings["mode"]
    runtime, rounds = ctx.settings["runtime_s"], ctx.settings["rounds"]
    g = plan_rnull.guest_settings("rnull", mode, runtime)
    # Two vCPUs: with one the boot took longer (90-96 s against 72-81 s,
    # alternated at load 11-14), though the host has only two CPUs.
    cpus, mem = max(2, g["cpus"]), max(g["mem"], 1536)
    rnull_script = os.path.join(root, "tests", "vm", "tests", "rnull_compare.sh")
    zloop_script = os.path.join(root, "bench", "zoned", "vm_guest.sh")
    files = "/softblk-vm/files"
    timeout = 300
    cmd = [run_vm, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vm_smoke_guest.sh"),
           "--cpus", cpus, "--mem", mem, "--timeout", timeout, "--kernel", "6.12",
           "--bin", driver, "--bin", ctx.tools["softblk"],
           "--file", rnull_script, "--file", zloop_script]
    for e in plan_zloop.guest_env(mode, runtime, rounds, cpus):
        cmd += ["--env", e]
    cmd += ["--", f"{files}/rnull_compare.sh", f"{files}/vm_guest.sh", "--", *g["args"]]
    ctx.results.machine["vm"] = {"accel": "tcg", "kernel": None, "cpus": cpus, "mem_mib": mem}
    ctx.results.machine.setdefault("plan_settings", {})["rnull"] = {
        "size_mib": g["size"], "region_mib": g["region"], "engine": "psync", "cells": g["cells"]}

    def measure(ctx):
        p = ctx.run(cmd, timeout=timeout + 120, check=False)
        keep_log(ctx, "smoke", p)
        if p.returncode == 77 and "SMOKE-PART-BEGIN" not in p.stdout:
            raise Skip(plan_rnull.vm_skip_reason(p))  # the lab itself cannot run here
        m = re.search(r"softblk-vm: init started at [0-9.]+ s, kernel (\S+), (\d+) cpus", p.stdout)
        if m:
            ctx.results.machine["vm"].update(kernel=m.group(1), cpus=int(m.group(2)))
        found = parts(p.stdout)
        text = " ".join(str(c) for c in cmd)
        recs = []
        for name in ("rnull", "zloop"):
            if name in found:
                recs += part_records(name, *found[name], text)
            else:
                recs.append({"plan": name, "case": {}, "system": "softblk", "status": "failed",
                             "error": f"run-vm exited with {p.returncode} before this part ended: "
                                      f"{_tail(p.stdout + chr(10) + p.stderr)}", "command": text})
        return recs

    # In the background, beside the host plans: the boot is most of the
    # smoke run's time, and smoke checks code paths, not figures.
    return [Unit(NAME, {"boot": "rnull, zloop"}, "all", measure, seconds=0, once=True,
                 background=True)]
