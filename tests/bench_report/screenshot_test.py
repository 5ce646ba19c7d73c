#!/usr/bin/python3
"""Opens the generator's report.html in headless Chromium and checks the
screenshot shows a page with its tables and plots: many colours, not one
background, and the heat map's red (its cells are softblk below null_blk in
the recorded rnull folder) drawn from plots/*.svg.

usage: screenshot_test.py PATH/TO/softblk_report.py
Skips (77) when chromium or python3-matplotlib is missing.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def screenshot(page, png, profile):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               f"--user-data-dir={profile}", "--hide-scrollbars", f"--screenshot={png}",
               "--window-size=1200,2000", f"file://{page}"]
    # Its own process group: a browser that hangs is killed with its helpers.
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        print("FAIL: chromium did not finish its screenshot in 120 s")
        return False
    if proc.returncode != 0 or not os.path.isfile(png):
        print(f"FAIL: chromium exited {proc.returncode} without {png}:\n{output.decode(errors='replace')}")
        return False
    return True


def main():
    try:
        from PIL import Image
        import matplotlib  # noqa: F401
    except ImportError as e:
        print(f"SKIP: needs Debian's python3-matplotlib ({e}); run scripts/install-deps.sh")
        return 77
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        print("SKIP: chromium is not installed (scripts/install-deps.sh installs it)")
        return 77
    script = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="softblk-report-shot.") as tmp:
        folder = os.path.join(tmp, "rnull")
        shutil.copytree(os.path.join(DATA, "rnull-20261206-010000"), folder)
        r = subprocess.run([sys.executable, script, folder], capture_output=True, text=True,
                           timeout=120)
        if r.returncode != 0:
            print(f"FAIL: the generator exited {r.returncode}: {r.stderr}")
            return 1
        png = os.path.join(tmp, "shot.png")
        if not screenshot(os.path.join(folder, "report.html"), png, os.path.join(tmp, "profile")):
            return 1
        keep = os.environ.get("SOFTBLK_REPORT_SHOT")
        if keep:
            shutil.copy(png, keep)
        with Image.open(png) as im:
            rgb = im.convert("RGB")
        failed = []
        if rgb.size != (1200, 2000):
            failed.append(f"the screenshot is {rgb.size}, not 1200x2000")
        colours = rgb.getcolors(1 << 22) or []
        if len(colours) < 200:
            failed.append(f"only {len(colours)} distinct colours: a blank or unstyled page")
        top = max(colours)[0] if colours else 0
        if top > 0.97 * rgb.width * rgb.height:
            failed.append(f"{top} of {rgb.width * rgb.height} pixels are one colour")
        # The heat map (RdBu, all cells negative): dark red only the plot draws.
        red = sum(n for n, (r_, g, b) in colours if r_ > 140 and g < 60 and b < 70)
        if red < 5000:
            failed.append(f"only {red} heat-map red pixels: the plots were not shown")
        for f in failed:
            print(f"FAIL: {f}")
        if failed:
            return 1
        print(f"screenshot ok: {len(colours)} colours, {red} heat-map pixels")
        return 0


if __name__ == "__main__":
    sys.exit(main())
