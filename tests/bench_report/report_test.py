#!/usr/bin/python3
"""bench/report/softblk_report.py on the recorded folders in data/: the
tables' numbers (checked against medians computed here from samples.jsonl),
"missing", "failed: ...", "skipped: ...", the machine line, the commands,
valid PNG and SVG plots, and the refusal to combine two machines.

usage: report_test.py PATH/TO/softblk_report.py
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print(f"FAIL: {what}")


def run(script, *args):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                          timeout=120)


def copy(tmp, name, as_name=None):
    dest = os.path.join(tmp, as_name or name)
    shutil.copytree(os.path.join(DATA, name), dest)
    return dest


def samples(folder):
    with open(os.path.join(folder, "samples.jsonl")) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def median_iops(folder, system, **case):
    v = [s["iops"] for s in samples(folder)
         if s["system"] == system and s["status"] == "ok"
         and all(s["case"].get(k) == x for k, x in case.items())]
    return statistics.median(v)


def table_row(md, *first_cells):
    """The cells (split on unescaped |) of the first Markdown table row that
    starts with FIRST_CELLS."""
    for line in md.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.replace("\\|", "\0").strip("|").split("|")]
        cells = [c.replace("\0", "|") for c in cells]
        if cells[:len(first_cells)] == list(first_cells):
            return cells
    failures.append(f"no table row {first_cells}")
    print(f"FAIL: no table row starting with {first_cells}")
    return [""] * 12


def check_png(path):
    from PIL import Image
    with open(path, "rb") as fh:
        check(fh.read(8) == b"\x89PNG\r\n\x1a\n", f"{path}: PNG signature")
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        check(im.width >= 300 and im.height >= 200, f"{path}: {im.size} is too small")
        colours = im.convert("RGB").getcolors(1 << 20)
        check(colours is None or len(colours) > 20, f"{path}: only {len(colours or [])} colours")


def check_svg(path):
    root = ET.parse(path).getroot()
    check(root.tag == "{http://www.w3.org/2000/svg}svg", f"{path}: root is {root.tag}")
    paths = root.findall(".//{http://www.w3.org/2000/svg}path")
    check(len(paths) > 10, f"{path}: only {len(paths)} paths")


def check_plots(folder, names):
    for name in names:
        for ext, checker in (("png", check_png), ("svg", check_svg)):
            path = os.path.join(folder, "plots", f"{name}.{ext}")
            if not os.path.isfile(path):
                check(False, f"{path} was not written")
                continue
            checker(path)


def generate(script, folder):
    r = run(script, folder)
    check(r.returncode == 0, f"{folder}: status {r.returncode}: {r.stderr}")
    with open(os.path.join(folder, "report.md")) as fh:
        md = fh.read()
    with open(os.path.join(folder, "report.html")) as fh:
        page = fh.read()
    return md, page


def test_rnull(script, tmp):
    folder = copy(tmp, "rnull-20261206-010000")
    md, page = generate(script, folder)
    # Randread 4 KiB, 1 job: null_blk 700k/720k, softblk 650k/690k.
    nb = median_iops(folder, "null_blk", workload="randread", bs=4096, jobs=1)
    sb = median_iops(folder, "softblk", workload="randread", bs=4096, jobs=1)
    rel = (sb - nb) / nb * 100
    check(f"{rel:.2f}" == "-5.63", f"the recorded randread 4k figures changed: {rel:.2f}")
    row = table_row(md, "4k", "randread")
    check(row[2].startswith(f"{rel:.2f} 0.00 ({nb / 1e6:.2g},0.0)<br>"), f"rnull 4k randread 1: {row[2]}")
    check("softblk 670k IOPS (650k-690k), 2617 MiB/s" in row[2], f"softblk's absolute: {row[2]}")
    # randrw splits read and write IOPS (extra.read_iops/write_iops).
    row = table_row(md, "64k", "randrw")
    nr = statistics.median(s["extra"]["read_iops"] for s in samples(folder)
                           if s["system"] == "null_blk" and s["case"]["workload"] == "randrw"
                           and s["case"]["bs"] == 65536 and s["case"]["jobs"] == 1)
    check(f"({nr / 1e6:.2g},{nr / 1e6:.2g})" in row[2], f"rnull 64k randrw 1: {row[2]}")
    check(table_row(md, "64k", "randwrite")[3] == "missing", "softblk's missing cell is not 'missing'")
    check(table_row(md, "4k", "randrw")[2] ==
          "null_blk failed: fio: io_u error on file /dev/nullb0: Input/output error",
          f"the failed cell: {table_row(md, '4k', 'randrw')[2]}")
    check("1 of 2 rounds ok; failed: fio exited with status 1" in table_row(md, "64k", "randread")[3],
          "the partly failed cell does not say so")
    check("Reads: 7 cells" in md and "Writes: 6 cells" in md, "the cover letter's summary line")
    # The machine line and the commands.
    for text in ("Intel(R) Xeon(R) Processor (family 6 model 207), 2 CPUs, hypervisor kvm, "
                 "Linux 6.18.44-fc-v1272; VM lab: KVM, Linux 6.12.57+deb13-amd64, 2 vCPUs, 2048 MiB",
                 "5 s per run, quick", "load average before 0.52 0.61 0.70, after 1.95 1.20 0.88",
                 "<summary>Commands of rnull-20261206-010000 (46)</summary>",
                 "--rw=randwrite --bs=64k --numjobs=2"):
        check(text in md, f"report.md lacks {text!r}")
        check(text.replace("&", "&amp;") in page, f"report.html lacks {text!r}")
    check('<td class="problem">missing</td>' in page, "report.html's missing cell")
    check('<img src="plots/rnull-heatmap.svg"' in page, "report.html does not show the heat map")
    check_plots(folder, ["rnull-heatmap", "rnull-bars"])


def test_exports(script, tmp):
    folder = copy(tmp, "exports-20261206-020000")
    md, page = generate(script, folder)
    row = table_row(md, "randread bs=4k qd=1 jobs=1 export=nbd")
    check(row[1] == "42.1k IOPS (41k-43.5k)<br>164 MiB/s", f"exports softblk nbd: {row[1]}")
    check(row[2] == "nbdkit" and row[3].startswith("30.1k IOPS (29k-31.5k)"), f"exports nbdkit: {row}")
    ratio = (median_iops(folder, "softblk", export="nbd", qd=1)
             / median_iops(folder, "nbdkit", export="nbd", qd=1))
    # Per round: 41000/30100, 43500/29000, 42100/31500.
    check(row[4] == f"{ratio:.2f} (1.34-1.50)", f"exports ratio: {row[4]}")
    row = table_row(md, "randread bs=4k qd=32 jobs=1 export=vhost-user-blk")
    check(row[3] == "skipped: qemu-storage-daemon has no io_uring support here"
          and row[4] == "qsd skipped: qemu-storage-daemon has no io_uring support here", f"skipped: {row[3:5]}")
    check(row[1].startswith("150k IOPS (149k-158k)"), f"softblk beside the skipped peer: {row[1]}")
    check("no VM" in md, "the host-only machine line")
    check_plots(folder, ["exports-bars", "exports-qd"])
    check("took" not in md, "a time the run did not record")
    # nbdkit has no vhost-user-blk export: no bar and no "missing" mark
    # for it there (the bars' series give no cell), softblk's bar stays.
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    from softblk_report import data, plots
    plan = data.collect([data.load_folder(folder)])["exports"]
    series, cases = plots.bar_series(plan)
    get = dict(series)
    vhost = [c for c in cases if c.get("export") == "vhost-user-blk"]
    check(vhost and all(get["nbdkit"](c) is None for c in vhost),
          "the bars mark nbdkit missing where it has no such export")
    check(all(get["softblk"](c) is not None for c in vhost), "softblk's vhost-user-blk bars")
    nbd = [c for c in cases if c.get("export") == "nbd"]
    check(nbd and all(get["nbdkit"](c) is not None for c in nbd), "nbdkit's NBD bars")


def test_run_time(script, tmp):
    """The run's wall time and when its foreground runs and background
    units ended (smoke's minute), from machine.json, in the machine line."""
    folder = copy(tmp, "exports-20261206-020000", "exports-20261206-020001")
    path = os.path.join(folder, "machine.json")
    with open(path) as fh:
        m = json.load(fh)
    m["elapsed_s"], m["timing_s"] = 48.3, {"foreground": 30.1, "boot=rnull, zloop": 47.0}
    with open(path, "w") as fh:
        json.dump(m, fh)
    md, page = generate(script, folder)
    text = "; took 48.3 s (foreground 30.1 s, boot=rnull, zloop 47.0 s)"
    check(text in md and text in page, f"the run's time is not in the machine line: {text!r}")


def test_zloop(script, tmp):
    folder = copy(tmp, "zloop-20261206-030000")
    md, _ = generate(script, folder)
    check("### zloop: 1 queue\n" in md and "### zloop: 2 queues\n" in md, "one table per queue count")
    row = table_row(md, "QD=1, 4K rnd wr, 1 job")
    check(row[1].startswith("best 14.1k / 55.1 MiB/s<br>median 13.5k (13.1k-14.1k)"), f"zloop softblk: {row[1]}")
    check(row[2].startswith("best 15.8k / 61.7 MiB/s"), f"zloop kernel-zloop: {row[2]}")
    check(row[4].startswith(f"best {14100 / 15800:.2f}<br>median"), f"zloop ratio: {row[4]}")
    row = table_row(md, "QD=32, 128K seq wr, 1 job")
    check(row[3].startswith("best 2.64k / 330 MiB/s"), f"zloop ublk seq: {row[3]}")
    check_plots(folder, ["zloop-bars"])


def test_fat(script, tmp):
    folder = copy(tmp, "fat-20261206-040000")
    md, _ = generate(script, folder)
    row = table_row(md, "seqread buffer=64k", "MiB/s")
    check(row[2:5] == ["29.3 (28.4-29.9)", "320 (311-327)", "410 (398-418)"], f"fat seqread: {row}")
    check(row[5] == f"{320.4 / 29.3:.2f}", f"fat after/before: {row[5]}")
    row = table_row(md, "seqread buffer=64k", "read_requests")
    check(row[2:4] == ["44134", "1602"], f"fat requests: {row}")
    row = table_row(md, "create", "create_us")
    check(row[2:5] == ["565", "201", "missing"], f"fat create latency: {row}")
    check_plots(folder, ["fat-bars"])


def fat_median(folder, system, config, workload, field):
    v = [s[field] if field in ("iops", "mib_s") else s["extra"][field] for s in samples(folder)
         if s["system"] == system and s["case"].get("config") == config
         and s["case"]["workload"] == workload]
    return statistics.median(v)


def test_fat_peers(script, tmp):
    """A recorded run of the real plan: mtools' rows carry their own
    configuration ("mcopy, image in /dev/shm"), and softblk's library and
    FUSE mount are each put against them (issue 45: the mount against
    mtools on sequential write, read and create latency)."""
    folder = copy(tmp, "fat-20261206-081030")
    md, _ = generate(script, folder)
    header = table_row(md, "case", "measure")
    lib, mount, mtools = "after", "FUSE mount, writeback cache", "mcopy, image in /dev/shm"
    for name in (f"softblk {lib} / mtools", f"softblk {mount} / mtools"):
        check(name in header, f"fat: no column {name!r} in {header}")
    for workload, bs, measure, field in (("seq-write", "bs=16k", "MiB/s", "mib_s"),
                                         ("seq-read", "bs=64k", "MiB/s", "mib_s"),
                                         ("create", None, "create_us", "create_us")):
        label = f"{workload} {bs}" if bs else workload
        row = table_row(md, label, measure)
        theirs = fat_median(folder, "mtools", mtools, workload, field)
        for config in (lib, mount):
            name = f"softblk {config} / mtools"
            if name not in header:
                continue
            want = fmt_ratio(fat_median(folder, "softblk", config, workload, field) / theirs)
            got = row[header.index(name)]
            check(got == want, f"fat {label} {measure} {name}: {got}, want {want}")


def test_core_memcpy(script, tmp):
    """A recorded `softblk bench core` run: the memory store's rows are put
    against the memcpy of the same size measured in the same run (issue
    45's bound), with the ratio of the medians."""
    folder = copy(tmp, "core-20261206-091131")
    md, _ = generate(script, folder)
    check("### core: memory store / memcpy of the same size" in md, "core: no memcpy table")
    memcpy = median_iops(folder, "memcpy", workload="memcpy", size_mib=1024,
                         into="random slots of the device's size")
    for workload, state in (("randwrite", "allocated"), ("randread", "allocated")):
        mine = median_iops(folder, "softblk", workload=workload, size_mib=1024, state=state,
                           queues=1)
        row = table_row(md, f"{workload} bs=4k qd=32 queues=1 size_mib=1024 state={state}")
        want = fmt_ratio(mine / memcpy)
        check(row[3].split(" ")[0] == want, f"core {workload}: {row[3]}, want {want}")


def fmt_ratio(v):
    return f"{v:.2f}"


def test_machines(script, tmp):
    a = copy(tmp, "nullblk-4k-20261206-050000")
    b = copy(tmp, "nullblk-4k-20261206-060000")
    r = run(script, a, b)
    check(r.returncode == 2, f"two machines: status {r.returncode}")
    check("host.cpu_model differs ('Intel(R) Xeon(R) Processor' vs 'AMD EPYC 7B13')" in r.stderr,
          f"two machines: {r.stderr}")
    check(not os.path.exists(os.path.join(a, "report.md")), "a report was written for two machines")
    for field, change in (("vm.accel", lambda m: m["vm"].update(accel="tcg")),
                          ("vm.kernel", lambda m: m["vm"].update(kernel="6.1.0")),
                          ("host.kernel", lambda m: m["host"].update(kernel="6.1.0")),
                          ("vm differs", lambda m: m.update(vm=None))):
        c = copy(tmp, "nullblk-4k-20261206-050000", f"changed-{field}")
        with open(os.path.join(c, "machine.json")) as fh:
            m = json.load(fh)
        change(m)
        with open(os.path.join(c, "machine.json"), "w") as fh:
            json.dump(m, fh)
        r = run(script, a, c)
        check(r.returncode == 2 and field in r.stderr, f"{field}: status {r.returncode}: {r.stderr}")
    # The same machine twice: combined, the median over all four rounds.
    same = copy(tmp, "nullblk-4k-20261206-050000", "nullblk-4k-20261206-070000")
    out = os.path.join(tmp, "combined")
    r = run(script, "-o", out, a, same)
    check(r.returncode == 0, f"same machine: status {r.returncode}: {r.stderr}")
    with open(os.path.join(out, "report.md")) as fh:
        md = fh.read()
    check("`nullblk-4k-20261206-050000`" in md and "`nullblk-4k-20261206-070000`" in md,
          "the combined report names both folders")
    row = table_row(md, "randread bs=4k qd=1 jobs=1")
    check(row[1].startswith("648k IOPS (640k-655k)") and row[4].startswith(f"{647500 / 696000:.2f}"),
          f"combined: {row}")


def test_bad_input(script, tmp):
    folder = copy(tmp, "nullblk-4k-20261206-050000", "broken")
    with open(os.path.join(folder, "samples.jsonl"), "a") as fh:
        fh.write("{not json\n")
    r = run(script, folder)
    check(r.returncode == 2 and "samples.jsonl:5: not valid JSON" in r.stderr,
          f"broken samples: {r.returncode} {r.stderr}")
    r = run(script, os.path.join(tmp, "no-such-folder"))
    check(r.returncode == 2 and "not a directory" in r.stderr, f"no folder: {r.stderr}")


def main():
    try:
        import matplotlib  # noqa: F401
        import PIL  # noqa: F401
    except ImportError as e:
        print(f"SKIP: needs Debian's python3-matplotlib ({e}); run scripts/install-deps.sh")
        return 77
    script = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="softblk-report-test.") as tmp:
        for test in (test_rnull, test_exports, test_run_time, test_zloop, test_fat, test_fat_peers,
                     test_core_memcpy, test_machines, test_bad_input):
            print(f"--- {test.__name__}")
            test(script, tmp)
    if failures:
        print(f"{len(failures)} checks failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
