"""Size and render time of the report page (the goal: llama3.1-405b on 16,384 H100s ≤ 2 MB, ≤ 2 s in headless Chromium).

    python benchmarks/report_render.py [--repeats 5] [--screenshot docs/img/report.png] [-- plan flags...]

Writes the report with `shardwise report`, opens it `--repeats` times in headless Chromium (Debian's
`chromium`, or SHARDWISE_CHROMIUM; offline, empty profile) and prints its size and the median time from
navigation start until the page has drawn everything (table, charts, timeline: the page's own clock,
`performance.now()` when it is ready), beside the same browser loading a blank page in the same run.
A timing, not a test: it never asserts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from shardwise.cli import main as shardwise

PLAN = ["--model", "llama3.1-405b", "--cluster", "dgx-h100-80gb", "--gpus", "16384", "--global-batch", "2048",
        "--seq-len", "8192"]
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--screenshot", default=None, help="also write a full-page PNG of the report here")
    ap.add_argument("plan", nargs="*", help="plan flags (default: llama3.1-405b on 16,384 H100s, batch 2,048 x 8,192)")
    args = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    browser_path = os.environ.get("SHARDWISE_CHROMIUM") or shutil.which("chromium")
    with tempfile.TemporaryDirectory() as tmp:
        out, blank = Path(tmp) / "report.html", Path(tmp) / "blank.html"
        blank.write_text("<!doctype html><title>blank</title><script>window.readyMs = performance.now()</script>")
        t0 = time.perf_counter()
        assert shardwise(["report", *(args.plan or PLAN), "--out", str(out)]) == 0
        written = time.perf_counter() - t0
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(str(Path(tmp) / "profile"), executable_path=browser_path,
                                                           headless=True, args=FLAGS, offline=True,
                                                           viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            ready, base = [], []
            for _ in range(args.repeats):  # interleaved: the blank page is the baseline of the same moment
                page.goto(blank.as_uri())
                base.append(page.evaluate("window.readyMs"))
                page.goto(out.as_uri())
                page.wait_for_function("window.shardwiseReport && window.shardwiseReport.ready", timeout=60_000)
                ready.append(page.evaluate("window.shardwiseReport.readyMs"))
            if args.screenshot:
                page.goto(out.as_uri())
                page.wait_for_function("window.shardwiseReport && window.shardwiseReport.ready")
                page.screenshot(path=args.screenshot, full_page=True)
            context.close()
        size = out.stat().st_size
    load = os.getloadavg()[0]
    print(f"report: {size / 1e6:.2f} MB, written in {written:.2f} s; rendered in {statistics.median(ready) / 1e3:.2f} s "
          f"(median of {args.repeats}, min {min(ready) / 1e3:.2f} s; a blank page {statistics.median(base) / 1e3:.3f} s) "
          f"in headless Chromium, load average {load:.1f}")
    if args.screenshot:
        print(f"wrote {args.screenshot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
