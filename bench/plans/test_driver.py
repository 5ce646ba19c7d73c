"""Unit tests of the bench driver: fio's JSON, the programs' outputs, the
results folder, the smoke check, the command line. Run:
python3 -m unittest discover -s bench/plans -p 'test_*.py'"""

import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import fio  # noqa: E402
import plan_core  # noqa: E402
import plan_fat  # noqa: E402
import plan_rnull  # noqa: E402
import plan_vm_smoke  # noqa: E402
import plans  # noqa: E402
import runner  # noqa: E402
import plan_zloop  # noqa: E402
import smoke_check  # noqa: E402
import softblk_bench  # noqa: E402
from results import Progress, Results  # noqa: E402


def data(name):
    with open(os.path.join(HERE, "testdata", name)) as f:
        return f.read()


class FioTest(unittest.TestCase):
    def test_parse_recorded_randread(self):
        f = fio.parse(data("fio-randread.json"))
        self.assertAlmostEqual(f["iops"], 741820.538385)
        self.assertAlmostEqual(f["mib_s"], 3038496925 / 1048576.0)
        self.assertAlmostEqual(f["lat_us"]["mean"], 0.864045109)
        self.assertAlmostEqual(f["lat_us"]["p99"], 0.326)
        self.assertGreater(f["extra"]["ios"], 0)

    def test_parse_skips_a_line_before_the_json(self):
        # fio's nbd engine (libnbd) prints a line first.
        f = fio.parse("nbd: connected\n" + data("fio-randread.json"))
        self.assertAlmostEqual(f["iops"], 741820.538385)

    def test_job_error_and_no_io_are_errors(self):
        doc = json.loads(data("fio-randread.json"))
        doc["jobs"][0]["error"] = 5
        with self.assertRaisesRegex(fio.FioError, "error 5"):
            fio.parse(json.dumps(doc))
        doc["jobs"][0]["error"] = 0
        doc["jobs"][0]["read"]["total_ios"] = 0
        with self.assertRaisesRegex(fio.FioError, "no I/O"):
            fio.parse(json.dumps(doc))
        with self.assertRaisesRegex(fio.FioError, "no JSON"):
            fio.parse("fio: failed to open /dev/nothing")

    def test_command(self):
        c = fio.command("/dev/loop9", "randwrite", 4096, 2, 1, 64, 3)
        self.assertIn("--ioengine=psync", c)
        self.assertIn("--numjobs=2", c)
        self.assertIn("--runtime=3", c)
        c = fio.command("nbd+unix:///d0?socket=/s", "randread", 4096, 1, 32, 64, 1)
        self.assertIn("--ioengine=nbd", c)
        self.assertIn("--iodepth=32", c)


class ProgramOutputTest(unittest.TestCase):
    def test_fat_table(self):
        rows = plan_fat.parse(data("fat-bench.md"))
        configs = {(s, c) for s, c, _ in rows}
        self.assertIn(("softblk", "before"), configs)
        self.assertIn(("softblk", "after"), configs)
        self.assertIn(("mtools", "mcopy, image in /dev/shm"), configs)
        # Hermit's published row is the reference's, not a measurement.
        self.assertEqual(len(rows), len(configs))
        samples = plan_fat.samples(rows, "softblk-bench-fat")
        before = [s for s in samples if s["case"] == {"config": "before", "workload": "seq-read",
                                                      "bs": 65536}]
        self.assertEqual(len(before), 1)
        self.assertGreater(before[0]["extra"]["requests_per_mib"], 2000)  # one per sector
        mtools = [s for s in samples if s["system"] == "mtools"]
        self.assertNotIn("randread", [s["case"]["workload"] for s in mtools])

    def test_fat_table_with_write_only_column(self):
        text = ("| path | seq write 16 KiB (MiB/s) | a | b | c | d | e | f | g | seq write 16 KiB, "
                "write-only open (MiB/s) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
                "| FUSE mount (default options) | 894.6 | 1666.7 | 89680 | 78622 | 27.64 | 16.07 "
                "| 64.0 | 1.0 | 1226.2 |\n"
                "| mtools (mcopy in / out, image in /dev/shm) | 1918.0 | 1680.0 | - | - | 28.00 | - "
                "| - | - | 1918.0 |\n")
        samples = plan_fat.samples(plan_fat.parse(text), "softblk-bench-fat")
        only = {s["system"]: s["mib_s"] for s in samples
                if s["case"]["workload"] == "seq-write-wronly"}
        self.assertEqual(only, {"softblk": 1226.2, "mtools": 1918.0})

    def test_core_records(self):
        text = ('{"case":{"test":"null","irqmode":0},"system":"softblk","iops":5.0,"mib_s":1.0,'
                '"extra":{"errors":0}}\n{"case":{"test":"null","irqmode":1},"system":"softblk",'
                '"iops":5.0,"mib_s":1.0,"extra":{"errors":3}}\n')
        r = plan_core.parse(text)
        self.assertEqual([x["status"] for x in r], ["ok", "failed"])
        self.assertEqual(r[1]["error"], "3 I/O errors")
        with self.assertRaises(Exception):
            plan_core.parse("no json here\n")


class RnullTest(unittest.TestCase):
    def test_cells_of_a_recorded_boot(self):
        vm, records = plan_rnull.parse(data("rnull-compare.out"))
        self.assertEqual(vm, {"kernel": "6.12.118+deb12-amd64", "cpus": 2})
        self.assertEqual([r["system"] for r in records], ["null_blk", "softblk"])
        self.assertEqual(records[0]["case"], {"workload": "randread", "bs": 4096, "jobs": 1, "qd": 1,
                                              "engine": "psync"})
        self.assertEqual(records[0]["iops"], 40080.0)
        self.assertAlmostEqual(records[1]["mib_s"], 1233 * 4096 / 1048576.0)
        self.assertNotIn("status", records[0])
        _, bad = plan_rnull.parse("CELL psync write 1m 2 ublk 0 812 5\n")
        self.assertEqual((bad[0]["status"], bad[0]["error"]), ("failed", "fio error 5"))
        self.assertEqual(bad[0]["case"]["bs"], 1 << 20)

    def test_full_is_the_cover_letters_432_cells(self):
        w, b, j = plan_rnull.matrix("rnull", "full")
        self.assertEqual(len(w) * len(b) * len(j), 432)
        self.assertEqual(plan_rnull.matrix("nullblk-4k", "full"), (["randread"], ["4k"], [1]))


class ZloopTest(unittest.TestCase):
    OUT = """softblk-vm: init started at 4.1 s, kernel 6.12.118+deb12-amd64, 4 cpus
no zloop module in 6.12.118+deb12-amd64: the kernel's zloop is left out
round 1 q1 nullb randwrite 4k qd1 x1: 7545 IOPS 29.5 MiB/s
round 1 q1 sbnull randwrite 4k qd1 x1: 1789 IOPS 7.0 MiB/s
round 1 q1 sbzloop randwrite 4k qd1 x1: 788 IOPS 3.1 MiB/s
FAILED: round 2 q4 sbzlcopy write 128k qd32 x1 (left out of the medians)
queues 1: | job | null_blk IOPS (MiB/s) |
"""

    def test_guest_lines(self):
        vm, records, no_kzloop = plan_zloop.parse(self.OUT)
        self.assertEqual(vm, {"kernel": "6.12.118+deb12-amd64", "cpus": 4})
        self.assertTrue(no_kzloop)
        self.assertEqual([(r["system"], r["case"]["target"]) for r in records],
                         [("null_blk", "null"), ("softblk", "null"), ("softblk", "zloop"),
                          ("softblk", "zloop")])
        self.assertEqual(records[0]["case"], {"target": "null", "queues": 1, "workload": "randwrite",
                                              "bs": 4096, "qd": 1, "jobs": 1})
        self.assertEqual((records[0]["iops"], records[0]["mib_s"]), (7545.0, 29.5))
        last = records[-1]
        self.assertEqual((last["status"], last["round"], last["case"]["zero_copy"], last["case"]["bs"]),
                         ("failed", 2, 0, 131072))


class VmSmokeTest(unittest.TestCase):
    """smoke's one VM boot for rnull and zloop (plan_vm_smoke)."""

    def test_parts_of_a_recorded_boot(self):
        found = plan_vm_smoke.parts(data("vm-smoke.out"))
        self.assertEqual({k: v[0] for k, v in found.items()}, {"rnull": 0, "zloop": 0})
        rnull = plan_vm_smoke.part_records("rnull", *found["rnull"], "cmd")
        self.assertEqual([(r["plan"], r["system"], r["iops"]) for r in rnull],
                         [("rnull", "null_blk", 9087.0), ("rnull", "softblk", 489.0)])
        zloop = plan_vm_smoke.part_records("zloop", *found["zloop"], "cmd")
        self.assertEqual({r["plan"] for r in zloop}, {"zloop"})
        self.assertEqual(sorted((r["system"], r["case"]["target"], r.get("status", "ok")) for r in zloop),
                         [("kernel-zloop", "zloop", "skipped"), ("null_blk", "null", "ok"),
                          ("softblk", "null", "ok"), ("softblk", "zloop", "ok")])
        self.assertEqual({r["command"] for r in rnull + zloop}, {"cmd"})

    def test_a_part_that_skips_or_fails_is_its_plans(self):
        text = ("SMOKE-PART-BEGIN rnull\nSKIP: no ublk_drv in this kernel\nSMOKE-PART-END rnull 77\n"
                "SMOKE-PART-BEGIN zloop\nround 1 q1 nullb randwrite 4k qd1 x1: 10 IOPS 0.1 MiB/s\n"
                "FAIL: no ublk devices\nSMOKE-PART-END zloop 1\n")
        found = plan_vm_smoke.parts(text)
        (skip,) = plan_vm_smoke.part_records("rnull", *found["rnull"], "cmd")
        self.assertEqual((skip["plan"], skip["status"]), ("rnull", "skipped"))
        self.assertIn("no ublk_drv", skip["error"])
        recs = plan_vm_smoke.part_records("zloop", *found["zloop"], "cmd")
        self.assertEqual([(r["plan"], r.get("status", "ok")) for r in recs],
                         [("zloop", "ok"), ("zloop", "failed")])
        self.assertIn("exited with 1 after 1 measurements", recs[-1]["error"])

    def test_smoke_boots_once_for_both_vm_plans(self):
        names = [m.NAME for m in plans.modules("smoke")]
        self.assertEqual(names, ["vm-lab", "core", "exports", "file", "fat"])
        self.assertEqual(plan_zloop.guest_env("smoke", 1, 1, 2)[2:4],
                         ["QUEUE_COUNTS=1", "JOBS=randwrite 4k 1 1"])
        self.assertEqual(plan_rnull.guest_settings("rnull", "smoke", 1)["cells"], 1)

    def test_background_unit_runs_beside_the_others(self):
        """A background unit starts at its setup and ends before the results
        close; each of its records goes under its own plan."""
        import threading
        started, release = threading.Event(), threading.Event()

        def slow(ctx):
            started.set()
            release.wait(10)
            return [{"plan": "rnull", "case": {"workload": "randread"}, "system": "null_blk",
                     "iops": 1.0}, {"plan": "zloop", "case": {"queues": 1}, "system": "softblk",
                                    "status": "failed", "error": "boom"}]

        def quick(ctx):
            self.assertTrue(started.wait(10))  # the background unit runs already
            release.set()
            return {"iops": 2.0}

        class Fake:
            NAME, NEEDS_ROOT = "fake", False

            @staticmethod
            def setup(ctx):
                return [runner.Unit("vm-lab", {"boot": "x"}, "all", slow, once=True, background=True),
                        runner.Unit("core", {"test": "null"}, "softblk", quick)]

        out = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, out)
        args = softblk_bench.parse_args(["smoke", "--out", out])
        real = plans.modules
        plans.modules = lambda plan: [Fake]
        try:
            res, interrupted = softblk_bench.run_plan(args, {"source": None}, out=io.StringIO())
        finally:
            plans.modules = real
        self.assertFalse(interrupted)
        with open(os.path.join(res.dir, "samples.jsonl")) as f:
            got = [json.loads(line) for line in f]
        self.assertEqual(sorted((s["plan"], s["system"], s["status"]) for s in got),
                         [("core", "softblk", "ok"), ("rnull", "null_blk", "ok"),
                          ("zloop", "softblk", "failed")])
        # Where the run's time went (smoke's budget): the whole run, the
        # foreground runs, and the background unit's end, which here came
        # before the foreground's (it was released by the quick unit).
        with open(os.path.join(res.dir, "machine.json")) as f:
            m = json.load(f)
        self.assertIsInstance(m["elapsed_s"], float)
        self.assertEqual(set(m["timing_s"]), {"foreground", "boot=x"})
        self.assertLessEqual(m["timing_s"]["boot=x"], m["timing_s"]["foreground"])
        self.assertLessEqual(m["timing_s"]["foreground"], m["elapsed_s"])


class ResultsTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def tearDown(self):
        shutil.rmtree(self.dir)

    def test_folder(self):
        settings = {"runtime_s": 2, "rounds": 3, "mode": "quick"}
        r = Results(self.dir, "exports", settings, {"version": "0.1.0", "commit": "abc"},
                    stamp="20260101-000000")
        self.assertTrue(r.dir.endswith("exports-20260101-000000"))
        r.command(["fio", "--name=a b"])
        r.sample("exports", {"workload": "randread", "bs": 4096}, "softblk", 1, "ok",
                 fields={"iops": 10.0, "mib_s": 0.04, "command": "fio"})
        r.sample("exports", {"workload": "randread", "bs": 4096}, "qsd", 1, "failed",
                 error="qemu-storage-daemon: exited with 1 before it was ready")
        r.close()
        again = Results(self.dir, "exports", settings, {}, stamp="20260101-000000")
        again.close()
        self.assertNotEqual(again.dir, r.dir)  # two runs in one second
        with open(os.path.join(r.dir, "machine.json")) as f:
            m = json.load(f)
        self.assertEqual(m["runtime_s"], 2)
        self.assertEqual(m["mode"], "quick")
        self.assertIsNone(m["vm"])
        self.assertEqual(set(m["host"]), smoke_check.HOST_KEYS)
        self.assertEqual(len(m["host"]["load_after"]), 3)
        with open(os.path.join(r.dir, "samples.jsonl")) as f:
            lines = [json.loads(x) for x in f]
        self.assertEqual(len(lines), 2)
        for s in lines:
            self.assertTrue(smoke_check.SAMPLE_KEYS <= set(s))
        self.assertNotIn("error", lines[0])
        self.assertEqual(lines[1]["status"], "failed")
        self.assertIn("before it was ready", lines[1]["error"])
        with open(os.path.join(r.dir, "commands.txt")) as f:
            self.assertEqual(f.read(), "fio '--name=a b'\n")

    def test_progress(self):
        out = io.StringIO()
        p = Progress("core", 4, 5, out)
        p.show({"workload": "randread"}, "softblk", 1, 2)
        text = out.getvalue()
        self.assertIn("[core] workload=randread | softblk | round 1/2 | run 1/4", text)
        self.assertIn("0m24s left", text)  # 4 runs of 5 s + 1 s each
        out = io.StringIO()
        Progress("rnull", 2, 2, out, estimate_s=300).show({"cells": 24}, "null_blk+softblk", 1, 2)
        self.assertIn("5m00s left", out.getvalue())  # the plan's estimate (VM boots)


class SmokeCheckTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        r = Results(self.dir, "smoke", {"runtime_s": 1, "rounds": 1, "mode": "smoke"}, {})
        r.command("true")
        for plan, case, system in smoke_check.EXPECTED:
            r.sample(plan, dict(case, bs=4096), system, 1, "ok",
                     fields={"iops": 1000.0, "mib_s": 3.9, "command": "x"})
        r.close()
        self.results = r.dir

    def tearDown(self):
        shutil.rmtree(self.dir)

    def rewrite(self, edit):
        path = os.path.join(self.results, "samples.jsonl")
        with open(path) as f:
            samples = [json.loads(x) for x in f]
        with open(path, "w") as f:
            for s in edit(samples):
                f.write(json.dumps(s) + "\n")

    def test_complete_passes(self):
        self.assertEqual(smoke_check.check(self.results), [])

    def test_missing_case_fails(self):
        self.rewrite(lambda ss: [s for s in ss if s["system"] != "loop"])
        self.assertTrue(any("missing: file" in p for p in smoke_check.check(self.results)))

    def test_failed_run_fails(self):
        def fail_one(ss):
            ss[0]["status"] = "failed"
            ss[0]["error"] = "fio exited with 1"
            return ss
        self.rewrite(fail_one)
        self.assertTrue(any("fio exited with 1" in p for p in smoke_check.check(self.results)))

    def test_vm_lab_skipped_passes_but_failed_does_not(self):
        def lab(status):
            def edit(ss):
                ss = [s for s in ss if s["plan"] != "rnull"]
                ss.append(dict(ss[0], plan="rnull", case={}, status=status, error="VM lab: no QEMU"))
                return ss
            return edit
        self.rewrite(lab("skipped"))
        self.assertEqual(smoke_check.check(self.results), [])
        self.rewrite(lab("failed"))
        self.assertTrue(any("VM lab" in p for p in smoke_check.check(self.results)))

    def test_implausible_number_fails(self):
        def zero(ss):
            ss[3]["iops"] = 0.0
            ss[3]["mib_s"] = None
            return ss
        self.rewrite(zero)
        self.assertTrue(any("positive" in p for p in smoke_check.check(self.results)))


class CommandLineTest(unittest.TestCase):
    def run_main(self, *argv):
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = softblk_bench.main(list(argv))
        return code, out.getvalue() + err.getvalue()

    def test_unknown_plan_lists_the_plans(self):
        code, text = self.run_main("nope")
        self.assertEqual(code, 2)
        self.assertIn("unknown plan 'nope'", text)
        for name in ("rnull", "zloop", "exports", "smoke"):
            self.assertIn(name, text)

    def test_list(self):
        code, text = self.run_main("--list")
        self.assertEqual(code, 0)
        self.assertIn("rnull       VM lab", text)
        self.assertIn("zloop       VM lab", text)

    def test_settings(self):
        args = softblk_bench.parse_args(["exports", "--quick", "--rounds", "4"])
        self.assertEqual(softblk_bench.settings_for(args),
                         {"mode": "quick", "runtime_s": 2, "rounds": 4})
        args = softblk_bench.parse_args(["exports", "--runtime", "0.5"])
        self.assertEqual(softblk_bench.settings_for(args)["runtime_s"], 0.5)
        code, _ = self.run_main("core", "--rounds", "0")
        self.assertEqual(code, 2)


if __name__ == "__main__":
    unittest.main()
