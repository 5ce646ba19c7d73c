#!/usr/bin/env python3
"""Runs clang-tidy on each source file of a compile database, in parallel,
skipping the files whose last check found nothing and whose input has not
changed since (scripts/tidy.sh calls it; it is not meant to be run alone).

A file's input is what clang-tidy sees: the file after clang's preprocessor
(every header it includes, with their paths in the line markers, the
checkout's own path left out), the compile flags, the .clang-tidy configuration and clang-tidy's version. Its
SHA-256 names a stamp in the cache directory, written only after a clean
check, so a finding is reported again on every run until it is fixed.
Preprocessing a file takes a tenth of the time of checking it, which is what
the cache saves on a tree that changed little since the last run.

    tidy_files.py --tidy BIN --clang BIN --db DIR --config FILE
                  --cache DIR --root DIR --jobs N PATH...

Prints the findings of every checked file and a summary line; exits 1 when
there was a finding or a file could not be checked, 0 otherwise.
"""
import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys

FINDING = re.compile(r"(warning|error): ")


def compile_args(entry):
    """The compile command's arguments without the compiler, the output and
    -c: what a preprocessor run of the same file needs."""
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    out, skip = [], False
    for a in args[1:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-MF", "-MT", "-MQ"):
            skip = True
            continue
        if a in ("-c", "-MD", "-MMD") or a == entry["file"]:
            continue
        out.append(a)
    return out


def input_key(opts, entry, salt):
    """SHA-256 of everything clang-tidy's result depends on, or None when the
    file cannot be preprocessed (then it is checked, which reports why)."""
    cmd = [opts.clang, *compile_args(entry), "-Wno-unknown-warning-option", "-E", entry["file"]]
    try:
        pre = subprocess.run(cmd, cwd=entry["directory"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    # The checkout's own path does not change a result (the header filter
    # matches paths inside it by their src/ or include/ part): a clone
    # elsewhere finds the stamps of the same sources.
    root = opts.root.encode()
    h = hashlib.sha256(salt)
    h.update("\0".join(cmd).encode().replace(root, b"@ROOT@"))
    h.update(pre.replace(root, b"@ROOT@"))
    return h.hexdigest()


def check(opts, entry, salt):
    """Returns (file, output, clean, cached)."""
    key = input_key(opts, entry, salt)
    stamp = os.path.join(opts.cache, key) if key else None
    if stamp and os.path.exists(stamp):
        return entry["file"], "", True, True
    # GCC-only warning options in the compile commands mean nothing to clang.
    cmd = [opts.tidy, "-p", opts.db, "-quiet", "--extra-arg=-Wno-unknown-warning-option", entry["file"]]
    run = subprocess.run(cmd, capture_output=True, text=True)
    text = run.stdout + run.stderr
    clean = run.returncode == 0 and not FINDING.search(text)
    if clean and stamp:
        os.makedirs(opts.cache, exist_ok=True)
        with open(stamp + ".tmp", "w") as f:
            f.write(entry["file"] + "\n")
        os.replace(stamp + ".tmp", stamp)
    return entry["file"], text, clean, False


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tidy", required=True)
    p.add_argument("--clang", required=True)
    p.add_argument("--db", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--cache", required=True)
    p.add_argument("--root", required=True, help="the checkout's top directory")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("paths", nargs="+")
    opts = p.parse_args()

    with open(os.path.join(opts.db, "compile_commands.json")) as f:
        db = json.load(f)
    roots = [os.path.abspath(x) for x in opts.paths]
    entries = [e for e in db if any(
        os.path.abspath(e["file"]) == r or os.path.abspath(e["file"]).startswith(r.rstrip("/") + "/")
        for r in roots)]
    if not entries:
        print("tidy: no file of the compile database is under " + " ".join(opts.paths), file=sys.stderr)
        return 1
    version = subprocess.run([opts.tidy, "--version"], capture_output=True, text=True).stdout
    with open(opts.config, "rb") as f:
        salt = version.encode() + b"\0" + f.read()

    failed, cached = 0, 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=opts.jobs) as pool:
        for file, text, clean, was_cached in pool.map(lambda e: check(opts, e, salt), entries):
            cached += was_cached
            if not clean:
                failed += 1
                sys.stdout.write(text)
    print(f"tidy: {len(entries)} files, {cached} unchanged since a clean check, "
          f"{len(entries) - cached} checked, {failed} with findings")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
