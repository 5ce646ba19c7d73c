"""The plans of `softblk bench`: what each measures and whether it needs
root."""

import plan_core
import plan_exports
import plan_fat
import plan_file
import plan_rnull
import plan_vm_smoke
import plan_zloop

IMPLEMENTED = {p.NAME: p for p in (plan_core, plan_exports, plan_file, plan_fat, plan_rnull.RNULL,
                                   plan_rnull.NULLBLK_4K, plan_zloop)}

SMOKE_DESCRIPTION = "every implemented plan's code path with tiny sizes and 0.5 s runs (CI)"

ORDER = ["rnull", "nullblk-4k", "zloop", "fat", "exports", "file", "core", "smoke"]


def listing():
    lines = []
    for name in ORDER:
        if name == "smoke":
            lines.append(f"  {name:<11} {SMOKE_DESCRIPTION}")
        else:
            p = IMPLEMENTED[name]
            root = " (needs root)" if p.NEEDS_ROOT else ""
            lines.append(f"  {name:<11} {p.DESCRIPTION}{root}")
    return "\n".join(lines)


def modules(plan):
    """The plan modules a plan runs (smoke: every implemented one)."""
    if plan == "smoke":
        # The VM plans share one boot (plan_vm_smoke), first: it runs in the
        # background from the moment it is set up.
        return [plan_vm_smoke] + [IMPLEMENTED[n] for n in ("core", "exports", "file", "fat")]
    return [IMPLEMENTED[plan]]
