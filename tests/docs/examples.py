#!/usr/bin/env python3
"""The command examples of README.md and docs/*.md do what their text says.

Runs, page by page and in the order written, every command of the pages'
shell blocks (```sh, and unlabeled blocks made only of `softblk` lines)
with the built `softblk` first on PATH, each page in a run directory and
a scratch directory of its own, and fails when one does not exit as the
text implies (0, unless EXPECT below says the text shows an error) or
does not print what its comment says it prints (EXPECT). Lines that are
syntax rather than examples (IMAGE, [OPTIONS], ...) are not run; lines
this machine cannot or must not run are listed with the reason (SKIP).
Also checks that every inline `softblk WORD ...` names a real subcommand.

Paths the examples write to are moved into the scratch directory
(REWRITE), so that a run touches nothing outside it; devices, mounts and
the daemon are removed after each page, also when a command failed.

Usage: examples.py PATH/TO/softblk SOURCE_DIR   (exit 77: not root / no FUSE)
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

PAGES = ["README.md"] + [f"docs/{p}" for p in (
    "null.md", "file.md", "zoned.md", "fuse.md", "nbd.md", "ublk.md",
    "virtio.md", "rbd.md", "fat.md", "fio.md", "bench.md", "reliability.md",
    "architecture.md", "config.md")]

# Programs an example may start with; others are build or benchmark
# commands that their own tests run (listed as not run, with this reason).
PROGRAMS = {"softblk", "mkdir", "echo", "cat", "rmdir", "ls"}

# (page, command as written) -> why it is not run here.
SKIP = {
    ("docs/file.md", "softblk add file path=/dev/sdb"):
        "a whole disk: a test never takes one of the machine's disks",
    ("docs/virtio.md", "softblk fat mkfs softblk:virtio:path=/tmp/qsd.sock,poll_queues=0"):
        "needs a qemu-storage-daemon serving /tmp/qsd.sock (tests/virtio run it)",
}

# Path prefixes the examples name, moved into the page's scratch directory;
# /run/softblk, the system daemon's run directory, is the page's own.
REWRITE = ["/tmp/nullb", "/var/lib/images", "/var/tmp", "/srv", "./photos", "/etc/softblk"]

# Shell run in the scratch directory before a page's examples: what the
# text takes as given ("an existing image", "a folder of photos").
SETUP = {
    "README.md": "mkdir -p var/tmp",
    "docs/file.md": "mkdir -p srv var/lib/images && truncate -s 64M srv/base.img",
    "docs/fat.md": "mkdir -p photos && echo hello > photos/a.txt",
}

# (page, command) -> what the text says it does: rc ("ok" or "error"),
# stdout / stderr: regular expressions that must match (re.search, MULTILINE).
EXPECT = {
    ("docs/null.md", "softblk get nb0 mbps"): {"stdout": r"^40960$"},
    ("docs/config.md", "softblk apply --dry-run"): {"stdout": r"^create +scratch .*\(dry run\)$"},
    ("docs/config.md", "softblk list"): {"stdout": r"data: empty after restart \(memory-backed\)"},
    ("docs/config.md", "softblk apply --prune"): {"stdout": r"^unchanged +scratch"},
    ("docs/null.md", "softblk get nb0"): {"stdout": r"\A([a-z0-9_/-]+=.*\n)+\Z"},
    ("docs/null.md", "softblk set nb0 size=128"):
        {"rc": "error", "stderr": r"size cannot change while the device is powered on"},
    ("docs/null.md", "cat /tmp/nullb/nb0/device"): {"stdout": r"^/dev/(ublkb|loop)\d+$"},
    ("README.md", "softblk get fast size mbps"): {"stdout": r"^size=1024\nmbps=\d+$"},
    ("README.md", "softblk zone report z0"): {"stdout": r"zcond: 1\(em\)"},
    ("README.md", "softblk list"): {"stdout": r"^fast\s+null"},
}


def code_blocks(text):
    """Yields the lines of each runnable fenced block."""
    block, info = None, ""
    for line in text.splitlines():
        m = re.match(r"^```(\S*)", line)
        if m:
            if block is None:
                block, info = [], m.group(1)
            else:
                lines = [ln for ln in block if ln.strip()]
                if info == "sh" or (info == "" and lines and all(
                        ln.startswith("softblk ") for ln in lines)):
                    yield block
                block = None
            continue
        if block is not None:
            block.append(line)


def split_comment(line):
    """The command and its trailing comment (a `#` after a blank, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def commands(block):
    """The commands of a block, continuation lines joined, comment lines dropped."""
    out, pending = [], ""
    for raw in block:
        cmd, _ = split_comment(raw)
        if not cmd.strip():
            continue
        if cmd.endswith("\\"):
            pending += cmd[:-1].strip() + " "
            continue
        out.append((pending + cmd.strip()).strip())
        pending = ""
    return out


SYNTAX = re.compile(r"\[|\.\.\.|\||\b[A-Z][A-Z_]{2,}\b")


def run(cmd, env, cwd):
    return subprocess.run(["bash", "-c", cmd], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def tear_down(softblk, env, scratch):
    """Removes what a page's examples made: devices, mounts, the daemon."""
    for mnt in reversed(open("/proc/self/mounts").read().splitlines()):
        point = mnt.split()[1]
        if point.startswith(scratch + "/"):
            subprocess.run([softblk, "nullb", "umount", point], env=env, capture_output=True)
            subprocess.run(["umount", "-l", point], capture_output=True)
    status = subprocess.run([softblk, "status", "--json"], env=env, capture_output=True, text=True)
    pid = None
    try:
        pid = json.loads(status.stdout).get("pid")
    except (ValueError, AttributeError):
        pass
    subprocess.run([softblk, "del", "--all"], env=env, capture_output=True, timeout=120)
    subprocess.run([softblk, "shutdown"], env=env, capture_output=True, timeout=120)
    if pid:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def check_page(page, text, softblk, failures, skipped):
    run_dir = tempfile.mkdtemp(prefix="softblk-docex-run.")
    scratch = tempfile.mkdtemp(prefix="softblk-docex.")
    # The device files of `softblk apply` (docs/config.md): the page's own.
    env = dict(os.environ, SOFTBLK_RUN_DIR=run_dir,
               SOFTBLK_CONFIG_DIR=scratch + "/etc/softblk/devices.d",
               PATH=os.path.dirname(softblk) + os.pathsep + os.environ.get("PATH", ""))
    ran = 0
    try:
        if page in SETUP:
            subprocess.run(["bash", "-c", SETUP[page]], cwd=scratch, check=True)
        for block in code_blocks(text):
            for cmd in commands(block):
                first = cmd.split()[0]
                reason = SKIP.get((page, cmd))
                if reason is None and first not in PROGRAMS:
                    reason = f"not a softblk command ({first}): its own tests run it"
                if reason:
                    skipped.append(f"{page}: {cmd}: {reason}")
                    continue
                if first == "softblk" and SYNTAX.search(cmd):
                    continue  # a synopsis, not an example
                real = cmd
                for prefix in REWRITE:
                    real = real.replace(prefix, scratch + "/" + prefix.lstrip("./"))
                real = real.replace("/run/softblk", run_dir)
                want = EXPECT.get((page, cmd), {})
                res = run(real, env, scratch)
                ran += 1
                ok = (res.returncode == 0) == (want.get("rc", "ok") == "ok")
                for stream in ("stdout", "stderr"):
                    if stream in want and not re.search(want[stream], getattr(res, stream),
                                                        re.MULTILINE):
                        ok = False
                if not ok:
                    failures.append(f"{page}: `{cmd}` exited {res.returncode}, expected "
                                    f"{want or 'success'}\n  stdout: {res.stdout.strip()[:400]}"
                                    f"\n  stderr: {res.stderr.strip()[:400]}")
    finally:
        tear_down(softblk, env, scratch)
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(run_dir, ignore_errors=True)
    return ran


def check_inline(pages, softblk, failures):
    """Every inline `softblk WORD` names a subcommand that exists."""
    helptext = subprocess.run([softblk, "--help"], capture_output=True, text=True).stdout
    known = set(re.findall(r"^\s{2}(\S+)", helptext.split("Subcommands:")[-1], re.MULTILINE))
    # Subcommands that run another program (`softblk fat`, `softblk bench`)
    # are named in the help's closing lines rather than its list.
    known |= set(re.findall(r"`softblk ([a-z]+)", helptext))
    for page, text in pages:
        for word in re.findall(r"`softblk ([a-z][a-z/-]*)", text):
            for sub in word.split("/"):
                if sub not in known:
                    failures.append(f"{page}: `softblk {word}`: no subcommand '{sub}' "
                                    f"(softblk --help lists {sorted(known)})")


def main():
    softblk, source = os.path.abspath(sys.argv[1]), sys.argv[2]
    if os.geteuid() != 0:
        print("SKIP: needs root (the examples export devices through FUSE and loop devices)")
        return 77
    if not os.path.exists("/dev/fuse"):
        print("SKIP: needs /dev/fuse (the default export on a host without ublk)")
        return 77
    pages = []
    # A target's own page (docs/NAME.md for src/targets/NAME) is run without
    # a line here: a new target is its folder and one line.
    own = sorted(f"docs/{d}.md" for d in os.listdir(os.path.join(source, "src/targets")))
    for page in PAGES + [p for p in own if p not in PAGES]:
        path = os.path.join(source, page)
        if os.path.exists(path):
            pages.append((page, open(path, encoding="utf-8").read()))
    failures, skipped, ran = [], [], 0
    check_inline(pages, softblk, failures)
    for page, text in pages:
        ran += check_page(page, text, softblk, failures, skipped)
    for line in skipped:
        print(f"not run: {line}")
    print(f"{ran} examples run, {len(skipped)} not run, {len(failures)} failed")
    for line in failures:
        print(f"FAIL: {line}")
    return 1 if failures or ran == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
