"""Plan `exports`: softblk's front ends with their default options against
their peers, all memory-backed (softblk's null target with
memory_backed=1; the peers' raw images in /dev/shm or nbdkit's memory
plugin), all set up first and measured round by round:
  fuse    FUSE+loop (loop with direct I/O, 4 KiB sectors, over the FUSE
          file), fio psync direct: softblk, qemu-storage-daemon's FUSE
          export ("qsd", aio=io_uring), nbdfuse over nbdkit ("nbdkit")
  nbd     fio's nbd engine over unix sockets: softblk, nbdkit's memory
          plugin, qemu-storage-daemon's NBD export
  vhost-user-blk  softblk-bench-virtio (softblk's virtio-blk driver) on
          softblk's export and qemu-storage-daemon's, per target as issue
          45 compares them (case key "target"): softblk's null target
          (no data) against qsd's null-co, and softblk's file target
          against qsd's io_uring file, both on a raw image in /dev/shm
cpu_us_per_io is the server's CPU time (all threads) per I/O.
"""

import json
import os
import subprocess

import devices
from runner import Failed, Skip, Unit, cpu_ticks, missing_tools, unavailable

NAME = "exports"
NEEDS_ROOT = False  # the fuse cases need it and are skipped without it
DESCRIPTION = "FUSE+loop, NBD, vhost-user-blk: softblk against qemu-storage-daemon and nbdkit"

K4 = 4096


def _cases(mode):
    fuse = [("randread", K4, 1), ("randwrite", K4, 1)]
    nbd = [("randread", K4, 1), ("randread", K4, 32), ("randwrite", K4, 1)]
    vhost = [("randread", K4, 1), ("randread", K4, 32), ("randwrite", K4, 1)]
    if mode == "smoke":
        return {"fuse": fuse[:1], "nbd": nbd[:1], "vhost-user-blk": vhost[:1]}
    if mode != "quick":
        fuse += [("randread", K4, 2), ("randwrite", K4, 2)]
        nbd += [("randwrite", K4, 32), ("read", 131072, 8), ("write", 131072, 8)]
        vhost += [("randwrite", K4, 32), ("read", 131072, 8)]
    if mode == "full":
        fuse += [("read", 131072, 1), ("write", 131072, 1)]
        nbd += [("read", 1048576, 8), ("write", 1048576, 8)]
        vhost += [("write", 131072, 8)]
    return {"fuse": fuse, "nbd": nbd, "vhost-user-blk": vhost}


def size_mib(mode):
    return {"smoke": 64, "quick": 256}.get(mode, 1024)


def _case(export, c, extra=None):
    rw, bs, n = c
    if export == "fuse":
        return {"export": export, **(extra or {}), "workload": rw, "bs": bs, "jobs": n, "qd": 1}
    return {"export": export, **(extra or {}), "workload": rw, "bs": bs, "jobs": 1, "qd": n}


def _systems(ctx, export, cases, systems, extra=None):
    """Units for every case x system; systems: name -> (target, pids) or
    an exception (Skip/Failed) that says why the system is not there;
    extra: case keys of these systems' pairing (the vhost target)."""
    units = []
    size = size_mib(ctx.settings["mode"])
    for c in cases:
        case = _case(export, c, extra)
        for name, how in systems.items():
            if isinstance(how, Exception):
                status = "skipped" if isinstance(how, Skip) else "failed"
                units.append(unavailable(NAME, case, name, str(how), status))
                continue
            target, pids = how
            if export == "vhost-user-blk":
                measure = _virtio_measure(target, case, size, pids)
            else:
                measure = (lambda ctx, t=target, cs=case, p=pids:
                           devices.fio_sample(ctx, t, cs, size, p))
            units.append(Unit(NAME, case, name, measure))
    return units


def _try(fn):
    try:
        return fn()
    except (Skip, Failed) as e:
        return e


def _wait_mount(path):
    with open("/proc/self/mounts") as f:
        return f" {path} " in f.read()


def _fuse_systems(ctx, d, size):
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse") or not os.path.exists("/dev/loop-control"):
        reason = Skip("FUSE+loop needs root, /dev/fuse and /dev/loop-control")
        return {"softblk": reason, "qsd": reason, "nbdkit": reason}
    work = ctx.work

    def softblk():
        info = d.add("null", f"size={size}", "memory_backed=1", "bs=4096", "--export", "fuse",
                     "--name", "fuse0")
        if "loop" not in info:
            raise Failed(f"softblk's FUSE export shows no loop device: {info}")
        dev = info["loop"]
        ctx.run(["dd", "if=/dev/zero", f"of={dev}", "bs=1M", f"count={size}", "oflag=direct",
                 "status=none"], timeout=300)
        return dev, [d.pid()]

    def qsd():
        if missing_tools("qemu-storage-daemon"):
            raise Skip("qemu-storage-daemon is not installed (scripts/install-deps.sh)")
        img = os.path.join(work, "qsd-fuse.img")
        mnt = os.path.join(work, "qsd-fuse.mnt")
        subprocess.run(["truncate", "-s", f"{size}M", img], check=True)
        open(mnt, "w").close()
        p = ctx.spawn("qsd-fuse", ["qemu-storage-daemon", "--blockdev",
                                   f"driver=file,node-name=n0,filename={img},aio=io_uring",
                                   "--export", f"type=fuse,id=e0,node-name=n0,mountpoint={mnt},writable=on"])
        ctx.on_cleanup(lambda: subprocess.run(["umount", "-l", mnt], capture_output=True))
        ctx.wait_for("qemu-storage-daemon (FUSE)", lambda: _wait_mount(mnt), p)
        return devices.attach_loop(ctx, mnt, size), [p.pid]

    def nbdkit():
        if missing_tools("nbdkit", "nbdfuse"):
            raise Skip("nbdkit or nbdfuse is not installed (scripts/install-deps.sh)")
        sock = os.path.join(work, "nbdkit-fuse.sock")
        mnt = os.path.join(work, "nbdfuse.mnt")
        os.mkdir(mnt)
        k = ctx.spawn("nbdkit-fuse", ["nbdkit", "--foreground", "-U", sock, "memory", f"size={size}M"])
        ctx.wait_for("nbdkit", lambda: os.path.exists(sock), k)
        f = ctx.spawn("nbdfuse", ["nbdfuse", os.path.join(mnt, "disk"), "--unix", sock])
        ctx.on_cleanup(lambda: subprocess.run(["umount", "-l", mnt], capture_output=True))
        ctx.wait_for("nbdfuse", lambda: os.path.exists(os.path.join(mnt, "disk")), f)
        return devices.attach_loop(ctx, os.path.join(mnt, "disk"), size), [f.pid, k.pid]

    return {"softblk": _try(softblk), "qsd": _try(qsd), "nbdkit": _try(nbdkit)}


def _nbd_systems(ctx, d, size):
    p = subprocess.run(["fio", "--enghelp"], capture_output=True, text=True)
    if "nbd" not in p.stdout.split():
        reason = Skip("this fio has no nbd engine")
        return {"softblk": reason, "nbdkit": reason, "qsd": reason}
    work = ctx.work

    def softblk():
        info = d.add("null", f"size={size}", "memory_backed=1", "--export", "nbd", "--name", "nbd0")
        if "uri" not in info:
            raise Failed(f"softblk's NBD export shows no uri: {info}")
        return info["uri"], [d.pid()]

    def nbdkit():
        if missing_tools("nbdkit"):
            raise Skip("nbdkit is not installed (scripts/install-deps.sh)")
        sock = os.path.join(work, "nbdkit.sock")
        k = ctx.spawn("nbdkit-nbd", ["nbdkit", "--foreground", "-U", sock, "--exportname", "d0",
                                     "memory", f"size={size}M"])
        ctx.wait_for("nbdkit", lambda: os.path.exists(sock), k)
        return f"nbd+unix:///d0?socket={sock}", [k.pid]

    def qsd():
        if missing_tools("qemu-storage-daemon"):
            raise Skip("qemu-storage-daemon is not installed (scripts/install-deps.sh)")
        img = os.path.join(work, "qsd-nbd.img")
        sock = os.path.join(work, "qsd-nbd.sock")
        subprocess.run(["truncate", "-s", f"{size}M", img], check=True)
        q = ctx.spawn("qsd-nbd", [
            "qemu-storage-daemon", "--blockdev",
            f"driver=file,node-name=file0,filename={img},aio=io_uring,cache.direct=off",
            "--blockdev", "driver=raw,node-name=raw0,file=file0",
            "--nbd-server", f"addr.type=unix,addr.path={sock}",
            "--export", "type=nbd,id=e0,node-name=raw0,name=d0,writable=on"])
        ctx.wait_for("qemu-storage-daemon (NBD)", lambda: os.path.exists(sock), q)
        return f"nbd+unix:///d0?socket={sock}", [q.pid]

    systems = {"softblk": _try(softblk), "nbdkit": _try(nbdkit), "qsd": _try(qsd)}
    # Fill every device once: reads return data, not holes.
    for name, how in systems.items():
        if not isinstance(how, Exception):
            r = ctx.run(["fio", "--name=fill", "--ioengine=nbd", f"--uri={how[0]}", "--rw=write",
                         "--bs=1m", "--iodepth=8", f"--size={size}M"], timeout=300, check=False)
            if r.returncode != 0:
                systems[name] = Failed(f"filling the device failed: {r.stderr.strip()[-300:]}")
    return systems


def _virtio_measure(sock, case, size, pids):
    def measure(ctx):
        cmd = [ctx.tools["bench-virtio"], "--path", sock, "--rw", case["workload"], "--bs",
               str(case["bs"]), "--qd", str(case["qd"]), "--seconds", str(ctx.settings["runtime_s"]),
               "--size", str(size), "--backend-pid", str(pids[0])]
        p = ctx.run(cmd, timeout=ctx.settings["runtime_s"] * 4 + 60)
        try:
            out = json.loads(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise Failed(f"softblk-bench-virtio printed no JSON: {p.stdout[-300:]}") from None
        return {"iops": out["iops"], "mib_s": out["mib_s"],
                "cpu_us_per_io": out.get("backend_cpu_us_per_io"),
                "extra": {"ios": out["ios"], "client_cpu_us_per_io": out["cpu_us_per_io"]},
                "command": " ".join(cmd)}

    return measure


def _vhost_systems(ctx, d, size):
    """{target: {system: (socket, pids) or why not}}: issue 45's pairs,
    softblk's null against null-co and its file target against qsd's
    io_uring file, every export with its default options."""
    if not ctx.tools.get("bench-virtio"):
        reason = Skip("softblk-bench-virtio is not built (ninja softblk-bench-virtio)")
        return {t: {"softblk": reason, "qsd": reason} for t in ("null", "file")}
    work = ctx.work

    def softblk(target):
        sock = os.path.join(work, f"softblk-vhost-{target}.sock")
        # max_sectors=2048: a 128 KiB request is not split, as null-co's is not.
        opts = ([f"size={size}", "max_sectors=2048"] if target == "null" else
                [f"path={os.path.join(work, 'softblk-vhost.img')}", f"size={size}M", "create=1"])
        d.add(target, *opts, "--export", "vhost-user-blk", "--export-opt", f"socket={sock}",
              "--name", f"vhost-{target}")
        return sock, [d.pid()]

    def qsd(target):
        if missing_tools("qemu-storage-daemon"):
            raise Skip("qemu-storage-daemon is not installed (scripts/install-deps.sh)")
        sock = os.path.join(work, f"qsd-vhost-{target}.sock")
        if target == "null":
            node = f"driver=null-co,node-name=f0,size={size * 1048576}"
        else:
            img = os.path.join(work, "qsd-vhost.img")
            subprocess.run(["truncate", "-s", f"{size}M", img], check=True)
            node = f"driver=file,node-name=f0,filename={img},aio=io_uring"
        q = ctx.spawn(f"qsd-vhost-{target}", [
            "qemu-storage-daemon", "--blockdev", node,
            "--export", f"type=vhost-user-blk,id=e1,node-name=f0,addr.type=unix,addr.path={sock},"
            "writable=on,num-queues=1"])
        ctx.wait_for("qemu-storage-daemon (vhost-user-blk)", lambda: os.path.exists(sock), q)
        return sock, [q.pid]

    out = {t: {"softblk": _try(lambda t=t: softblk(t)), "qsd": _try(lambda t=t: qsd(t))}
           for t in ("null", "file")}
    for name, how in out["file"].items():  # the files are read back, not holes
        if not isinstance(how, Exception):
            r = ctx.run([ctx.tools["bench-virtio"], "--path", how[0], "--rw", "write", "--bs", "1048576",
                         "--qd", "4", "--seconds", "1", "--size", str(size)], timeout=120, check=False)
            if r.returncode != 0:
                out["file"][name] = Failed(f"filling the device failed: {r.stderr.strip()[-300:]}")
    return out


def setup(ctx):
    mode = ctx.settings["mode"]
    size = size_mib(mode)
    if missing_tools("fio"):
        raise Skip("fio is not installed (scripts/install-deps.sh)")
    d = devices.SoftblkDaemon(ctx, "exports")
    cases = _cases(mode)
    units = []
    units += _systems(ctx, "fuse", cases["fuse"], _fuse_systems(ctx, d, size))
    units += _systems(ctx, "nbd", cases["nbd"], _nbd_systems(ctx, d, size))
    for target, systems in _vhost_systems(ctx, d, size).items():
        units += _systems(ctx, "vhost-user-blk", cases["vhost-user-blk"], systems, {"target": target})
    return units
