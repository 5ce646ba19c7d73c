#!/usr/bin/env python3
"""Writes softblk's man pages and bash completion from the built programs
(cmake/install.cmake runs it at build time; docs/install.md):

  generate.py --softblk B --fat B --driver B --version V --out DIR

DIR/softblk.8, DIR/softblk-fat.8, DIR/softblk-driver.8,
DIR/softblk-devices.d.5 (groff man) and DIR/softblk.bash-completion. Every subcommand comes from its --help, every
target and export option from `softblk features --json`. The date on the
pages is SOURCE_DATE_EPOCH's (dpkg sets it from debian/changelog) or
today's."""

import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cli_model  # noqa: E402
import completion  # noqa: E402
import config_page  # noqa: E402
import man_page  # noqa: E402


def page_date():
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = (
        datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)
        if epoch
        else datetime.datetime.now(datetime.timezone.utc)
    )
    return when.strftime("%Y-%m-%d")


def write(path, text):
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--softblk", required=True)
    ap.add_argument("--fat", required=True)
    ap.add_argument("--driver", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    root = cli_model.command_tree([args.softblk])
    fat_root = cli_model.command_tree([args.softblk], ("fat",))
    fat_own = cli_model.command_tree([args.fat])
    driver = cli_model.command_tree([args.driver])
    feats = cli_model.features(args.softblk)
    date = page_date()

    os.makedirs(args.out, exist_ok=True)
    write(os.path.join(args.out, "softblk.8"), man_page.softblk_page(root, fat_root, feats, args.version, date))
    write(os.path.join(args.out, "softblk-fat.8"), man_page.fat_page(fat_own, args.version, date))
    write(os.path.join(args.out, "softblk-driver.8"), man_page.driver_page(driver, args.version, date))
    write(os.path.join(args.out, "softblk-devices.d.5"), config_page.devices_d_page(feats, args.version, date))
    write(os.path.join(args.out, "softblk.bash-completion"), completion.script(root, fat_root, feats))


if __name__ == "__main__":
    main()
