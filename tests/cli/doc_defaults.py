#!/usr/bin/env python3
"""The defaults the docs' option tables give are the option tables' own.

Reads every option table of the docs pages below (a Markdown table whose
second column is headed "default") and compares each row's default with
`softblk features --json` for the target or export type the page (or the
table) documents. A row whose default is prose ("(required)", "all of the
device's queues", "1 when not root") is not a value and is skipped; every
other row must name an option of that type with that default, so a wrong
default, a renamed option or a table of the wrong type fails. A page of
docs/ (or the README) with such a table that PAGES does not list fails
too, so a new page cannot go unchecked. The fio engine's options are
fio's, not a softblk type's: they are compared with the engine's own
table (`.name`/`.def` in bench/fio/softblk_fio.c). Exits 77 when the type
is not built.

Usage: doc_defaults.py PATH/TO/softblk DOCS_DIR
"""
import glob
import json
import os
import re
import subprocess
import sys

# page -> the types its tables document, in table order (one entry per
# table with a default column; "target:" or "export:").
PAGES = {
    "null.md": ["target:null"],
    "file.md": ["target:file"],
    "zoned.md": ["target:zloop"],
    "rbd.md": ["target:rbd"],
    "virtio.md": ["export:vhost-user-blk", "target:virtio"],
    "fuse.md": ["export:fuse"],
    "nbd.md": ["export:nbd"],
    "ublk.md": ["export:ublk"],
    "fio.md": ["source:bench/fio/softblk_fio.c"],
}
# Words a table may write for an empty default ("off" may also be the value).
WORDS = {"empty": "", "none": "", "off": ""}
# Prose, or a default the program derives (RUN_DIR/...), is not compared.
PROSE = re.compile(r"^(\(|\"|the |all |see |–|-$|`?RUN_DIR/)")


def tables(text):
    """Yields the rows (lists of cells) of each table with a default column."""
    rows, inside = [], False
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if not inside:
                inside = True
                header = [c.lower() for c in cells]
                rows = [] if len(header) > 1 and header[1] == "default" else None
            elif rows is not None and not set(line) <= set("|-: "):
                rows.append(cells)
        elif inside:
            inside = False
            if rows is not None:
                yield rows


def names(cell):
    """The option names of a row's first cell: `name`, `name=VALUE` ..."""
    found = []
    for code in re.findall(r"`([^`]+)`", cell):
        name = code.split("=")[0].strip()
        if re.fullmatch(r"[a-z][a-z0-9_/-]*", name) and not name.endswith("/*"):
            found.append(name)
    return found


def documented_default(cell):
    """The value a default cell gives, or None when it is prose."""
    cell = cell.strip()
    if not cell or PROSE.match(cell):
        return None
    m = re.match(r"`([^`]*)`|(\S+)", cell)
    token = m.group(1) if m.group(1) is not None else m.group(2)
    rest = cell[m.end():].strip()
    # "1 when not root", "5000 ms", "10 s", "250 (the module's ...)": the
    # value is the first token; a following word is a unit or a remark.
    if rest and not re.match(r"^(\(|ms\b|s\b|us\b|KiB\b|MiB\b|%)", rest):
        return None
    return token


def fio_options(path):
    """The fio engine's option table (struct fio_option in C) as features'
    form: {"options": [{"name", "default"}]}, "" where it sets no .def."""
    with open(path) as f:
        text = f.read()
    options = []
    for block in re.findall(r"\{([^{}]*\.name\s*=\s*\"[^\"]+\"[^{}]*)\}", text):
        name = re.search(r"\.name\s*=\s*\"([^\"]+)\"", block).group(1)
        default = re.search(r"\.def\s*=\s*\"([^\"]*)\"", block)
        options.append({"name": name, "default": default.group(1) if default else ""})
    return {"options": options}


def unlisted_pages(docs):
    """Pages with a table whose second column is "default" that PAGES lacks."""
    out = []
    for path in sorted(glob.glob(f"{docs}/*.md")) + [f"{docs}/../README.md"]:
        if not os.path.exists(path) or os.path.basename(path) in PAGES:
            continue
        with open(path) as f:
            if any(True for _ in tables(f.read())):
                out.append(os.path.relpath(path, docs))
    return out


def main():
    softblk, docs = sys.argv[1], sys.argv[2]
    features = json.loads(subprocess.run([softblk, "features", "--json"], check=True,
                                         capture_output=True, text=True).stdout)
    types = {f"target:{t['name']}": t for t in features["targets"]}
    types.update({f"export:{e['name']}": e for e in features["exports"]})
    # A target's own page (docs/NAME.md, one table) needs no line in PAGES:
    # a new target is its folder and one line.
    for t in features["targets"]:
        if f"{t['name']}.md" not in PAGES and os.path.exists(f"{docs}/{t['name']}.md"):
            PAGES[f"{t['name']}.md"] = [f"target:{t['name']}"]
    for kinds in PAGES.values():
        for kind in kinds:
            if kind.startswith("source:"):
                types[kind] = fio_options(f"{docs}/../{kind[len('source:'):]}")
    failures, compared, missing = [], 0, []
    for page in unlisted_pages(docs):
        failures.append(f"{page}: a table with a default column that this test does not "
                        f"check (add the page to PAGES)")
    for page, kinds in PAGES.items():
        with open(f"{docs}/{page}") as f:
            found = list(tables(f.read()))
        if len(found) != len(kinds):
            failures.append(f"{page}: {len(found)} tables with a default column, expected "
                            f"{len(kinds)} (update PAGES)")
            continue
        for kind, rows in zip(kinds, found):
            if kind not in types:
                missing.append(kind)
                continue
            options = {o["name"]: o for o in types[kind]["options"]}
            options.update({o["alias"]: o for o in types[kind]["options"] if "alias" in o})
            for row in rows:
                value = documented_default(row[1])
                if value is None:
                    continue
                row_names = names(row[0])
                if not row_names:
                    continue
                for name in row_names:
                    if name not in options:
                        failures.append(f"{page}: `{name}` (default {value}) is no {kind} option")
                        continue
                    actual = options[name]["default"]
                    if actual != value and actual != WORDS.get(value):
                        failures.append(f"{page}: `{name}` default {value!r} in the docs, "
                                        f"{actual!r} in {kind}'s option table")
                    compared += 1
    for f in failures:
        print("FAIL:", f)
    print(f"{compared} documented defaults compared; not built: {missing or 'none'}")
    if failures:
        return 1
    if compared == 0:
        print("SKIP: no documented default could be compared")
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
