"""The tables of the report: each reference's table in its own form (rnull,
zloop, fat) and softblk against each peer for the other plans. A table is
a title, a header and rows of cells; a cell is a list of lines."""
import statistics

from .data import ratio_spread

WORKLOAD_ORDER = ["randread", "randrw", "randwrite", "read", "readwrite", "write"]
# The order of case keys in labels; the rest follow alphabetically.
KEY_ORDER = ["workload", "bs", "buffer", "qd", "jobs", "queues", "export", "target", "engine"]


class Table:
    def __init__(self, title, header, rows, note=""):
        self.title = title
        self.header = header
        self.rows = rows
        self.note = note


def size_label(v):
    if isinstance(v, int) and v >= 1024 and v % 1024 == 0:
        return f"{v // 1024}k"
    return str(v)


def fmt_iops(v):
    if v >= 1e6:
        return f"{v / 1e6:.3g}M"
    if v >= 1e3:
        return f"{v / 1e3:.3g}k"
    return f"{v:.0f}"


def fmt_mib(v):
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def fmt_ratio(v):
    return f"{v:.2f}"


def case_label(case, skip=()):
    keys = [k for k in KEY_ORDER if k in case] + sorted(k for k in case if k not in KEY_ORDER)
    parts = []
    for k in keys:
        if k in skip:
            continue
        v = case[k]
        if k == "workload":
            parts.append(str(v))
        elif k in ("bs", "buffer"):
            parts.append(f"{k}={size_label(v)}")
        else:
            parts.append(f"{k}={v}")
    return " ".join(parts) or "(all)"


def sort_value(v):
    return (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))


def group_cases(plan, keys):
    """Cases grouped by everything but KEYS: {rest label: [case...]}."""
    groups = {}
    for case in plan.cases.values():
        rest = {k: v for k, v in case.items() if k not in keys}
        groups.setdefault(case_label(rest), []).append(case)
    return groups


def iops_cell(cell):
    """softblk's (or a peer's) absolute figures: median IOPS with the
    min-max over rounds, median MiB/s."""
    problem = cell.problem()
    if problem:
        return [problem]
    lo, hi = cell.spread("iops")
    lines = [f"{fmt_iops(cell.median('iops'))} IOPS ({fmt_iops(lo)}-{fmt_iops(hi)})",
             f"{fmt_mib(cell.median('mib_s'))} MiB/s"]
    if cell.note():
        lines.append(cell.note())
    return lines


def ratio_cell(mine, peer, peer_name="peer"):
    for who, cell in (("softblk", mine), (peer_name, peer)):
        if cell.problem():
            return [f"{who} {cell.problem()}" if cell.problem() != "missing" else "missing"]
    theirs = peer.median("iops")
    if not theirs:
        return ["peer 0 IOPS"]
    text = fmt_ratio(mine.median("iops") / theirs)
    spread = ratio_spread(mine, peer)
    if spread and len(mine.ok) > 1:
        text += f" ({fmt_ratio(spread[0])}-{fmt_ratio(spread[1])})"
    return [text]


# ---- rnull: the Rust null_blk cover letter's table ----

def rnull_peer(plan):
    peers = plan.peers()
    return "null_blk" if "null_blk" in peers or not peers else peers[0]


def rel(mine, ref):
    return (mine - ref) / ref * 100.0 if ref else 0.0


def miops(iops):
    """The cover letter's MIOPS: two significant digits, 0.0 for none."""
    text = f"{iops / 1e6:.2g}"
    return text if "." in text or "e" in text else text + ".0"


def rnull_cell(plan, case, peer):
    """The cover letter's 'rel_read rel_write (read_miops,write_miops)', the
    C driver's MIOPS in parentheses; softblk's own figures below it."""
    mine, theirs = plan.cell(case, "softblk"), plan.cell(case, peer)
    if mine.problem() or theirs.problem():
        lines = []
        for who, c in (("softblk", mine), (peer, theirs)):
            if c.problem():
                lines.append(c.problem() if c.problem() == "missing" else f"{who} {c.problem()}")
        return lines, None
    mr, mw = mine.direction_median()
    tr, tw = theirs.direction_median()
    total = rel(mine.median("iops"), theirs.median("iops"))
    if mr is None or tr is None:
        first = f"{total:.2f} ({miops(theirs.median('iops'))})"
    else:
        first = f"{rel(mr, tr):.2f} {rel(mw, tw):.2f} ({miops(tr)},{miops(tw)})"
    lo, hi = mine.spread("iops")
    lines = [first, f"softblk {fmt_iops(mine.median('iops'))} IOPS ({fmt_iops(lo)}-{fmt_iops(hi)}), "
                    f"{fmt_mib(mine.median('mib_s'))} MiB/s"]
    for c in (mine, theirs):
        if c.note():
            lines.append(c.note())
    return lines, (total, mr, mw, tr, tw)


def rnull_tables(plan):
    peer = rnull_peer(plan)
    tables = []
    for rest, cases in group_cases(plan, ("workload", "bs", "jobs")).items():
        jobs = sorted({c.get("jobs") for c in cases}, key=sort_value)
        workloads = sorted({c.get("workload") for c in cases},
                           key=lambda w: (WORKLOAD_ORDER.index(w) if w in WORKLOAD_ORDER else 99, str(w)))
        sizes = sorted({c.get("bs") for c in cases}, key=sort_value)
        base = {k: v for k, v in cases[0].items() if k not in ("workload", "bs", "jobs")}
        rows, reads, writes = [], [], []
        for w in workloads:
            for bs in sizes:
                row = [[size_label(bs)], [str(w)]]
                for j in jobs:
                    case = dict(base, workload=w, bs=bs, jobs=j)
                    lines, numbers = rnull_cell(plan, case, peer)
                    row.append(lines)
                    if numbers and numbers[1] is not None:
                        _, mr, mw, tr, tw = numbers
                        if tr:
                            reads.append(rel(mr, tr))
                        if tw:
                            writes.append(rel(mw, tw))
                rows.append(row)
        note = (f"Each cell: rel_read rel_write ({peer} read_MIOPS,write_MIOPS) as in the Rust "
                f"null_blk cover letter, rel = (softblk - {peer}) / {peer} in percent of the "
                "median over rounds; below it softblk's own median IOPS (min-max over rounds) "
                "and MiB/s. A direction the workload does not have shows 0.00 and 0.0.")
        for name, vals in (("reads", reads), ("writes", writes)):
            if vals:
                note += (f" {name.capitalize()}: {len(vals)} cells, relative IOPS from "
                         f"{min(vals):.1f} to {max(vals):.1f} percent, mean "
                         f"{statistics.mean(vals):.1f}.")
        header = ["jobs/bs", "workload"] + [str(j) for j in jobs]
        tables.append(Table(f"rnull: softblk vs {peer}" + (f", {rest}" if rest != "(all)" else ""),
                            header, rows, note))
    return tables


# ---- zloop: the zloop vs ublk zoned server reply's table ----

SHORT_WORKLOAD = {"randwrite": "rnd wr", "write": "seq wr", "randread": "rnd rd", "read": "seq rd"}


def zloop_row_label(case):
    bs = case.get("bs")
    size = f"{bs // 1024}K" if isinstance(bs, int) and bs % 1024 == 0 else str(bs)
    jobs = case.get("jobs", 1)
    w = case.get("workload", "?")
    return (f"QD={case.get('qd', '?')}, {size} {SHORT_WORKLOAD.get(w, w)}, "
            f"{jobs} job{'s' if jobs != 1 else ''}")


def zloop_cell(cell):
    problem = cell.problem()
    if problem:
        return [problem]
    best = cell.best()
    lo, hi = cell.spread("iops")
    lines = [f"best {fmt_iops(float(best['iops']))} / {fmt_mib(float(best.get('mib_s') or 0))} MiB/s",
             f"median {fmt_iops(cell.median('iops'))} ({fmt_iops(lo)}-{fmt_iops(hi)}) / "
             f"{fmt_mib(cell.median('mib_s'))} MiB/s"]
    if cell.note():
        lines.append(cell.note())
    return lines


def zloop_tables(plan):
    systems = ["softblk"] + plan.peers()
    tables = []
    groups = group_cases(plan, ("workload", "bs", "qd", "jobs"))
    for rest, cases in sorted(groups.items(), key=lambda g: sort_value(g[1][0].get("queues", 0))):
        rows = []
        for case in cases:
            row = [[zloop_row_label(case)]] + [zloop_cell(plan.cell(case, s)) for s in systems]
            mine = plan.cell(case, "softblk")
            for p in plan.peers():
                theirs = plan.cell(case, p)
                if mine.problem() or theirs.problem():
                    row.append(ratio_cell(mine, theirs, p))
                else:
                    best = float(mine.best()["iops"]) / float(theirs.best()["iops"])
                    row.append([f"best {fmt_ratio(best)}"] +
                               ["median " + ratio_cell(mine, theirs)[0]])
            rows.append(row)
        queues = cases[0].get("queues")
        title = f"zloop: {queues} queue{'s' if queues != 1 else ''}" if queues is not None else "zloop"
        other = case_label({k: v for k, v in cases[0].items()
                            if k not in ("workload", "bs", "qd", "jobs", "queues")})
        if other != "(all)":
            title += f" ({other})"
        header = ["", *[f"{s} (IOPS / BW)" for s in systems], *[f"softblk / {p}" for p in plan.peers()]]
        note = ("As in the zloop reply: IOPS / bandwidth, the best of the rounds (the reference "
                "took the best of several runs), and the median with its min-max; the ratios are "
                "softblk's IOPS over the peer's.")
        tables.append(Table(title, header, rows, note))
    return tables


# ---- fat: the unikernel FAT pull request's before/after ----

def fat_configs(plan):
    configs = sorted({str(c.get("config", "")) for c in plan.cases.values()},
                     key=lambda c: ({"before": 0, "after": 1}.get(c, 2), c))
    return configs


# The FUSE mount's configuration as `softblk fat mount` makes it by default
# (runs recorded before the default became write-through name it by its
# writeback cache).
FAT_MOUNT_CONFIGS = ("FUSE mount, default options", "FUSE mount, writeback cache")


def fat_peer_column(peer, columns, mine_config):
    """The column a peer's figures are in: a peer measured under softblk's
    configuration name, else its only configuration (mtools' is its own,
    e.g. "mcopy, image in /dev/shm"), else none."""
    theirs = [c for s, c in columns if s == peer]
    for c in (mine_config, ""):
        if c in theirs:
            return (peer, c)
    return (peer, theirs[0]) if len(theirs) == 1 else None


def fat_value(cell, field, extra=False):
    problem = cell.problem()
    if problem:
        return [problem], None
    if extra:
        v = cell.extra_median(field)
        # A run that counts no such figure (a peer without request counts).
        return ([f"{v:.0f}"] if v is not None else ["-"]), v
    lo, hi = cell.spread(field)
    v = cell.median(field)
    f = fmt_mib if field == "mib_s" else fmt_iops
    return [f"{f(v)} ({f(lo)}-{f(hi)})"], v


def fat_tables(plan):
    configs = fat_configs(plan)
    # A column per system and configuration that has any sample (a peer
    # has no before/after: its cases carry no "config").
    measured = {(system, str(plan.cases[key].get("config", ""))) for key, system in plan.cells}
    columns = [(s, c) for s in ["softblk"] + plan.peers() for c in configs if (s, c) in measured]
    compare = "before" in configs and "after" in configs
    mine_config = "after" if "after" in configs else configs[-1]
    # softblk's rows against each peer: the library ("after") and, where it
    # was measured, the FUSE mount as `softblk fat mount` makes it (issue 45
    # compares the mount with mtools).
    mine = [c for c in (mine_config, *FAT_MOUNT_CONFIGS) if ("softblk", c) in measured]
    mine = list(dict.fromkeys(mine)) or [mine_config]
    peer_column = {p: fat_peer_column(p, columns, mine_config) for p in plan.peers()}
    pairs = [(c, p) for c in mine for p in plan.peers()]
    header = ["case", "measure"] + [f"{s} {c}".strip() for s, c in columns]
    if compare:
        header.append("softblk after / before")
    header += [f"softblk {c} / {p}".replace("  ", " ") for c, p in pairs]
    rows = []
    seen = set()
    for case in plan.cases.values():
        base = {k: v for k, v in case.items() if k != "config"}
        label = case_label(base)
        if label in seen:
            continue
        seen.add(label)
        at = lambda c: dict(base, config=c) if c else base
        cells = {(s, c): plan.cell(at(c), s) for s, c in columns}
        any_ok = [cell for cell in cells.values() if cell.ok]
        measures = []
        if not any_ok or any(float(s.get("mib_s") or 0) > 0 for cell in any_ok for s in cell.ok):
            measures.append(("MiB/s", "mib_s", False))
        else:
            measures.append(("ops/s", "iops", False))
        extras = sorted({k for cell in any_ok for s in cell.ok for k, v in (s.get("extra") or {}).items()
                         if isinstance(v, (int, float))})
        measures += [(k, k, True) for k in extras]
        for name, field, extra in measures:
            row = [[label], [name]]
            values = {}
            for col in columns:
                text, values[col] = fat_value(cells[col], field, extra)
                row.append(text)
            if compare:
                b, a = values.get(("softblk", "before")), values.get(("softblk", "after"))
                row.append([fmt_ratio(a / b)] if a is not None and b else ["n/a"])
            for c, p in pairs:
                ours = values.get(("softblk", c))
                theirs = values.get(peer_column[p]) if peer_column[p] else None
                row.append([fmt_ratio(ours / theirs)] if ours is not None and theirs else ["n/a"])
            rows.append(row)
    note = ("As in the unikernel FAT pull request: throughput, request counts and create latency "
            "before and after, medians over rounds with the min-max in parentheses (request "
            "counts and latencies are medians of the runs' extra figures). Each ratio divides "
            "the two columns' medians, so on the _us rows (latencies) below 1 means softblk "
            "is faster; n/a where either side has no figure.")
    return [Table("fat: before / after", header, rows, note)]


# ---- every other plan: softblk against each peer, case by case ----

# The keys a plan varies within one comparison: a peer measured for one
# of their values is expected for all of them (and "missing" where not).
MATRIX_KEYS = ("workload", "bs", "buffer", "qd", "jobs", "queues")


def expected_peers(plan, case):
    rest = case_label({k: v for k, v in case.items() if k not in MATRIX_KEYS})
    return [p for p in plan.peers()
            if any(system == p and case_label({k: v for k, v in plan.cases[key].items()
                                               if k not in MATRIX_KEYS}) == rest
                   for key, system in plan.cells)]


def peer_tables(plan):
    rows = []
    peers = plan.peers()
    for case in plan.cases.values():
        mine = plan.cell(case, "softblk")
        for p in expected_peers(plan, case) or [None]:
            theirs = plan.cell(case, p) if p else None
            row = [[case_label(case)], iops_cell(mine), [p or "(no peer)"]]
            row.append(iops_cell(theirs) if p else ["-"])
            row.append(ratio_cell(mine, theirs, p) if p else ["-"])
            rows.append(row)
    header = ["case", "softblk", "peer", "peer's", "softblk / peer"]
    note = ("Medians over rounds with the min-max in parentheses; the ratio is softblk's median "
            "IOPS over the peer's, with its min-max over the rounds both ran side by side.")
    return [Table(f"{plan.name}: softblk vs {', '.join(peers) if peers else 'no peer'}",
                  header, rows, note)]


# ---- core: the memory store against a memcpy of the same size ----

def core_tables(plan):
    """softblk-bench-core's memory rows against the memcpy it measures in
    the same run into random 4 KiB slots of a buffer of the device's size
    (issue 45's bound for the memory store), besides the plain table."""
    tables = peer_tables(plan)
    rows = []
    for case in plan.cases.values():
        if case.get("test") != "memory" or case.get("workload") not in ("randwrite", "randread"):
            continue
        mine = plan.cell(case, "softblk")
        if mine.empty:
            continue
        bound = next((c for c in plan.cases.values() if c.get("workload") == "memcpy"
                      and c.get("size_mib") == case.get("size_mib")
                      and str(c.get("into", "")).startswith("random")), None)
        theirs = plan.cell(bound, "memcpy") if bound else None
        rows.append([[case_label(case, skip=("test",))], iops_cell(mine),
                     iops_cell(theirs) if theirs else ["missing"],
                     ratio_cell(mine, theirs, "memcpy") if theirs else ["missing"]])
    if rows:
        header = ["case", "softblk", "memcpy, random 4k slots of the same size", "softblk / memcpy"]
        note = ("The memory store's 4 KiB I/O against the memcpy softblk-bench-core measures in "
                "the same run (4 KiB copies to random slots of a buffer as large as the device); "
                "medians over rounds, the ratio's min-max over the rounds both ran in.")
        tables.append(Table("core: memory store / memcpy of the same size", header, rows, note))
    return tables


def plan_tables(plan):
    builder = {"rnull": rnull_tables, "zloop": zloop_tables, "fat": fat_tables,
               "core": core_tables}.get(plan.name, peer_tables)
    return builder(plan)
