"""The results folder of one run (bench-spec.md): machine.json,
samples.jsonl (one line per measured run, written as it is measured, so
an interrupted run keeps what it measured), commands.txt.
"""

import datetime
import json
import os
import shlex
import sys
import threading
import time

import machine


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def command_text(cmd):
    return cmd if isinstance(cmd, str) else shlex.join(str(c) for c in cmd)


class Results:
    def __init__(self, root, plan, settings, softblk_info, stamp=None):
        stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
        self.dir = os.path.join(root, f"{plan}-{stamp}")
        suffix = 1
        while os.path.exists(self.dir):  # two runs in one second
            suffix += 1
            self.dir = os.path.join(root, f"{plan}-{stamp}-{suffix}")
        os.makedirs(self.dir)
        self.plan = plan
        self.machine = {
            "plan": plan,
            "host": machine.host(),
            "vm": None,
            "softblk": softblk_info,
            "runtime_s": settings["runtime_s"],
            "rounds": settings["rounds"],
            "mode": settings["mode"],
        }
        self._samples = open(os.path.join(self.dir, "samples.jsonl"), "a")
        self._commands = open(os.path.join(self.dir, "commands.txt"), "a")
        self.counts = {"ok": 0, "failed": 0, "skipped": 0}
        self._t0 = time.monotonic()
        # smoke's VM boot runs in a thread beside the host plans (Unit.background).
        self._lock = threading.RLock()
        self.write_machine()

    def write_machine(self):
        path = os.path.join(self.dir, "machine.json")
        with self._lock:
            with open(path + ".tmp", "w") as f:
                json.dump(self.machine, f, indent=2)
                f.write("\n")
            os.replace(path + ".tmp", path)

    def command(self, cmd):
        with self._lock:
            self._commands.write(command_text(cmd) + "\n")
            self._commands.flush()

    def sample(self, plan, case, system, round_, status, fields=None, error=None, started=None):
        s = {
            "plan": plan,
            "case": case,
            "system": system,
            "round": round_,
            "status": status,
            "iops": None,
            "mib_s": None,
            "cpu_us_per_io": None,
            "lat_us": None,
            "extra": {},
            "command": None,
            "started": started or now_iso(),
        }
        if fields:
            s.update(fields)
        if status != "ok":
            s["error"] = error or "unknown error"
        with self._lock:
            self.counts[status] = self.counts.get(status, 0) + 1
            self._samples.write(json.dumps(s, sort_keys=False) + "\n")
            self._samples.flush()
        return s

    def elapsed_s(self):
        return round(time.monotonic() - self._t0, 1)

    def close(self):
        self.machine["host"]["load_after"] = machine.load_average()
        # The run's wall time without the report (smoke's budget is a minute).
        self.machine["elapsed_s"] = self.elapsed_s()
        self.write_machine()
        self._samples.close()
        self._commands.close()


class Progress:
    """One line on stderr per measured run: plan, case, system, round i/N
    and the time left, estimated from the runs so far (or from the
    configured run time or the plan's estimate before the first)."""

    def __init__(self, plan, total_runs, runtime_s, stream=None, estimate_s=None):
        self.plan = plan
        self.total = max(total_runs, 1)
        self.runtime_s = runtime_s
        self.estimate_s = estimate_s  # the plan's own estimate of the whole run
        self.done = 0
        self.start = time.monotonic()
        self.stream = stream or sys.stderr

    def left_s(self):
        if self.done == 0:
            return self.estimate_s if self.estimate_s else self.total * (self.runtime_s + 1)
        per_run = (time.monotonic() - self.start) / self.done
        return per_run * (self.total - self.done)

    @staticmethod
    def case_text(case):
        return " ".join(f"{k}={v}" for k, v in case.items())

    def show(self, case, system, round_, rounds):
        left = int(self.left_s())
        self.stream.write(f"[{self.plan}] {self.case_text(case)} | {system} | round {round_}/{rounds}"
                          f" | run {self.done + 1}/{self.total} | about {left // 60}m{left % 60:02d}s left\n")
        self.stream.flush()

    def step(self):
        self.done += 1
