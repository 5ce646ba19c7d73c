"""The plots (matplotlib, Agg backend): rnull's heat map of the ratio per
workload over block size x jobs, bars with the min-max spread per case for
every plan, IOPS against queue depth where a plan has several."""
import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

from .tables import (WORKLOAD_ORDER, case_label, expected_peers, fat_configs,  # noqa: E402
                     group_cases, rel, rnull_peer, size_label, sort_value)

# Reruns on the same folder give the same SVG bytes.
matplotlib.rcParams["svg.hashsalt"] = "softblk-report"
matplotlib.rcParams["font.size"] = 9


class Plot:
    def __init__(self, name, caption):
        self.name = name  # file name without extension, under plots/
        self.caption = caption


def save(fig, outdir, name):
    os.makedirs(os.path.join(outdir, "plots"), exist_ok=True)
    base = os.path.join(outdir, "plots", name)
    fig.savefig(base + ".png", dpi=100, bbox_inches="tight", metadata={"Software": None})
    fig.savefig(base + ".svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    plt.close(fig)


def slug(text):
    return "".join(c if c.isalnum() else "-" for c in text).strip("-").lower()


def short_problem(cell):
    p = cell.problem() or ""
    return p.split(":")[0]


def heatmaps(plan, outdir):
    peer = rnull_peer(plan)
    plots = []
    for index, (rest, cases) in enumerate(group_cases(plan, ("workload", "bs", "jobs")).items()):
        workloads = sorted({c["workload"] for c in cases},
                           key=lambda w: (WORKLOAD_ORDER.index(w) if w in WORKLOAD_ORDER else 99, w))
        sizes = sorted({c.get("bs") for c in cases}, key=sort_value)
        jobs = sorted({c.get("jobs") for c in cases}, key=sort_value)
        base = {k: v for k, v in cases[0].items() if k not in ("workload", "bs", "jobs")}
        grids = {}
        for w in workloads:
            grid = []
            for bs in sizes:
                line = []
                for j in jobs:
                    case = dict(base, workload=w, bs=bs, jobs=j)
                    mine, theirs = plan.cell(case, "softblk"), plan.cell(case, peer)
                    if mine.problem() or theirs.problem():
                        line.append((math.nan, short_problem(mine if mine.problem() else theirs)))
                    else:
                        line.append((rel(mine.median("iops"), theirs.median("iops")), None))
                grid.append(line)
            grids[w] = grid
        finite = [abs(v) for g in grids.values() for line in g for v, _ in line if not math.isnan(v)]
        limit = max(finite + [1.0])
        columns = min(3, len(workloads))
        rows = math.ceil(len(workloads) / columns)
        fig, axes = plt.subplots(rows, columns, squeeze=False, layout="constrained",
                                 figsize=(1.6 + columns * (1.0 + 0.9 * len(jobs)),
                                          1.0 + rows * (1.0 + 0.35 * len(sizes))))
        cmap = matplotlib.colormaps["RdBu"].copy()
        cmap.set_bad("#d0d0d0")
        image = None
        for ax, w in zip(axes.flat, workloads):
            values = [[v for v, _ in line] for line in grids[w]]
            image = ax.imshow(values, cmap=cmap, vmin=-limit, vmax=limit, aspect="auto")
            for y, line in enumerate(grids[w]):
                for x, (v, problem) in enumerate(line):
                    ax.text(x, y, problem if problem else f"{v:.1f}", ha="center", va="center",
                            fontsize=7, color="black")
            ax.set_title(w)
            ax.set_xticks(range(len(jobs)), [str(j) for j in jobs])
            ax.set_yticks(range(len(sizes)), [size_label(s) for s in sizes])
            ax.set_xlabel("jobs")
            if ax in axes[:, 0]:
                ax.set_ylabel("block size")
        for ax in list(axes.flat)[len(workloads):]:
            ax.axis("off")
        fig.colorbar(image, ax=axes, label=f"softblk vs {peer}, % IOPS")
        title = f"rnull: softblk relative to {peer} (median IOPS, %)"
        fig.suptitle(title + (f", {rest}" if rest != "(all)" else ""))
        name = "rnull-heatmap" + (f"-{index + 1}" if index else "")
        save(fig, outdir, name)
        plots.append(Plot(name, title + (f", {rest}" if rest != "(all)" else "") +
                          "; grey: missing or failed cells"))
    return plots


def bar_series(plan):
    """[(series label, function case -> Cell)] and the cases (labels) on the
    x axis; fat's configurations are series of their own."""
    if plan.name == "fat":
        configs = fat_configs(plan)
        bases, seen = [], set()
        for case in plan.cases.values():
            base = {k: v for k, v in case.items() if k != "config"}
            if case_label(base) not in seen:
                seen.add(case_label(base))
                bases.append(base)
        series = []
        for s in ["softblk"] + plan.peers():
            for c in configs:
                def get(base, s=s, c=c):
                    return plan.cell(dict(base, config=c) if c else base, s)
                if any(not get(b).empty for b in bases):
                    series.append((f"{s} {c}".strip(), get))
        return series, bases
    # A peer never measured for cases of this kind (nbdkit has no
    # vhost-user-blk export) gets no bar and no "missing" mark there.
    series = [(s, lambda case, s=s: plan.cell(case, s)
               if s == "softblk" or s in expected_peers(plan, case) else None)
              for s in ["softblk"] + plan.peers()]
    return series, list(plan.cases.values())


def bars_one(ax, series, cases, field, log):
    width = 0.8 / max(1, len(series))
    drawn = False
    for i, (label, get) in enumerate(series):
        xs, ys, lo, hi = [], [], [], []
        for x, case in enumerate(cases):
            cell = get(case)
            pos = x - 0.4 + width * (i + 0.5)
            if cell is None:
                continue
            if cell.problem():
                ax.text(pos, 0.02, short_problem(cell), rotation=90, ha="center", va="bottom",
                        fontsize=7, color="#b00000", transform=ax.get_xaxis_transform())
                continue
            m = cell.median(field)
            a, b = cell.spread(field)
            xs.append(pos)
            ys.append(m)
            lo.append(m - a)
            hi.append(b - m)
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=label, color=f"C{i}")
        drawn = drawn or any(y > 0 for y in ys)
    # Text markers do not widen the axes: a last case with no bar would fall off.
    ax.set_xlim(-0.5, len(cases) - 0.5)
    if log and drawn:  # a log axis without a positive value cannot be drawn
        ax.set_yscale("log")
    ax.set_ylabel("MiB/s" if field == "mib_s" else "IOPS")


def has_mib(cells):
    return any(float(s.get("mib_s") or 0) > 0 for cell in cells for s in cell.ok)


def bars(plan, outdir):
    """One panel per rnull workload (log scale: block sizes span 1000x);
    fat's throughput and its per-operation cases (create) apart."""
    series, cases = bar_series(plan)
    skip = ()
    if plan.name == "rnull":
        panels = {}
        for case in sorted(cases, key=lambda c: (sort_value(c.get("bs")), sort_value(c.get("jobs")))):
            panels.setdefault(case.get("workload"), []).append(case)
        panels = [(str(w), c, "iops", True) for w, c in panels.items()]
        skip = ("workload",)
    elif plan.name == "fat":
        mib = [c for c in cases if has_mib(get(c) for _, get in series)]
        ops = [c for c in cases if c not in mib]
        panels = [(t, c, f, False) for t, c, f in (("throughput", mib, "mib_s"),
                                                   ("operations", ops, "iops")) if c]
    else:
        panels = [(None, cases, "iops", False)]
    count = max(len(p[1]) for p in panels)
    fig, axes = plt.subplots(len(panels), 1, squeeze=False,
                             figsize=(min(40, max(7, 1 + count * (0.25 + 0.22 * len(series)))),
                                      2.0 + 2.8 * len(panels)))
    for ax, (title, panel_cases, field, log) in zip(axes.flat, panels):
        bars_one(ax, series, panel_cases, field, log)
        ax.set_xticks(range(len(panel_cases)), [case_label(c, skip) for c in panel_cases],
                      rotation=30, ha="right", fontsize=7)
        if title:
            ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes.flat[0].legend(fontsize=7, loc="best")
    title = f"{plan.name}: median per case, min-max over rounds"
    fig.suptitle(title)
    fig.tight_layout()
    name = f"{slug(plan.name)}-bars"
    save(fig, outdir, name)
    return [Plot(name, title + "; red text: failed, skipped or missing")]


def qd_lines(plan, outdir):
    groups = {}
    for case in plan.cases.values():
        if "qd" in case:
            rest = {k: v for k, v in case.items() if k != "qd"}
            groups.setdefault(case_label(rest), []).append(case)
    groups = {k: v for k, v in groups.items() if len({c["qd"] for c in v}) > 1}
    if not groups:
        return []
    fig, ax = plt.subplots(figsize=(8, 4.5))
    line = 0
    for label, cases in groups.items():
        cases = sorted(cases, key=lambda c: sort_value(c["qd"]))
        for system in ["softblk"] + plan.peers():
            points = [(c["qd"], plan.cell(c, system)) for c in cases]
            points = [(q, cell.median("iops")) for q, cell in points if not cell.problem()]
            if len(points) < 2:
                continue
            ax.plot([q for q, _ in points], [v for _, v in points], marker="o",
                    color=f"C{line % 10}", linestyle="-" if system == "softblk" else "--",
                    label=f"{system}: {label}")
            line += 1
    ax.set_xscale("log", base=2)
    depths = sorted({c["qd"] for cases in groups.values() for c in cases}, key=sort_value)
    ax.set_xticks(depths, [str(q) for q in depths])
    ax.minorticks_off()
    ax.set_xlabel("queue depth")
    ax.set_ylabel("median IOPS")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    title = f"{plan.name}: IOPS against queue depth"
    ax.set_title(title)
    name = f"{slug(plan.name)}-qd"
    save(fig, outdir, name)
    return [Plot(name, title + " (solid: softblk, dashed: peers)")]


def plan_plots(plan, outdir):
    plots = heatmaps(plan, outdir) if plan.name == "rnull" else []
    return plots + bars(plan, outdir) + qd_lines(plan, outdir)
