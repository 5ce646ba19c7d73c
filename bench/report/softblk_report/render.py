"""report.md and report.html from the tables and plots."""
import html

PROBLEM_WORDS = ("missing", "failed", "skipped", "softblk failed", "softblk skipped")


def _get(d, *keys):
    for k in keys:
        if not isinstance(d, dict) or d.get(k) is None:
            return "?"
        d = d[k]
    return d


def run_mode(machine):
    if isinstance(machine.get("mode"), str):
        return machine["mode"]
    if isinstance(machine.get("quick"), bool):
        return "quick" if machine["quick"] else "full"
    if isinstance(machine.get("full"), bool):
        return "full" if machine["full"] else "quick"
    return "mode ?"


def load_text(values):
    if isinstance(values, list) and values:
        return " ".join(f"{float(v):.2f}" for v in values)
    return "?"


def machine_line(folder):
    m = folder.machine
    host = m.get("host") or {}
    virt = host.get("hypervisor")
    where = "bare metal" if virt in ("none", "", None) else f"hypervisor {virt}"
    line = (f"host: {_get(host, 'cpu_model')} (family {_get(host, 'cpu_family')} model "
            f"{_get(host, 'cpu_model_number')}), {_get(host, 'cpus')} CPUs, {where}, "
            f"Linux {_get(host, 'kernel')}")
    vm = m.get("vm")
    if vm:
        line += (f"; VM lab: {str(_get(vm, 'accel')).upper()}, Linux {_get(vm, 'kernel')}, "
                 f"{_get(vm, 'cpus')} vCPUs, {_get(vm, 'mem_mib')} MiB")
    else:
        line += "; no VM"
    line += (f"; softblk {_get(m, 'softblk', 'version')} ({_get(m, 'softblk', 'commit')}); "
             f"{_get(m, 'runtime_s')} s per run, {run_mode(m)}; load average before "
             f"{load_text(host.get('load_before'))}, after {load_text(host.get('load_after'))}")
    if m.get("elapsed_s") is not None:
        parts = [f"{k} {v} s" for k, v in (m.get("timing_s") or {}).items()]
        line += f"; took {m['elapsed_s']} s" + (f" ({', '.join(parts)})" if parts else "")
    return line


def is_problem(lines):
    return any(line.startswith(PROBLEM_WORDS) or " failed: " in line or line.endswith(" missing")
               for line in lines)


def md_cell(lines):
    return "<br>".join(line.replace("|", "\\|") for line in lines)


def markdown(folders, sections):
    plans = ", ".join(name for name, _, _ in sections)
    out = [f"# softblk bench report: {plans}", ""]
    out.append("Written by `bench/report/softblk_report.py` from "
               + ", ".join(f"`{f.name}`" for f in folders) + ". Machine:")
    out.append("")
    for f in folders:
        out.append(f"- `{f.name}`: {machine_line(f)}")
    out.append("")
    for name, tables, plots in sections:
        out += [f"## {name}", ""]
        for t in tables:
            out += [f"### {t.title}", ""]
            if t.note:
                out += [t.note, ""]
            out.append("| " + " | ".join(md_cell([h]) for h in t.header) + " |")
            out.append("|" + "|".join("---" for _ in t.header) + "|")
            for row in t.rows:
                out.append("| " + " | ".join(md_cell(c) for c in row) + " |")
            out.append("")
        for p in plots:
            out += [f"![{p.caption}](plots/{p.name}.png)", "",
                    f"*{p.caption}* ([SVG](plots/{p.name}.svg))", ""]
    for f in folders:
        out += ["<details>", f"<summary>Commands of {f.name} ({len(f.commands)})</summary>", "",
                "```text"] + f.commands + ["```", "", "</details>", ""]
    return "\n".join(out)


STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; max-width: 110em; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.85em; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.5em; vertical-align: top; }
th { background: #eef2f7; } tr:nth-child(even) td { background: #fafafa; }
tr td.problem { color: #a00000; background: #fff0f0; }
.machine { font-family: monospace; font-size: 0.85em; background: #f4f4f4; padding: 0.5em; }
.note { font-size: 0.9em; color: #444; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
pre { background: #f4f4f4; padding: 0.6em; overflow-x: auto; font-size: 0.8em; }
"""


def html_page(folders, sections):
    e = html.escape
    plans = ", ".join(name for name, _, _ in sections)
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>softblk bench report: {e(plans)}</title>", f"<style>{STYLE}</style>",
           "</head><body>", f"<h1>softblk bench report: {e(plans)}</h1>",
           "<p>Written by <code>bench/report/softblk_report.py</code> from "
           + ", ".join(f"<code>{e(f.name)}</code>" for f in folders) + ".</p>"]
    for f in folders:
        out.append(f'<div class="machine">{e(f.name)}: {e(machine_line(f))}</div>')
    for name, tables, plots in sections:
        out.append(f"<h2>{e(name)}</h2>")
        for t in tables:
            out.append(f"<h3>{e(t.title)}</h3>")
            if t.note:
                out.append(f'<p class="note">{e(t.note)}</p>')
            out.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in t.header) + "</tr>")
            for row in t.rows:
                cells = []
                for c in row:
                    cls = ' class="problem"' if is_problem(c) else ""
                    cells.append(f"<td{cls}>" + "<br>".join(e(line) for line in c) + "</td>")
                out.append("<tr>" + "".join(cells) + "</tr>")
            out.append("</table>")
        for p in plots:
            out.append(f'<figure><img src="plots/{e(p.name)}.svg" alt="{e(p.caption)}">'
                       f'<figcaption>{e(p.caption)} (<a href="plots/{e(p.name)}.png">PNG</a>)'
                       "</figcaption></figure>")
    for f in folders:
        out.append(f"<details><summary>Commands of {e(f.name)} ({len(f.commands)})</summary>"
                   f"<pre>{e(chr(10).join(f.commands))}</pre></details>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
