#!/usr/bin/env python3
"""A target or front end is one folder and one line: no name of one appears
in the code outside its own folder and the registries.

Asks `softblk features --json` for every target type and export type this
build has (and the optional ones it left out), then reads every source and
build file under src/ and include/ and fails, naming file and line, on a
string literal that is exactly such a name ("ublk", "zloop" ...) outside:
  - src/frontends/ and src/targets/ (each front end's and target's own
    folder) and include/softblk/<folder>/ (its public headers);
  - the registries: include/softblk/frontend.hpp, include/softblk/target.hpp
    and src/core/registry.cpp;
  - the exceptions below, each with its reason.
Comments do not count. Usage: registry_names.py SOFTBLK SOURCE_DIR
"""
import json
import os
import re
import subprocess
import sys

# (path prefix, name): why the name belongs there.
EXCEPTIONS = {
    ("src/cli/nullb_fs/", "null"):
        "null_blk's configfs tree (`softblk nullb`) makes null devices by definition",
    ("src/cli/daemon", "null"):
        "null_blk's module parameters (`softblk daemon nr_devices=N ...`) make null devices",
    ("src/core/zone", "zloop"):
        "the zone model the core emulates for any target is named after the zloop driver's",
}
REGISTRIES = ("include/softblk/frontend.hpp", "include/softblk/target.hpp",
              "src/core/registry.cpp")
SOURCE_ENDINGS = (".cpp", ".hpp", ".h", ".c", ".cc", "CMakeLists.txt", ".cmake")


def names(softblk):
    out = subprocess.run([softblk, "features", "--json"], check=True, capture_output=True,
                         text=True, env=dict(os.environ, SOFTBLK_RUN_DIR="/nonexistent")).stdout
    features = json.loads(out)
    found = {t["name"] for t in features["targets"]}
    found |= {e["name"] for e in features["exports"] if e["name"] != "none"}
    # Optional targets this build left out ("rbd: why") are names all the same.
    found |= {n.split(":", 1)[0] for n in features.get("not_built", [])}
    return found


def strip_comments(text, cmake):
    if cmake:
        return re.sub(r'#[^\n"]*$', "", text, flags=re.M)
    # /* ... */ (kept as newlines, for line numbers), then // to the end of
    # a line when not inside a string literal.
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    lines = []
    for line in text.split("\n"):
        in_string = False
        cut = len(line)
        i = 0
        while i < len(line):
            c = line[i]
            if c == "\\" and in_string:
                i += 2
                continue
            if c == '"':
                in_string = not in_string
            elif not in_string and line.startswith("//", i):
                cut = i
                break
            i += 1
        lines.append(line[:cut])
    return "\n".join(lines)


def allowed(path, name, own_dirs):
    if path.startswith(("src/frontends/", "src/targets/")) or path in REGISTRIES:
        return True
    if any(path.startswith(f"include/softblk/{d}/") for d in own_dirs):
        return True
    return any(path.startswith(prefix) and name == n for (prefix, n) in EXCEPTIONS)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    softblk, source = sys.argv[1], sys.argv[2]
    wanted = names(softblk)
    if not {"null", "fuse"} <= wanted:
        sys.exit(f"registry_names: `softblk features` lists too few names: {sorted(wanted)}")
    own_dirs = set(os.listdir(os.path.join(source, "src/frontends")))
    own_dirs |= set(os.listdir(os.path.join(source, "src/targets")))
    literal = re.compile(r'"(' + "|".join(re.escape(n) for n in sorted(wanted)) + r')"')
    bad = []
    checked = 0
    for top in ("src", "include"):
        for root, _, files in os.walk(os.path.join(source, top)):
            for f in files:
                if not f.endswith(SOURCE_ENDINGS):
                    continue
                path = os.path.relpath(os.path.join(root, f), source)
                with open(os.path.join(source, path), encoding="utf-8") as fh:
                    text = strip_comments(fh.read(), not f.endswith((".cpp", ".hpp", ".h", ".c",
                                                                      ".cc")))
                checked += 1
                for n, line in enumerate(text.split("\n"), 1):
                    for m in literal.finditer(line):
                        if not allowed(path, m.group(1), own_dirs):
                            bad.append(f"{path}:{n}: \"{m.group(1)}\": {line.strip()}")
    if bad:
        print("names of targets or front ends outside their folders and the registries "
              "(have the front end or target register what the code needs, "
              "include/softblk/frontend.hpp, target.hpp):")
        print("\n".join(bad))
        sys.exit(1)
    print(f"registry_names: {checked} files, none names one of {len(wanted)} targets and "
          f"front ends outside its folder")


if __name__ == "__main__":
    main()
