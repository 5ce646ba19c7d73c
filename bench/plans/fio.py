"""fio command lines and the parsing of fio's --output-format=json into
a sample's fields (iops, mib_s, lat_us)."""

import json


class FioError(Exception):
    pass


def command(target, rw, bs, jobs, qd, size_mib, runtime_s, name="bench"):
    """fio on a block device (psync, direct; QD is 1 per job) or, for
    target "nbd+unix://...", through fio's nbd engine at QD qd."""
    cmd = ["fio", f"--name={name}", f"--rw={rw}", f"--bs={bs}", f"--numjobs={jobs}",
           f"--size={size_mib}M", "--time_based", f"--runtime={runtime_s}", "--group_reporting",
           "--output-format=json"]
    if target.startswith("nbd"):
        cmd += ["--ioengine=nbd", f"--uri={target}", f"--iodepth={qd}"]
    elif qd > 1:
        cmd += [f"--filename={target}", "--ioengine=io_uring", "--direct=1", f"--iodepth={qd}"]
    else:
        cmd += [f"--filename={target}", "--ioengine=psync", "--direct=1"]
    return cmd


def _json_part(text):
    # fio's nbd engine (libnbd) may print a line before the JSON.
    start = text.find("{")
    if start < 0:
        raise FioError("fio printed no JSON: " + text.strip()[-300:])
    try:
        return json.loads(text[start:])
    except json.JSONDecodeError as e:
        raise FioError(f"fio's JSON does not parse ({e}): {text.strip()[-300:]}") from None


def parse(text):
    """The fields of a sample from fio's JSON output (group_reporting: one
    job). Raises FioError when fio reports an error or measured nothing."""
    doc = _json_part(text)
    jobs = doc.get("jobs") or []
    if not jobs:
        raise FioError("fio's JSON has no jobs")
    j = jobs[0]
    if j.get("error"):
        raise FioError(f"fio job error {j['error']}")
    read, write = j.get("read", {}), j.get("write", {})
    ios = read.get("total_ios", 0) + write.get("total_ios", 0)
    if ios == 0:
        raise FioError("fio completed no I/O")
    iops = read.get("iops", 0.0) + write.get("iops", 0.0)
    mib_s = (read.get("bw_bytes", 0) + write.get("bw_bytes", 0)) / 1048576.0
    main = read if read.get("total_ios", 0) >= write.get("total_ios", 0) else write
    lat = None
    clat = main.get("clat_ns", {})
    pct = clat.get("percentile", {})
    if main.get("lat_ns", {}).get("mean") is not None:
        lat = {
            "mean": main["lat_ns"]["mean"] / 1000.0,
            "p50": pct["50.000000"] / 1000.0 if "50.000000" in pct else None,
            "p99": pct["99.000000"] / 1000.0 if "99.000000" in pct else None,
        }
    runtime_ms = max(read.get("runtime", 0), write.get("runtime", 0))
    return {
        "iops": iops,
        "mib_s": mib_s,
        "lat_us": lat,
        "extra": {
            "ios": ios,
            "runtime_ms": runtime_ms,
            # fio's own CPU time, share of one CPU over the job
            "fio_cpu_pct": j.get("usr_cpu", 0.0) + j.get("sys_cpu", 0.0),
        },
    }
