"""The machine a run measured: the host's CPU, its count, the hypervisor
(bare metal is "none"), the kernel and the load average.

The one place the bench driver detects the machine (a port of
bench/common/machine.sh's machine_line, which the shell scripts keep).
Two results folders whose host differs here are not one comparison.
"""

import os
import platform
import re
import shutil
import subprocess


def _cpuinfo_field(text, name):
    m = re.search(r"^" + re.escape(name) + r"\s*:\s*(.*)$", text, re.M)
    return m.group(1).strip() if m else None


def hypervisor():
    """systemd-detect-virt --vm (kvm, qemu, none...); without it, "a
    hypervisor" when the CPU flags say one runs, else "none"."""
    if shutil.which("systemd-detect-virt"):
        out = subprocess.run(["systemd-detect-virt", "--vm"], capture_output=True, text=True)
        word = out.stdout.strip()
        if word:
            return word
    try:
        with open("/proc/cpuinfo") as f:
            flags = _cpuinfo_field(f.read(), "flags") or ""
    except OSError:
        return "unknown"
    return "a hypervisor" if "hypervisor" in flags.split() else "none"


def load_average():
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


def host(cpuinfo_text=None):
    if cpuinfo_text is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo_text = f.read()
        except OSError:
            cpuinfo_text = ""
    return {
        "cpu_model": _cpuinfo_field(cpuinfo_text, "model name") or "unknown CPU",
        "cpu_family": _cpuinfo_field(cpuinfo_text, "cpu family"),
        "cpu_model_number": _cpuinfo_field(cpuinfo_text, "model"),
        "cpus": os.cpu_count(),
        "hypervisor": hypervisor(),
        "kernel": platform.release(),
        "load_before": load_average(),
        "load_after": None,
    }


def line(h):
    """The machine line of the shell scripts, for the terminal."""
    return (f"machine: {h['cpu_model']} (family {h['cpu_family']} model {h['cpu_model_number']}), "
            f"{h['cpus']} CPUs, hypervisor {h['hypervisor']}, Linux {h['kernel']}")
