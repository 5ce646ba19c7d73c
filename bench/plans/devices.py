"""softblk's daemon in a private run directory, loop devices, and a fio
run on a device with the server's CPU time per I/O."""

import os
import subprocess

import fio
from runner import Failed, cpu_ticks, cpu_us_per_io


class SoftblkDaemon:
    """The `softblk` CLI with its own run directory: the first `add`
    starts the daemon; cleanup deletes every device and stops it."""

    def __init__(self, ctx, name="softblk"):
        self.ctx = ctx
        self.run_dir = os.path.join(ctx.work, f"{name}-run")
        self.env = dict(os.environ, SOFTBLK_RUN_DIR=self.run_dir)
        self._started = False

    def cli(self, *args, timeout=60):
        return self.ctx.run([self.ctx.tools["softblk"], *args], timeout=timeout, env=self.env)

    def add(self, *args):
        """`softblk add ARGS`: its `key: value` lines."""
        if not self._started:
            self._started = True
            self.ctx.on_cleanup(self.stop)
        out = self.cli("add", *args).stdout
        info = {}
        for line in out.splitlines():
            key, sep, value = line.strip().partition(": ")
            if sep:
                info[key] = value
        return info

    def pid(self):
        with open(os.path.join(self.run_dir, "daemon.pid")) as f:
            return int(f.read().split()[0])

    def stop(self):
        pid = None
        try:
            pid = self.pid()
        except (OSError, ValueError, IndexError):
            pass
        for args in (["del", "--all"], ["shutdown", "--force"]):
            try:
                self.cli(*args, timeout=30)
            except Failed:
                pass
        if pid is not None:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def attach_loop(ctx, path, fill_mib=0, require_dio=True):
    """A loop device with direct I/O and 4 KiB sectors over PATH, detached
    at cleanup; written in full first when fill_mib (the same data on every
    device: read back, not holes)."""
    dev = ctx.run(["losetup", "--direct-io=on", "--sector-size", "4096", "--show", "-f", path],
                  timeout=30).stdout.strip()
    ctx.on_cleanup(lambda: subprocess.run(["losetup", "-d", dev], capture_output=True))
    if require_dio and not loop_dio(dev):
        raise Failed(f"{dev}: the loop device has no direct I/O over {path}")
    if fill_mib:
        ctx.run(["dd", "if=/dev/zero", f"of={dev}", "bs=1M", f"count={fill_mib}", "oflag=direct",
                 "status=none"], timeout=300)
    return dev


def loop_dio(dev):
    """Whether the kernel took --direct-io=on (not every file system can)."""
    with open(f"/sys/block/{os.path.basename(dev)}/loop/dio") as f:
        return f.read().strip() == "1"


def fio_sample(ctx, target, case, size_mib, server_pids):
    """Runs fio for CASE (workload, bs, jobs, qd) on TARGET; the sample's
    fields with the servers' CPU time per I/O."""
    cmd = fio.command(target, case["workload"], case["bs"], case.get("jobs", 1), case.get("qd", 1),
                      size_mib, ctx.settings["runtime_s"])
    before = cpu_ticks(server_pids)
    p = ctx.run(cmd, timeout=ctx.settings["runtime_s"] * 4 + 60, check=False)
    after = cpu_ticks(server_pids)
    try:
        fields = fio.parse(p.stdout)
    except fio.FioError as e:
        raise Failed(f"{e}; stderr: {p.stderr.strip()[-300:]}") from None
    if p.returncode != 0:
        raise Failed(f"fio exited with {p.returncode}: {p.stderr.strip()[-300:]}")
    fields["cpu_us_per_io"] = cpu_us_per_io(after - before, fields["extra"]["ios"])
    fields["command"] = " ".join(cmd)
    return fields
