"""Reading results folders (bench-spec: machine.json, samples.jsonl,
commands.txt), refusing to mix machines, and the per-cell statistics."""
import json
import os
import statistics

# The machine.json fields that make two folders different machines: a ratio
# across them would measure the machines, not softblk.
MACHINE_FIELDS = [("host", "cpu_model"), ("host", "cpus"), ("host", "hypervisor"),
                  ("host", "kernel"), ("vm", "accel"), ("vm", "kernel")]


class ReportError(Exception):
    """A problem with the input that the user must fix; exit status 2."""


class Folder:
    def __init__(self, path, machine, samples, commands):
        self.path = path
        self.name = os.path.basename(os.path.normpath(path))
        self.machine = machine
        self.samples = samples
        self.commands = commands


def load_folder(path):
    if not os.path.isdir(path):
        raise ReportError(f"{path}: not a directory; give a results folder written by "
                          "`softblk bench PLAN` (RESULTS/<plan>-<date>/)")
    machine_path = os.path.join(path, "machine.json")
    samples_path = os.path.join(path, "samples.jsonl")
    for p in (machine_path, samples_path):
        if not os.path.isfile(p):
            raise ReportError(f"{p} is missing: {path} is not a complete results folder "
                              "(bench-spec: machine.json, samples.jsonl, commands.txt)")
    try:
        with open(machine_path) as fh:
            machine = json.load(fh)
    except json.JSONDecodeError as e:
        raise ReportError(f"{machine_path}: not valid JSON ({e})") from None
    if not isinstance(machine, dict) or not isinstance(machine.get("host"), dict):
        raise ReportError(f"{machine_path}: has no \"host\" object")
    samples = []
    with open(samples_path) as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                s = json.loads(line)
            except json.JSONDecodeError as e:
                raise ReportError(f"{samples_path}:{number}: not valid JSON ({e})") from None
            for key in ("plan", "case", "system"):
                if key not in s:
                    raise ReportError(f"{samples_path}:{number}: no \"{key}\" in the sample")
            if not isinstance(s["case"], dict):
                raise ReportError(f"{samples_path}:{number}: \"case\" is not an object")
            samples.append(s)
    commands = []
    commands_path = os.path.join(path, "commands.txt")
    if os.path.isfile(commands_path):
        with open(commands_path) as fh:
            commands = [line.rstrip("\n") for line in fh if line.strip()]
    return Folder(path, machine, samples, commands)


def machine_field(machine, section, key):
    part = machine.get(section)
    if part is None:
        return None
    return part.get(key)


def check_same_machine(folders):
    """Raises ReportError naming the first field that differs."""
    first = folders[0]
    for other in folders[1:]:
        if (first.machine.get("vm") is None) != (other.machine.get("vm") is None):
            where = lambda f: "in the VM lab" if f.machine.get("vm") else "on the host"
            raise ReportError(
                f"{first.path} and {other.path} are from different machines: vm differs "
                f"({first.name} ran {where(first)}, {other.name} {where(other)}); refusing to "
                "combine them into one ratio: report each folder on its own")
        for section, key in MACHINE_FIELDS:
            a = machine_field(first.machine, section, key)
            b = machine_field(other.machine, section, key)
            if a != b:
                raise ReportError(
                    f"{first.path} and {other.path} are from different machines: "
                    f"{section}.{key} differs ({a!r} vs {b!r}); refusing to combine them into "
                    "one ratio: report each folder on its own")


def case_key(case):
    return tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in case.items()))


def direction_iops(sample):
    """(read IOPS, write IOPS) of an ok sample; None where not known. extra's
    read_iops/write_iops win; otherwise the workload's name decides."""
    extra = sample.get("extra") or {}
    if "read_iops" in extra or "write_iops" in extra:
        return float(extra.get("read_iops", 0.0)), float(extra.get("write_iops", 0.0))
    workload = str(sample["case"].get("workload", ""))
    iops = float(sample.get("iops") or 0.0)
    if workload in ("read", "randread"):
        return iops, 0.0
    if workload in ("write", "randwrite"):
        return 0.0, iops
    return None, None


class Cell:
    """Every sample of one case and one system, over rounds (and folders)."""

    def __init__(self):
        self.ok = []  # samples with status ok
        self.failed = []
        self.skipped = []

    def add(self, sample):
        status = sample.get("status", "ok")
        if status == "ok":
            self.ok.append(sample)
        elif status == "skipped":
            self.skipped.append(sample)
        else:
            self.failed.append(sample)

    @property
    def empty(self):
        return not (self.ok or self.failed or self.skipped)

    def problem(self):
        """The text that stands for the cell when it has no ok sample."""
        if self.ok:
            return None
        if self.failed:
            return "failed: " + (self.failed[0].get("error") or "no error text")
        if self.skipped:
            return "skipped: " + (self.skipped[0].get("error") or "no reason given")
        return "missing"

    def note(self):
        """Rounds that did not count, for a cell that has ok ones."""
        if not self.ok or not (self.failed or self.skipped):
            return ""
        total = len(self.ok) + len(self.failed) + len(self.skipped)
        bad = (self.failed or self.skipped)[0]
        word = "failed" if self.failed else "skipped"
        return f"{len(self.ok)} of {total} rounds ok; {word}: {bad.get('error') or '?'}"

    def values(self, field):
        return [float(s.get(field) or 0.0) for s in self.ok]

    def median(self, field="iops"):
        return statistics.median(self.values(field))

    def spread(self, field="iops"):
        v = self.values(field)
        return min(v), max(v)

    def best(self):
        """The run with the most IOPS (the zloop reference took the best)."""
        return max(self.ok, key=lambda s: float(s.get("iops") or 0.0))

    def by_round(self):
        return {s["_round"]: s for s in self.ok}

    def direction_median(self):
        """Median read and write IOPS, or (None, None) without a split."""
        pairs = [direction_iops(s) for s in self.ok]
        if any(r is None for r, _ in pairs):
            return None, None
        return (statistics.median(r for r, _ in pairs), statistics.median(w for _, w in pairs))

    def extra_median(self, key):
        v = [float(s["extra"][key]) for s in self.ok
             if isinstance(s.get("extra"), dict) and isinstance(s["extra"].get(key), (int, float))]
        return statistics.median(v) if v else None


def ratio_spread(cell, peer):
    """Min and max of softblk/peer over the rounds both have (rounds are
    interleaved, so round r of each ran side by side); None without any."""
    mine, theirs = cell.by_round(), peer.by_round()
    ratios = [float(mine[r].get("iops") or 0) / float(theirs[r]["iops"])
              for r in mine if r in theirs and theirs[r].get("iops")]
    return (min(ratios), max(ratios)) if ratios else None


class Plan:
    """The samples of one plan: cells[(case_key, system)], cases in order."""

    def __init__(self, name):
        self.name = name
        self.cases = {}  # case_key -> case dict, in first-seen order
        self.systems = []
        self.cells = {}

    def add(self, sample):
        key = case_key(sample["case"])
        self.cases.setdefault(key, sample["case"])
        if sample["system"] not in self.systems:
            self.systems.append(sample["system"])
        self.cells.setdefault((key, sample["system"]), Cell()).add(sample)

    def cell(self, case, system):
        return self.cells.get((case_key(case), system)) or Cell()

    def peers(self):
        return [s for s in self.systems if s != "softblk"]


def collect(folders):
    """Plans by name, in first-seen order. Rounds are kept apart per folder."""
    plans = {}
    for index, folder in enumerate(folders):
        for s in folder.samples:
            s = dict(s)
            s["_round"] = (index, s.get("round", 1))
            plans.setdefault(s["plan"], Plan(s["plan"])).add(s)
    return plans
