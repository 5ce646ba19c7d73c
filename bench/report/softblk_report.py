#!/usr/bin/python3
"""Writes the report of one or more `softblk bench` results folders.

usage: bench/report/softblk_report.py [-o DIR] RESULTS_DIR [RESULTS_DIR...]

Reads each RESULTS_DIR (RESULTS/<plan>-<YYYYmmdd-HHMMSS>/ as `softblk bench
PLAN` writes it): machine.json, samples.jsonl (one JSON object per measured
run), commands.txt. Writes into the output folder (-o; default: the first
RESULTS_DIR, so rerunning it on a folder refreshes that folder's report):
  report.md     Markdown: the machine line of each folder, per plan its
                tables, the plots, the commands in a collapsed section
  report.html   the same, self-contained but for the images it shows from
                plots/ (open it in a browser)
  plots/*.png, plots/*.svg
                rnull: heat map of softblk's relative IOPS per workload over
                block size x jobs; every plan: bars of the median per case
                with the min-max over rounds; IOPS against queue depth where
                a plan has several queue depths

Tables, per plan:
  rnull    the Rust null_blk cover letter's table: rows block size x
           workload, columns jobs, cells "rel_read rel_write
           (read_MIOPS,write_MIOPS)" against null_blk, softblk's own median
           IOPS (min-max) and MiB/s below. Read and write IOPS come from a
           sample's extra.read_iops/extra.write_iops, else from its workload
  zloop    the zloop reply's table, one per queue count: "IOPS / MiB/s" per
           system, best of the rounds and median (min-max); softblk / peer
  fat      the unikernel FAT pull request's before/after: the case key
           "config" ("before"/"after") makes the columns; MiB/s (or ops/s)
           and every numeric extra (requests, create_us) as rows
  others   (exports, file, core, nullblk-4k, smoke) per case and peer:
           softblk's and the peer's median IOPS (min-max) and MiB/s, and
           softblk / peer with its min-max over the rounds both ran
A cell without samples shows "missing", one whose runs all failed
"failed: <error>", one skipped "skipped: <reason>"; a cell with some failed
rounds shows the ok ones and says how many failed.

Several folders are combined (their rounds side by side) only when they come
from the same machine: machine.json's host cpu_model, cpus, hypervisor and
kernel and the VM lab's accel and kernel must match. Otherwise nothing is
written and the exit status is 2, with the field that differs.

Needs Debian's python3 and python3-matplotlib (scripts/install-deps.sh).
Exit status: 0 written, 2 unusable input (message on stderr).
"""
import argparse
import os
import sys

# The package next to this file (bench/report/softblk_report/); a package
# directory wins over this same-named script on import.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Rerunning from a checkout leaves no __pycache__ in it.
sys.dont_write_bytecode = True

from softblk_report import data, render, tables  # noqa: E402


def parse_args(argv):
    doc = __doc__.split("\n", 1)
    parser = argparse.ArgumentParser(
        prog="softblk_report.py", description=doc[0],
        epilog=doc[1].split("\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", metavar="RESULTS_DIR",
                        help="a results folder of `softblk bench`")
    parser.add_argument("-o", "--out", metavar="DIR",
                        help="where report.md, report.html and plots/ go (default: the first "
                             "RESULTS_DIR)")
    return parser.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    try:
        folders = [data.load_folder(p) for p in args.results]
        data.check_same_machine(folders)
    except data.ReportError as e:
        print(f"softblk_report: {e}", file=sys.stderr)
        return 2
    if not any(f.samples for f in folders):
        print(f"softblk_report: no samples in {', '.join(args.results)}: samples.jsonl is empty "
              "(did the run start?)", file=sys.stderr)
        return 2
    try:
        from softblk_report import plots  # matplotlib loads only when there is work
    except ImportError as e:
        print(f"softblk_report: {e}: this needs Debian's python3-matplotlib "
              f"(scripts/install-deps.sh); {sys.executable} does not have it, /usr/bin/python3 "
              "should", file=sys.stderr)
        return 2

    out = args.out or args.results[0]
    os.makedirs(out, exist_ok=True)
    sections = []
    for name, plan in data.collect(folders).items():
        sections.append((name, tables.plan_tables(plan), plots.plan_plots(plan, out)))
    with open(os.path.join(out, "report.md"), "w") as fh:
        fh.write(render.markdown(folders, sections))
    with open(os.path.join(out, "report.html"), "w") as fh:
        fh.write(render.html_page(folders, sections))
    print(f"softblk_report: wrote {os.path.join(out, 'report.md')}, report.html and "
          f"{sum(len(p) for _, _, p in sections) * 2} plots")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
