"""What every plan uses: running and logging commands, starting peers and
stopping them by pid, cleaning up in reverse order (also on failure and
Ctrl-C), the servers' CPU time, and the units a plan measures."""

import os
import shutil
import signal
import subprocess
import time

import results


class Skip(Exception):
    """A system or case that cannot run here (a peer is missing): its
    samples say "skipped" with this reason."""


class Failed(Exception):
    """A run that failed (fio error, peer did not start): its sample says
    "failed" with this text, and the run goes on."""


class Unit:
    """One measured run per round: `measure(ctx)` returns a sample's fields
    (iops, mib_s, ...), or a list of {"case", "system", ...fields} when one
    program run measures several cases (and with `once`, a "round" each);
    raises Skip or Failed."""

    def __init__(self, plan, case, system, measure, seconds=None, once=False, background=False):
        self.once = once  # one run measures every round (rounds inside a VM boot)
        # Runs in a thread from the start, beside the other units (smoke's
        # VM boot: a code path, not a measurement); implies once.
        self.background = background
        self.plan = plan
        self.case = case
        self.system = system
        self.measure = measure
        self.seconds = seconds


def unavailable(plan, case, system, reason, status="skipped"):
    def measure(_ctx):
        raise (Skip if status == "skipped" else Failed)(reason)

    return Unit(plan, case, system, measure, seconds=0)


def missing_tools(*tools):
    """The tools of the list that are not on PATH."""
    return [t for t in tools if shutil.which(t) is None]


class Context:
    def __init__(self, settings, res, tools, work):
        self.settings = settings  # runtime_s, rounds, mode, quick, full
        self.results = res
        self.tools = tools  # paths of softblk's programs (softblk, bench programs)
        self.work = work
        self._cleanups = []
        self._procs = []

    # -- commands
    def run(self, cmd, timeout=None, env=None, check=True, log=True):
        """Runs CMD to its end and returns its CompletedProcess (output as
        text); Failed when it exits non-zero (with check) or runs past
        TIMEOUT. CMD runs in a process group of its own, stopped as a group
        when it times out, when the run is interrupted, and by the cleanup
        while it runs (a unit in a background thread: a VM boot): fio forks
        a process per job, and stopping fio alone left its job behind."""
        if log:
            self.results.command(cmd)
        try:
            p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                 env=env, start_new_session=True)
        except OSError as e:
            raise Failed(f"{cmd[0]}: {e.strerror}") from None
        done = False

        def stop_if_running():
            if not done:
                stop_group(p)

        self.on_cleanup(stop_if_running)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(p)
            raise Failed(f"{results.command_text(cmd)}: no answer in {timeout} s") from None
        except BaseException:
            stop_group(p)
            raise
        finally:
            done = True
        if check and p.returncode != 0:
            tail = (err.strip() or out.strip())[-600:]
            raise Failed(f"{os.path.basename(str(cmd[0]))} exited with {p.returncode}: {tail}")
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    def spawn(self, name, cmd, env=None):
        """Starts a peer in its own session (Ctrl-C reaches the driver, which
        stops it by pid) with its output in WORK/NAME.log."""
        self.results.command(cmd)
        log = open(os.path.join(self.work, f"{name}.log"), "w")
        try:
            p = subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        except OSError as e:
            raise Failed(f"{cmd[0]}: {e.strerror}") from None
        finally:
            log.close()
        self._procs.append(p)
        self.on_cleanup(lambda: stop_process(p))
        return p

    def log_tail(self, name):
        try:
            with open(os.path.join(self.work, f"{name}.log")) as f:
                return f.read().strip()[-400:]
        except OSError:
            return ""

    def wait_for(self, what, ready, proc=None, timeout=10.0):
        """Waits until ready() is true; Failed when proc exits first or
        the time runs out."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if ready():
                return
            if proc is not None and proc.poll() is not None:
                raise Failed(f"{what}: exited with {proc.returncode} before it was ready")
            time.sleep(0.05)
        raise Failed(f"{what}: not ready after {timeout:.0f} s")

    # -- cleanup
    def on_cleanup(self, fn):
        self._cleanups.append(fn)

    def cleanup(self):
        while self._cleanups:
            fn = self._cleanups.pop()
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - cleanup goes on whatever fails
                print(f"softblk bench: cleanup: {e}", file=os.sys.stderr)


def keep_log(ctx, plan, p):
    """A VM boot's output beside the samples (RESULTS/vm-PLAN-N.log)."""
    n = 1
    while os.path.exists(os.path.join(ctx.results.dir, f"vm-{plan}-{n}.log")):
        n += 1
    with open(os.path.join(ctx.results.dir, f"vm-{plan}-{n}.log"), "w") as f:
        f.write(p.stdout)
        if p.stderr:
            f.write("\n--- stderr\n" + p.stderr)


def stop_process(p, timeout=5.0):
    if p.poll() is not None:
        return
    try:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    except ProcessLookupError:
        pass


def stop_group(p, timeout=10.0):
    """SIGTERM to P's process group (P leads it), SIGKILL after TIMEOUT;
    then SIGKILL to what is left of the group once P has ended (a child
    that outlived it: fio's job processes). Called only while P is ours
    (not yet reaped, or just now), so the group is still P's."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if p.poll() is not None:
            break
        try:
            os.killpg(p.pid, sig)
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def cpu_ticks(pids):
    """utime + stime of the processes (all threads), in clock ticks."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat
        except (OSError, IndexError, ValueError):
            pass
    return total


def cpu_us_per_io(ticks, ios):
    if not ios:
        return None
    return ticks * 1e6 / os.sysconf("SC_CLK_TCK") / ios
