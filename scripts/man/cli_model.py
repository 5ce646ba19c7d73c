"""What the built programs say about themselves, for the man pages and the
bash completion (generate.py): every subcommand's CLI11 `--help`, parsed,
and `softblk features --json`, the option tables of every target and export
type. Both come from the programs at build time, so the pages and the
completion cannot disagree with them."""

import json
import os
import re
import subprocess
from dataclasses import dataclass, field

# CLI11 (App::help, detail::format_help) prints each entry as two spaces and
# the name padded to this column, then the description; a name too long for
# the column gets its description on the next line, indented to it.
HELP_COLUMN = 30


@dataclass
class Entry:
    """An option, positional or subcommand line of a --help."""

    names: list  # ["-o", "--offset"], ["type"], ["add"]
    arg: str = ""  # "UINT", "TEXT ...", "" for a flag or a subcommand
    required: bool = False
    desc: str = ""

    @property
    def takes_value(self):
        return bool(self.arg)


@dataclass
class Command:
    path: list  # [] for the program, ["zone", "report"] ...
    description: str = ""
    usage: str = ""  # after the program and subcommand names: "[OPTIONS] type [options...]"
    positionals: list = field(default_factory=list)
    options: list = field(default_factory=list)
    subcommands: list = field(default_factory=list)  # Command
    footer: str = ""

    def walk(self):
        yield self
        for sub in self.subcommands:
            yield from sub.walk()


def run(argv):
    """Runs a program and returns its stdout; fails loudly, naming it."""
    env = dict(os.environ, LC_ALL="C.UTF-8", COLUMNS="200")
    res = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if res.returncode != 0:
        raise SystemExit(
            f"cli_model: {' '.join(argv)} exited with {res.returncode}:\n{res.stderr}{res.stdout}"
        )
    return res.stdout


def _parse_entry_name(text):
    tokens = text.split(" ")
    entry = Entry(names=tokens[0].split(","))
    arg = []
    for tok in tokens[1:]:
        if tok == "REQUIRED":
            entry.required = True
        elif tok:
            arg.append(tok)
    entry.arg = " ".join(arg)
    return entry


def parse_help(text, path):
    """Parses one CLI11 --help text into a Command (without its subcommands'
    own help: `subcommands` holds Commands with a path and description only)."""
    cmd = Command(path=list(path))
    description = []
    footer = []
    section = None  # "Positionals", "Options", "Subcommands", "footer"
    entries = {"Positionals": cmd.positionals, "Options": cmd.options, "Subcommands": []}
    last = None
    for line in text.splitlines():
        if cmd.usage == "" and not line.startswith("Usage: "):
            if line.strip():
                description.append(line.strip())
            continue
        if line.startswith("Usage: "):
            usage = line[len("Usage: ") :]
            # The program's name as CLI11 prints it (argv[0], or the App's
            # name) precedes [OPTIONS], which every command has (--help).
            i = usage.find("[OPTIONS]")
            cmd.usage = usage[i:] if i >= 0 else ""
            continue
        if line.endswith(":") and line[:-1] in entries:
            section = line[:-1]
            last = None
            continue
        if not line.strip():
            if section in entries:
                section = None
            last = None
            continue
        if section in entries and line.startswith(" " * HELP_COLUMN) and last is not None:
            last.desc = (last.desc + "\n" if last.desc else "") + line.strip()
            continue
        if section in entries and line.startswith("  ") and not line.startswith("   "):
            if len(line) > HELP_COLUMN and line[HELP_COLUMN - 1] == " ":
                name, desc = line[:HELP_COLUMN].strip(), line[HELP_COLUMN:].strip()
            else:
                name, desc = line.strip(), ""
            last = _parse_entry_name(name)
            last.desc = desc
            entries[section].append(last)
            continue
        section = "footer"
        footer.append(line.rstrip())
    cmd.description = " ".join(description)
    cmd.footer = "\n".join(footer).strip()
    for e in entries["Subcommands"]:
        cmd.subcommands.append(Command(path=cmd.path + [e.names[0]], description=e.desc))
    return cmd


def command_tree(argv, path=()):
    """Every command of a CLI11 program: `argv... PATH --help`, recursively."""
    cmd = parse_help(run(list(argv) + list(path) + ["--help"]), path)
    cmd.subcommands = [command_tree(argv, sub.path) for sub in cmd.subcommands]
    return cmd


def features(softblk):
    """`softblk features --json`: {"targets": [...], "exports": [...]}, each
    with its options (name, kind, default, unit, help, min, max ...). What
    depends on the machine (which exports are available, the default
    export) is dropped: the pages describe the program, not the build host."""
    data = json.loads(run([softblk, "features", "--json"]))
    for e in data["exports"]:
        e.pop("available", None)
    data.pop("default_export", None)
    data.pop("zoned_export", None)
    return data


def option_names(option):
    """The names an option is accepted under: its name, then its alias."""
    return [option["name"]] + ([option["alias"]] if option.get("alias") else [])


def split_backticks(text):
    """[(is_code, piece), ...] for a help text with `code` in backticks."""
    return [(i % 2 == 1, p) for i, p in enumerate(re.split(r"`", text)) if p]
