#!/usr/bin/env python3
"""softblk bench PLAN: runs a benchmark plan and writes one results folder
(bench-spec: machine.json, samples.jsonl, commands.txt), then the report
(bench/report/softblk_report.py) when that generator is there.

usage: softblk bench PLAN [--quick|--full] [--runtime S] [--rounds N] [--out DIR]
       softblk bench --list

Rounds are interleaved: round 1 of every case and system, then round 2...
The medians and spread are the report's job; the load average is recorded
before and after. `softblk` execs this driver (docs/bench.md).
"""

import argparse
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # nothing written into the source tree

import machine  # noqa: E402
import plans  # noqa: E402
from results import Progress, Results, now_iso  # noqa: E402
from runner import Context, Failed, Skip  # noqa: E402

DEFAULTS = {  # mode -> (runtime_s, rounds)
    "smoke": (0.5, 1),  # code paths, not figures: half-second runs keep it under a minute
    "quick": (2, 2),
    "default": (5, 3),
    "full": (10, 5),
}


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="softblk bench", description="run a benchmark plan",
                                 epilog="plans:\n" + plans.listing(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan", nargs="?", metavar="PLAN", help="the plan to run (--list shows them)")
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a representative subset, shorter runs")
    size.add_argument("--full", action="store_true", help="every case of the plan, longer runs")
    ap.add_argument("--runtime", type=float, metavar="S", help="seconds per measured run")
    ap.add_argument("--rounds", type=int, metavar="N", help="rounds (every case and system once per round)")
    ap.add_argument("--out", default="bench-results", metavar="DIR",
                    help="where the results folder goes (default ./bench-results)")
    ap.add_argument("--list", action="store_true", help="list the plans")
    return ap.parse_args(argv)


def repo_root():
    root = os.path.dirname(os.path.dirname(HERE))
    return root if os.path.isdir(os.path.join(root, ".git")) or os.path.exists(
        os.path.join(root, ".git")) else None


def find_tools():
    """softblk and the bench programs: given by `softblk` (the environment),
    next to this driver (an install: libexec/softblk), or in the newest
    build*/ of this source tree."""
    tools = {}
    names = {"softblk": ("softblk", "src/cli/softblk"),
             "bench-core": ("softblk-bench-core", "bench/core/softblk-bench-core"),
             "bench-fat": ("softblk-bench-fat", "bench/fat/softblk-bench-fat"),
             "bench-virtio": ("softblk-bench-virtio", "bench/virtio/softblk-bench-virtio"),
             "driver": ("softblk-driver", "src/driver/softblk-driver")}
    build = os.environ.get("SOFTBLK_BENCH_BUILD_DIR")
    builds = [build] if build else []
    root = repo_root()
    if root:
        builds += sorted(glob.glob(os.path.join(root, "build*")), key=os.path.getmtime, reverse=True)
    for key, (program, in_build) in names.items():
        candidates = []
        if key == "softblk" and os.environ.get("SOFTBLK_BENCH_SOFTBLK"):
            candidates.append(os.environ["SOFTBLK_BENCH_SOFTBLK"])
        candidates.append(os.path.join(HERE, program))
        candidates += [os.path.join(b, in_build) for b in builds]
        tools[key] = next((c for c in candidates if os.access(c, os.X_OK) and os.path.isfile(c)), None)
    tools["source"] = root  # the VM lab (tests/vm) lives there
    return tools


def softblk_info():
    commit = None
    root = repo_root()
    if root and shutil.which("git"):
        p = subprocess.run(["git", "-C", root, "describe", "--always", "--dirty", "--abbrev=12"],
                           capture_output=True, text=True)
        commit = p.stdout.strip() or None
    return {"version": os.environ.get("SOFTBLK_BENCH_VERSION"), "commit": commit}


def settings_for(args):
    mode = "smoke" if args.plan == "smoke" else "quick" if args.quick else "full" if args.full else "default"
    runtime, rounds = DEFAULTS[mode]
    if args.runtime is not None:
        runtime = args.runtime if args.runtime != int(args.runtime) else int(args.runtime)
    if args.rounds is not None:
        rounds = args.rounds
    return {"mode": mode, "runtime_s": runtime, "rounds": rounds}


def _terminate(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run_plan(args, tools, out=sys.stderr):
    settings = settings_for(args)
    res = Results(args.out, args.plan, settings, softblk_info())
    print(machine.line(res.machine["host"]), file=out)
    print(f"softblk bench {args.plan}: {settings['mode']}, {settings['runtime_s']} s runs, "
          f"{settings['rounds']} rounds -> {res.dir}", file=out)
    work = tempfile.mkdtemp(prefix="softblk-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    ctx = Context(settings, res, tools, work)
    interrupted = False
    background = []
    try:
        units = []
        for module in plans.modules(args.plan):
            try:
                got = module.setup(ctx)
                units += got
                for unit in got:  # started at once, while the other plans set up
                    if unit.background:
                        print(f"[{args.plan}] {Progress.case_text(unit.case)} | {unit.system}: "
                              "started in the background, beside the other runs", file=out)
                        t = threading.Thread(target=measure_timed, args=(ctx, unit), daemon=True)
                        t.start()
                        background.append((unit, t))
            except Exception as e:  # noqa: BLE001 - a plan that cannot start is recorded, the run goes on
                status = "skipped" if isinstance(e, Skip) else "failed"
                res.sample(module.NAME, {}, "softblk", 0, status, error=f"{module.NAME}: {e}")
                print(f"softblk bench: {module.NAME}: {status}: {e}", file=out)
        rounds = settings["rounds"]
        runs = sum(1 if u.once else rounds for u in units)
        estimate = sum((u.seconds if u.seconds is not None else settings["runtime_s"] + 1)
                       * (1 if u.once else rounds) for u in units)
        progress = Progress(args.plan, runs, settings["runtime_s"], out, estimate)
        for round_ in range(1, rounds + 1):
            for unit in units:
                if unit.background or unit.once and round_ > 1:
                    continue
                progress.show(unit.case, unit.system, round_, rounds)
                measure(ctx, unit, round_)
                progress.step()
        # Where smoke's minute goes: when the foreground runs ended (and
        # each background unit, measure_timed); the report shows both.
        res.machine.setdefault("timing_s", {})["foreground"] = res.elapsed_s()
        for unit, t in background:
            if t.is_alive():
                print(f"[{args.plan}] waiting for {Progress.case_text(unit.case)} | {unit.system}",
                      file=out)
            while t.is_alive():
                t.join(0.5)  # in steps: Ctrl-C and SIGTERM still reach this thread
            progress.step()
    except KeyboardInterrupt:
        interrupted = True
        print("softblk bench: interrupted; cleaning up (the samples so far are kept)", file=out)
    finally:
        ctx.cleanup()  # stops a background unit's processes: its thread then ends
        for _unit, t in background:
            t.join(30)
        shutil.rmtree(work, ignore_errors=True)
        res.close()
    return res, interrupted


def measure_timed(ctx, unit):
    """A background unit's one run, and when it ended (machine.json timing_s)."""
    measure(ctx, unit, 1)
    ctx.results.machine.setdefault("timing_s", {})[Progress.case_text(unit.case)] = ctx.results.elapsed_s()


def measure(ctx, unit, round_):
    res = ctx.results
    started = now_iso()
    try:
        got = unit.measure(ctx)
    except Skip as e:
        res.sample(unit.plan, unit.case, unit.system, round_, "skipped", error=str(e))
        return
    except Exception as e:  # noqa: BLE001 - Failed, or a bug or OSError in one run: recorded, the run goes on
        error = str(e) if isinstance(e, Failed) else f"{type(e).__name__}: {e}"
        res.sample(unit.plan, unit.case, unit.system, round_, "failed", error=error)
        print(f"  failed: {error}", file=sys.stderr)
        return
    records = got if isinstance(got, list) else [dict(got, case=unit.case, system=unit.system)]
    for r in records:
        r = dict(r)
        case, system = r.pop("case"), r.pop("system")
        status = r.pop("status", "ok") or "ok"
        error = r.pop("error", None)
        plan = r.pop("plan", unit.plan)  # a unit that measures several plans (smoke's VM boot)
        res.sample(plan, case, system, round_, status, fields=r, error=error, started=started)


def report(res_dir, out=sys.stderr):
    gen = os.path.join(os.path.dirname(HERE), "report", "softblk_report.py")
    if not os.path.isfile(gen):
        print("report generator not found (bench/report/softblk_report.py); the results folder "
              f"stays: {res_dir}", file=out)
        return None
    # By its own first line (Debian's /usr/bin/python3, which has
    # python3-matplotlib), not by this driver's interpreter: a python3
    # earlier on PATH (pyenv, a venv) need not have matplotlib.
    p = subprocess.run([gen, res_dir] if os.access(gen, os.X_OK) else [sys.executable, gen, res_dir])
    if p.returncode != 0:
        print(f"the report generator exited with {p.returncode}; the results folder stays: {res_dir}",
              file=out)
    return p.returncode


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.list:
        print("plans:\n" + plans.listing())
        return 0
    if not args.plan:
        print("usage: softblk bench PLAN [--quick|--full] [--runtime S] [--rounds N] [--out DIR]\n"
              "plans:\n" + plans.listing(), file=sys.stderr)
        return 2
    if args.plan != "smoke" and args.plan not in plans.IMPLEMENTED:
        print(f"softblk bench: unknown plan '{args.plan}'; the plans:\n{plans.listing()}", file=sys.stderr)
        return 2
    if args.runtime is not None and args.runtime <= 0 or args.rounds is not None and args.rounds < 1:
        print("softblk bench: --runtime must be > 0 and --rounds >= 1", file=sys.stderr)
        return 2
    needs_root = [m.NAME for m in plans.modules(args.plan) if m.NEEDS_ROOT]
    if needs_root and os.geteuid() != 0 and args.plan != "smoke":
        print(f"softblk bench {args.plan}: needs root (loop devices and FUSE mounts); run it as root",
              file=sys.stderr)
        return 1
    tools = find_tools()
    if not tools["softblk"]:
        print("softblk bench: the softblk program was not found; build it (ninja softblk)",
              file=sys.stderr)
        return 1
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate)
    res, interrupted = run_plan(args, tools)
    c = res.counts
    print(f"softblk bench {args.plan}: {c['ok']} ok, {c['failed']} failed, {c['skipped']} skipped -> "
          f"{res.dir}", file=sys.stderr)
    if interrupted:
        return 130
    report(res.dir)
    return 1 if c["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
