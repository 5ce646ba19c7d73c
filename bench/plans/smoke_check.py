#!/usr/bin/env python3
"""Checks a `softblk bench smoke` results folder: machine.json has the
machine, commands.txt the commands, and samples.jsonl every expected case
of every plan with status "ok" and plausible figures. Exit 0 when it
holds; 1 and the problems on stderr when not.

usage: smoke_check.py RESULTS_DIR
"""

import json
import math
import os
import sys

# (plan, what the case must contain, system): every one must be there, ok.
EXPECTED = [
    ("core", {"test": "null", "irqmode": 0}, "softblk"),
    ("core", {"test": "null", "irqmode": 1}, "softblk"),
    ("core", {"test": "memory", "workload": "randwrite", "state": "allocated", "queues": 1}, "softblk"),
    ("core", {"test": "memory", "workload": "randread"}, "softblk"),
    ("core", {"test": "memory", "workload": "memcpy"}, "memcpy"),
    ("exports", {"export": "fuse"}, "softblk"),
    ("exports", {"export": "fuse"}, "qsd"),
    ("exports", {"export": "fuse"}, "nbdkit"),
    ("exports", {"export": "nbd"}, "softblk"),
    ("exports", {"export": "nbd"}, "nbdkit"),
    ("exports", {"export": "nbd"}, "qsd"),
    ("exports", {"export": "vhost-user-blk", "target": "null"}, "softblk"),
    ("exports", {"export": "vhost-user-blk", "target": "null"}, "qsd"),
    ("exports", {"export": "vhost-user-blk", "target": "file"}, "softblk"),
    ("exports", {"export": "vhost-user-blk", "target": "file"}, "qsd"),
    ("file", {"workload": "randread"}, "softblk"),
    ("file", {"workload": "randread"}, "loop"),
    ("fat", {"config": "before", "workload": "seq-write"}, "softblk"),
    ("fat", {"config": "before", "workload": "seq-read"}, "softblk"),
    ("fat", {"config": "after", "workload": "seq-read"}, "softblk"),
    ("fat", {"config": "after", "workload": "create"}, "softblk"),
    ("fat", {"config": "FUSE mount, default options", "workload": "seq-read"}, "softblk"),
    ("fat", {"workload": "seq-write"}, "mtools"),
    ("rnull", {"workload": "randread", "bs": 4096}, "null_blk"),
    ("rnull", {"workload": "randread", "bs": 4096}, "softblk"),
    ("zloop", {"target": "null", "queues": 1}, "null_blk"),
    ("zloop", {"target": "null", "queues": 1}, "softblk"),
    ("zloop", {"target": "zloop", "queues": 1}, "softblk"),
]

# Plans in the VM lab: where the lab cannot run (exit 77: no QEMU, no
# kernel package) their samples are "skipped", which passes, as does the
# kernel's zloop where the guest kernel has none; "failed" does not.
LAB_PLANS = {"rnull", "zloop"}

SAMPLE_KEYS = {"plan", "case", "system", "round", "status", "iops", "mib_s", "cpu_us_per_io",
               "lat_us", "extra", "command", "started"}
HOST_KEYS = {"cpu_model", "cpu_family", "cpu_model_number", "cpus", "hypervisor", "kernel",
             "load_before", "load_after"}


def _finite_positive(v):
    return isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def plausible(s):
    """Why a sample's figures are implausible, or None."""
    if not (_finite_positive(s["iops"]) or _finite_positive(s["mib_s"])):
        return f"neither iops ({s['iops']}) nor mib_s ({s['mib_s']}) is a positive number"
    if s["iops"] is not None and s["iops"] > 1e9:
        return f"iops {s['iops']} is more than a billion"
    cpu = s["cpu_us_per_io"]
    if cpu is not None and not (math.isfinite(cpu) and cpu >= 0):
        return f"cpu_us_per_io {cpu}"
    if s["lat_us"] is not None and not _finite_positive(s["lat_us"].get("mean")):
        return f"lat_us {s['lat_us']}"
    if not s["command"]:
        return "no command"
    return None


def check(results_dir):
    problems = []
    try:
        with open(os.path.join(results_dir, "machine.json")) as f:
            m = json.load(f)
        missing = HOST_KEYS - set(m.get("host", {}))
        if missing:
            problems.append(f"machine.json: host lacks {sorted(missing)}")
        if not m["host"].get("load_after"):
            problems.append("machine.json: no load average after the run")
    except (OSError, ValueError, KeyError) as e:
        problems.append(f"machine.json: {e}")
    try:
        with open(os.path.join(results_dir, "commands.txt")) as f:
            if not f.read().strip():
                problems.append("commands.txt is empty")
    except OSError as e:
        problems.append(f"commands.txt: {e}")
    samples = []
    try:
        with open(os.path.join(results_dir, "samples.jsonl")) as f:
            samples = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        problems.append(f"samples.jsonl: {e}")
    lab_skipped = set()
    for s in samples:
        if SAMPLE_KEYS - set(s):
            problems.append(f"a sample lacks {sorted(SAMPLE_KEYS - set(s))}: {s}")
            return problems
        if s["status"] == "skipped" and s["plan"] in LAB_PLANS:
            lab_skipped.add(s["plan"])
        elif s["status"] != "ok":
            problems.append(f"{s['plan']} {s['case']} {s['system']}: {s['status']}: {s.get('error')}")
    for plan, want, system in EXPECTED:
        if plan in lab_skipped:
            continue
        found = [s for s in samples if s["plan"] == plan and s["system"] == system
                 and all(s["case"].get(k) == v for k, v in want.items())]
        if not found:
            problems.append(f"missing: {plan} {want} {system}")
        for s in found:
            why = plausible(s) if s["status"] == "ok" else None
            if why:
                problems.append(f"{plan} {s['case']} {system}: {why}")
    return problems


def main(argv):
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    problems = check(argv[0])
    for p in problems:
        print(f"smoke: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
