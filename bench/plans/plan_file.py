"""Plan `file`: softblk's `file` target exported over FUSE+loop (its
daemon, default options) against the kernel's loop device, on copies of
one raw image (random data, the same for both) in the same directory:
$SOFTBLK_BENCH_FILE_DIR, or the run's work directory in /dev/shm (the
servers are measured, not a disk). Host-side; fio psync direct, and
io_uring where QD > 1 (--full). cpu_us_per_io is softblk's daemon's CPU
time per I/O; the kernel loop's work is not a process's and is not
counted (null for "loop")."""

import os
import shutil

import devices
from runner import Failed, Skip, Unit, missing_tools, unavailable

NAME = "file"
NEEDS_ROOT = True
DESCRIPTION = "softblk's file target over FUSE+loop against the kernel's loop device"


def _cases(mode):
    cases = [("randread", 4096, 1, 1), ("randwrite", 4096, 1, 1)]
    if mode == "smoke":
        cases = cases[:1]
    elif mode != "quick":
        cases += [("randread", 4096, 2, 1), ("randwrite", 4096, 2, 1), ("read", 131072, 1, 1),
                  ("write", 131072, 1, 1)]
    if mode == "full":
        cases += [("randread", 4096, 1, 32), ("randwrite", 4096, 1, 32)]
    return [{"workload": rw, "bs": bs, "jobs": j, "qd": q} for rw, bs, j, q in cases]


def size_mib(mode):
    return {"smoke": 64, "quick": 256}.get(mode, 512)


def _image(path, mib):
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))
        f.flush()
        os.fsync(f.fileno())


def setup(ctx):
    mode = ctx.settings["mode"]
    size = size_mib(mode)
    if os.geteuid() != 0:
        raise Skip("needs root (loop devices and FUSE mounts)")
    if missing_tools("fio", "losetup"):
        raise Skip("fio or losetup is not installed (scripts/install-deps.sh)")
    where = os.environ.get("SOFTBLK_BENCH_FILE_DIR") or ctx.work
    img_dir = os.path.join(where, f"softblk-bench-file-{os.getpid()}")
    os.makedirs(img_dir)
    ctx.on_cleanup(lambda: shutil.rmtree(img_dir, ignore_errors=True))
    base = os.path.join(img_dir, "base.img")
    _image(base, size)
    for name in ("softblk.img", "loop.img"):
        shutil.copyfile(base, os.path.join(img_dir, name))
    os.unlink(base)
    ctx.results.machine.setdefault("plan_settings", {})["file"] = {
        "image_dir": where, "size_mib": size}

    systems = {}
    d = devices.SoftblkDaemon(ctx, "file")
    try:
        info = d.add("file", f"path={os.path.join(img_dir, 'softblk.img')}", "bs=4096", "--export",
                     "fuse", "--name", "file0")
        if "loop" not in info:
            raise Failed(f"softblk's FUSE export shows no loop device: {info}")
        systems["softblk"] = (info["loop"], [d.pid()])
    except Failed as e:
        systems["softblk"] = e
    try:
        dev = devices.attach_loop(ctx, os.path.join(img_dir, "loop.img"), require_dio=False)
        systems["loop"] = (dev, [])
        ctx.results.machine["plan_settings"]["file"]["kernel_loop_dio"] = devices.loop_dio(dev)
    except Failed as e:
        systems["loop"] = e

    units = []
    for case in _cases(mode):
        for name, how in systems.items():
            if isinstance(how, Exception):
                units.append(unavailable(NAME, case, name, str(how), "failed"))
                continue
            target, pids = how
            units.append(Unit(NAME, case, name, lambda ctx, t=target, c=case, p=pids:
                              _measure(ctx, t, c, size, p)))
    return units


def _measure(ctx, target, case, size, pids):
    fields = devices.fio_sample(ctx, target, case, size, pids)
    if not pids:
        fields["cpu_us_per_io"] = None
    return fields
