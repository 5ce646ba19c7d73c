#!/usr/bin/env python3
"""The man pages say everything the programs say about themselves.

Renders the generated pages (groff, plain text, no line wrapping) and
checks, against the built programs:
  - every option `softblk features --json` prints, for every target and
    export type, is in softblk(8) under that type, as NAME=DEFAULT, and
    in softblk-devices.d(5) (export options as export-opt.NAME=DEFAULT);
  - every command of `softblk --help` (and of its subcommands, of
    `softblk-fat --help` and `softblk-driver --help`) has its section in
    the page, with every option and positional argument its --help lists;
  - the pages carry the project's version.
Then it checks that the check can fail: with one option's entry removed
from a copy of softblk.8 (the last option of every type), each removed
option must be reported missing.

Usage: man_pages.py BUILD/softblk BUILD/softblk-fat BUILD/softblk-driver MAN_DIR VERSION
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile


def run(argv):
    res = subprocess.run(argv, capture_output=True, text=True, check=False,
                         env=dict(os.environ, LC_ALL="C.UTF-8"))
    if res.returncode != 0:
        sys.exit(f"man_pages: {' '.join(argv)} failed ({res.returncode}): {res.stderr}")
    return res.stdout


def render(page):
    """The page as text: ASCII, no overstriking, lines long enough that
    nothing wraps, no hyphenation (the page turns it off)."""
    return run(["groff", "-man", "-Tascii", "-P-cbou", "-rLL=1000n", page]).splitlines()


def sections(lines):
    """{(SECTION, SUBSECTION or ""): [lines]} of a rendered page: sections
    start at column 0, subsections at column 3."""
    out, key = {}, ("", "")
    for line in lines:
        if re.match(r"^[A-Z]", line):
            key = (line.strip(), "")
        elif re.match(r"^   \S", line):
            key = (key[0], line.strip())
        out.setdefault(key, []).append(line)
    return out


def check_features(lines, feats, export_prefix=""):
    """Missing (section, type, option) entries; export options' tags start
    with `export_prefix` (softblk-devices.d(5): export-opt.)."""
    secs = sections(lines)
    missing = []
    for kind, section in (("targets", "TARGET TYPES"), ("exports", "EXPORT TYPES")):
        for t in feats[kind]:
            body = secs.get((section, t["name"]))
            if body is None:
                missing.append(f"{section}: no subsection for {t['name']}")
                continue
            tags = {line.strip() for line in body if re.match(r"^       \S", line)}
            prefix = export_prefix if kind == "exports" else ""
            for o in t["options"]:
                if f"{prefix}{o['name']}={o['default']}" not in tags:
                    missing.append(f"{section} {t['name']}: {prefix}{o['name']}={o['default']}")
    return missing


def help_items(text):
    """The options and positionals a CLI11 --help lists: the first word of
    each entry line (two spaces in), names split at commas; and the
    subcommand names."""
    items, subs, section = [], [], None
    for line in text.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            section = line[:-1]
            continue
        m = re.match(r"^  (\S+)", line)
        if not m or section not in ("Options", "Positionals", "Subcommands"):
            continue
        if section == "Subcommands":
            subs.append(m.group(1))
        else:
            items += m.group(1).split(",")
    return items, subs


def check_commands(lines, argv, title, path=()):
    """Missing commands and options of the program argv, recursively."""
    missing = []
    items, subs = help_items(run(list(argv) + list(path) + ["--help"]))
    secs = sections(lines)
    if path:
        heads = [k for k in secs if k[0] == "COMMANDS" and k[1].split(" [")[0] == " ".join((title,) + path)]
        if not heads:
            return [f"COMMANDS: no section for {' '.join((title,) + path)}"]
        body = "\n".join(secs[heads[0]])
    else:
        body = "\n".join(lines)
    for item in items:
        if item in ("-h", "--help") and path:
            continue  # said once, under OPTIONS
        if not re.search(r"(^|[\s,])" + re.escape(item) + r"($|[\s,])", body, re.M):
            missing.append(f"{' '.join((title,) + path)}: {item}")
    for sub in subs:
        missing += check_commands(lines, argv, title, tuple(path) + (sub,))
    return missing


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    softblk, fat, driver, man_dir, version = sys.argv[1:]
    if shutil.which("groff") is None:
        print("SKIP: groff is not installed (apt-get install groff-base)")
        sys.exit(77)
    feats = json.loads(run([softblk, "features", "--json"]))
    page = os.path.join(man_dir, "softblk.8")
    lines = render(page)
    problems = check_features(lines, feats)
    problems += check_commands(lines, [softblk], "softblk")
    fat_lines = render(os.path.join(man_dir, "softblk-fat.8"))
    problems += check_commands(fat_lines, [fat], "softblk-fat")
    driver_lines = render(os.path.join(man_dir, "softblk-driver.8"))
    problems += check_commands(driver_lines, [driver], "softblk-driver")
    # softblk-devices.d(5): the device files take the same options.
    config_lines = render(os.path.join(man_dir, "softblk-devices.d.5"))
    problems += [f"softblk-devices.d.5: {p}" for p in check_features(config_lines, feats, "export-opt.")]
    for name, text in (("softblk.8", lines), ("softblk-fat.8", fat_lines), ("softblk-driver.8", driver_lines),
                       ("softblk-devices.d.5", config_lines)):
        if not any(f"softblk {version}" in line for line in text[-3:]):
            problems.append(f"{name}: the footer does not name softblk {version}")
    if problems:
        print("the man pages miss what the programs print:")
        for p in problems:
            print("  " + p)
        sys.exit(1)
    count = sum(len(t["options"]) for k in ("targets", "exports") for t in feats[k])
    print(f"man pages: all {count} options of `softblk features --json` (in softblk(8) and "
          "softblk-devices.d(5)) and every command's options are in")

    # The check itself: remove the last option of every type from a copy of
    # the page; each must be reported.
    with open(page, encoding="utf-8") as f:
        source = f.read().split("\n")
    removed = []
    for kind in ("targets", "exports"):
        for t in feats[kind]:
            if not t["options"]:
                continue
            o = t["options"][-1]
            tag = "\\fB" + o["name"].replace("-", "\\-").replace("/", "/\\:") + "\\fR="
            # The entry of this type: the first tag line after the type's .SS.
            start = source.index(".SS " + t["name"].replace("-", "\\-"))
            i = next(i for i in range(start, len(source)) if source[i].startswith(tag))
            del source[i - 1 : i + 1]  # .TP and the tag
            removed.append(f"{t['name']}: {o['name']}={o['default']}")
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "softblk.8")
        with open(copy, "w", encoding="utf-8") as f:
            f.write("\n".join(source))
        reported = "\n".join(check_features(render(copy), feats))
    unseen = [r for r in removed if r not in reported]
    if unseen:
        print("self-check failed: options removed from the page were not reported:", unseen)
        sys.exit(1)
    print(f"self-check: each of the {len(removed)} options removed from a copy was reported missing")


if __name__ == "__main__":
    main()
