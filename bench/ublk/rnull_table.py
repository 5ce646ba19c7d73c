#!/usr/bin/env python3
"""Formats rnull_compare.sh's CELL lines as the rnull cover letter's table.

stdin: "CELL ENGINE WORKLOAD BS JOBS DEVICE READ_IOPS WRITE_IOPS ERRORS"
argv: RUNTIME [OUT_FILE]. Per engine one table; rows "bs | workload",
columns jobs; a cell is "rel_read rel_write (ref_read,ref_write)" where
rel = (ublk - null_blk) / null_blk * 100 and ref = null_blk's IOPS in
thousands (the cover letter gives millions; under TCG thousands are the
readable unit). A direction a workload does not have shows 0.00 and 0.0.
"""
import sys
from collections import defaultdict

BS_ORDER = ["4k", "8k", "16k", "32k", "64k", "128k", "256k", "512k", "1m", "2m", "4m", "8m"]
WL_ORDER = ["randread", "randrw", "randwrite", "read", "readwrite", "write"]


def rel(cand, ref):
    return 0.0 if ref == 0 else (cand - ref) / ref * 100.0


def main():
    runtime = sys.argv[1]
    cells = defaultdict(dict)
    errors = 0
    for line in sys.stdin:
        f = line.split()
        if len(f) < 9:
            continue
        _, engine, wl, bs, jobs, dev, r, w, err = f[:9]
        cells[(engine, wl, bs, int(jobs))][dev] = (float(r), float(w))
        errors += int(err) != 0
    out = []
    for engine in sorted({k[0] for k in cells}, key=lambda e: (e != "psync", e)):
        keys = [k for k in cells if k[0] == engine]
        jobs = sorted({k[3] for k in keys})
        rows = sorted({(k[2], k[1]) for k in keys},
                      key=lambda r: (WL_ORDER.index(r[1]) if r[1] in WL_ORDER else 99,
                                     BS_ORDER.index(r[0]) if r[0] in BS_ORDER else 99))
        qd = "QD 1" if engine == "psync" else "QD 32"
        out.append(f"engine {engine} ({qd}), {runtime} s per run; cell: rel_read rel_write "
                   f"(null_blk read_kiops,write_kiops); rel = softblk ublk vs null_blk, percent")
        width = 31
        sep = "+---------+-----------+" + "+".join("-" * width for _ in jobs) + "+"
        out.append(sep)
        out.append("| jobs/bs | workload  |" + "|".join(f" {j:<{width - 1}}" for j in jobs) + "|")
        out.append(sep)
        rr, rw = [], []
        for bs, wl in rows:
            parts = []
            for j in jobs:
                c = cells.get((engine, wl, bs, j), {})
                if "null_blk" not in c or "ublk" not in c:
                    parts.append(" " + "n/a".ljust(width - 1))
                    continue
                (nr, nw), (ur, uw) = c["null_blk"], c["ublk"]
                a, b = rel(ur, nr), rel(uw, nw)
                if nr:
                    rr.append(a)
                if nw:
                    rw.append(b)
                text = f"{a:.2f} {b:.2f} ({nr / 1000:.3g},{nw / 1000:.3g})"
                parts.append(" " + text.ljust(width - 1))
            out.append(f"| {bs:<7} | {wl:<9} |" + "|".join(parts) + "|")
        out.append(sep)
        for name, vals in (("reads", rr), ("writes", rw)):
            if vals:
                out.append(f"{engine} {name}: {len(vals)} cells, relative IOPS from {min(vals):.1f} to "
                           f"{max(vals):.1f} percent, mean {sum(vals) / len(vals):.1f}")
        out.append("")
    if errors:
        out.append(f"WARNING: {errors} fio runs reported errors")
    text = "\n".join(out)
    print(text)
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
