"""The plans of `softblk bench`: what each measures, whether it needs
root, and the VM plans that are not implemented yet (they say which
script to use instead)."""

import plan_core
import plan_exports
import plan_fat
import plan_file
import plan_rnull

IMPLEMENTED = {p.NAME: p for p in (plan_core, plan_exports, plan_file, plan_fat, plan_rnull.RNULL,
                                   plan_rnull.NULLBLK_4K)}

SMOKE_DESCRIPTION = "every implemented plan's code path with tiny sizes and 1 s runs (CI)"

# Plans that run in the VM lab; not implemented in the driver yet.
NOT_IMPLEMENTED = {
    "zloop": "bench/zoned/vm.sh",
}

ORDER = ["rnull", "nullblk-4k", "zloop", "fat", "exports", "file", "core", "smoke"]


def listing():
    lines = []
    for name in ORDER:
        if name == "smoke":
            lines.append(f"  {name:<11} {SMOKE_DESCRIPTION}")
        elif name in IMPLEMENTED:
            p = IMPLEMENTED[name]
            root = " (needs root)" if p.NEEDS_ROOT else ""
            lines.append(f"  {name:<11} {p.DESCRIPTION}{root}")
        else:
            lines.append(f"  {name:<11} not implemented yet: use {NOT_IMPLEMENTED[name]}")
    return "\n".join(lines)


def modules(plan):
    """The plan modules a plan runs (smoke: every implemented one)."""
    if plan == "smoke":
        return [IMPLEMENTED[n] for n in ("core", "exports", "file", "fat", "rnull")]
    return [IMPLEMENTED[plan]]
