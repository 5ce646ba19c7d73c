"""Plan `zloop` (VM lab): the zloop-against-ublk comparison
(../shared/references/zloop-vs-ublk-zoned.txt): fio --zonemode=zbd, io_uring
direct, 4 KiB random write QD 1, 4 KiB random write QD 32 x 8 jobs,
128 KiB random and sequential write QD 32, with 1 queue and as many
queues as the guest has CPUs, on the kernel's zoned null_blk, softblk's
zoned null over ublk, softblk's zloop target over ublk (zone files on ext4
on a RAM disk) and, with the backports kernel and its out-of-tree zloop.ko,
the kernel's zloop on the same file system (bench/zoned/vm_guest.sh under
tests/vm/run-vm, one boot; its rounds interleave the devices). Best-of and
median over rounds are the report's."""

import os
import re

from runner import Failed, Skip, Unit, keep_log

NAME = "zloop"
NEEDS_ROOT = False
DESCRIPTION = ("VM lab: kernel zloop and null_blk against softblk's zloop and zoned null over "
               "ublk, 1 and N queues")

# vm_guest.sh's device names -> (system, case keys)
_SYSTEMS = {
    "nullb": ("null_blk", {"target": "null"}),
    "sbnull": ("softblk", {"target": "null"}),
    "sbzloop": ("softblk", {"target": "zloop"}),
    "sbzlcopy": ("softblk", {"target": "zloop", "zero_copy": 0}),
    "kzloop": ("kernel-zloop", {"target": "zloop"}),
}
_LINE = re.compile(r"^(FAILED: )?round (\d+) q(\d+) (\w+) (\w+) (\d+)([km]) qd(\d+) x(\d+)"
                   r"(?:: (\S+) IOPS (\S+) MiB/s)?")


def parse(text):
    """vm_guest.sh's output -> (vm info, records, kernel zloop missing)."""
    vm = {}
    m = re.search(r"softblk-vm: init started at [0-9.]+ s, kernel (\S+), (\d+) cpus", text)
    if m:
        vm = {"kernel": m.group(1), "cpus": int(m.group(2))}
    records = []
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m or m.group(4) not in _SYSTEMS:
            continue
        failed, rnd, q, sys_, rw, bs, unit, qd, nj, iops, mib = m.groups()
        system, keys = _SYSTEMS[sys_]
        case = {**keys, "queues": int(q), "workload": rw,
                "bs": int(bs) << (10 if unit == "k" else 20), "qd": int(qd), "jobs": int(nj)}
        rec = {"case": case, "system": system, "round": int(rnd), "extra": {"device": sys_}}
        if failed:
            rec.update(status="failed", error="fio failed on the device (see the guest log)")
        else:
            rec.update(iops=float(iops), mib_s=float(mib))
        records.append(rec)
    return vm, records, "no zloop module in" in text


def guest_env(mode, runtime, rounds, cpus):
    """vm_guest.sh's environment (run-vm --env NAME=VALUE) for a mode: the
    smoke run measures one job with one queue on small devices (the code
    path, not the table)."""
    env = [f"RUNTIME={runtime}", f"ROUNDS={rounds}"]
    if mode == "smoke":
        return env + ["QUEUE_COUNTS=1", "JOBS=randwrite 4k 1 1", "SIZE_MIB=64", "ZONE_FS_MIB=160"]
    return env + [f"QUEUE_COUNTS=1 {cpus}"]


def records(text, command):
    """The samples of vm_guest.sh's output (the kernel's zloop "skipped"
    where the guest kernel has none): (vm info, records)."""
    vm, records, no_kzloop = parse(text)
    for r in records:
        r["command"] = command
    if no_kzloop:
        for case in {tuple(sorted(r["case"].items())) for r in records
                     if r["extra"]["device"] == "sbzloop"}:
            records.append({"case": dict(case), "system": "kernel-zloop", "status": "skipped",
                            "error": f"no zloop module in the guest's kernel ({vm.get('kernel')})",
                            "command": command})
    return vm, records


def setup(ctx):
    root = ctx.tools.get("source")
    run_vm = os.path.join(root, "tests", "vm", "run-vm") if root else None
    if not run_vm or not os.access(run_vm, os.X_OK):
        raise Skip("the VM lab (tests/vm/run-vm of softblk's source tree) is not here")
    mode = ctx.settings["mode"]
    cpus = 2 if mode == "smoke" else 4
    # The kernel's zloop: Debian's backports kernel and zloop.ko built out
    # of tree by the lab (cached after the first time); smoke: 6.12 only.
    kernel = ["--kernel", "6.12"] if mode == "smoke" else ["--kernel", "backports", "--module", "zloop"]
    runtime = ctx.settings["runtime_s"]
    rounds = ctx.settings["rounds"]
    cmd = [run_vm, os.path.join(root, "bench", "zoned", "vm_guest.sh"), "--bin", ctx.tools["softblk"],
           "--mem", 3072, "--cpus", cpus, "--timeout", int(rounds * 2 * 4 * 5 * (runtime + 3) + 600),
           *kernel]
    for e in guest_env(mode, runtime, rounds, cpus):
        cmd += ["--env", e]
    ctx.results.machine["vm"] = {"accel": "tcg", "kernel": None, "cpus": cpus, "mem_mib": 3072}

    def measure(ctx):
        p = ctx.run(cmd, timeout=int(cmd[cmd.index("--timeout") + 1]) + 300, check=False)
        keep_log(ctx, NAME, p)
        if p.returncode == 77:
            raise Skip("VM lab: " + next((x.strip() for x in p.stdout.splitlines() if "SKIP" in x),
                                         "it cannot run here"))
        vm, recs = records(p.stdout, " ".join(str(c) for c in cmd))
        if vm:
            ctx.results.machine["vm"].update(vm)
        if not recs:
            tail = (p.stdout.strip() + "\n" + p.stderr.strip()).strip()[-400:]
            raise Failed(f"run-vm exited with {p.returncode} and no measurement: {tail}")
        return recs

    return [Unit(NAME, {"boot": "all cases, rounds inside"}, "all", measure,
                 seconds=rounds * 2 * 4 * 4 * (runtime + 2) + 60, once=True)]
