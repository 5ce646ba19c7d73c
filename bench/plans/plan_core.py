"""Plan `core`: the in-process benchmarks of softblk-bench-core (the null
target's 4 KiB random reads at QD 32 for irqmode 0 and 1; the
memory-backed store's random writes and reads against a memcpy of the
same size measured in the same run; with --full the memory use of a 1 TiB
device). One program run per round measures every case (--json)."""

import json

from runner import Failed, Skip, Unit

NAME = "core"
NEEDS_ROOT = False
DESCRIPTION = "in-process: the null target and the memory store (softblk-bench-core)"


def _args(mode, runtime_s):
    if mode == "smoke":
        return ["--seconds", str(runtime_s), "--only", "null"], ["--seconds", str(runtime_s),
                                                                  "--only", "memory", "--memory-mib", "16"]
    if mode == "quick":
        return ["--seconds", str(runtime_s), "--only", "null"], ["--seconds", str(runtime_s),
                                                                  "--only", "memory", "--memory-mib", "256"]
    parts = [["--seconds", str(runtime_s), "--only", "null"],
             ["--seconds", str(runtime_s), "--only", "memory"]]
    if mode == "full":
        parts.append(["--only", "ram"])
    return parts


def parse(text):
    """softblk-bench-core --json: one record per line."""
    records = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            records.append(json.loads(line))
    if not records:
        raise Failed("softblk-bench-core printed no measurement")
    out = []
    for r in records:
        errors = r.get("extra", {}).get("errors", 0)
        out.append({"case": r["case"], "system": r["system"], "iops": r.get("iops"),
                    "mib_s": r.get("mib_s"), "extra": r.get("extra", {}),
                    "status": "failed" if errors else "ok",
                    "error": f"{errors} I/O errors" if errors else None})
    return out


def setup(ctx):
    program = ctx.tools.get("bench-core")
    if not program:
        raise Skip("softblk-bench-core is not built (ninja softblk-bench-core)")
    units = []
    for args in _args(ctx.settings["mode"], ctx.settings["runtime_s"]):
        part = args[args.index("--only") + 1]

        def measure(ctx, a=args):
            cmd = [program, *a, "--json"]
            p = ctx.run(cmd, timeout=600)
            records = parse(p.stdout)
            for r in records:
                r["command"] = " ".join(cmd)
            return records

        units.append(Unit(NAME, {"test": part}, "softblk", measure,
                          seconds=ctx.settings["runtime_s"] * (2 if part == "null" else 6)))
    return units
