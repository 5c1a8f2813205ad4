"""The report page in a real browser: headless Chromium (Debian's package; .ci/run installs it), driven by
Playwright, offline, with an empty profile. It must render without console errors, list the planner's
layouts, sort and filter them, draw the winner's bars to its predicted memory and step time and its
pipeline step to the planner's span, and fetch nothing.

No Chromium is a failure, not a skip: CI installs it, and a developer needs `apt-get install chromium`
(or SHARDWISE_CHROMIUM=/path/to/chrome)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from shardwise.cli import main
from shardwise.commands.plan import best_per_split
from shardwise.planner.job import make_job
from shardwise.planner.search import search
from shardwise.specs import load_cluster, load_model

# The page: llama3.1-405b on 16,384 H100s (the Llama 3 paper's batch of 16M tokens).
PLAN = ["--model", "llama3.1-405b", "--cluster", "dgx-h100-80gb", "--gpus", "16384", "--global-batch", "2048",
        "--seq-len", "8192"]
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]
GIB = 2**30


def chromium() -> str:
    for path in (os.environ.get("SHARDWISE_CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser"),
                 shutil.which("google-chrome")):
        if path:
            return path
    pytest.fail("no Chromium to test the report page in: apt-get install -y chromium (.ci/run does), "
                "or set SHARDWISE_CHROMIUM to a Chrome/Chromium binary")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is missing: pip install -e '.[dev]'")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("profile")), executable_path=chromium(), headless=True, args=FLAGS,
            viewport={"width": 1400, "height": 1000}, offline=True)  # an empty profile, no network
        yield context
        context.close()


class Page:
    """A page of the browser with everything it logged and requested."""

    def __init__(self, context, path):
        self.page = context.new_page()
        self.console, self.requests = [], []
        self.page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.url = path.resolve().as_uri()
        self.page.goto(self.url)
        self.page.wait_for_function("window.shardwiseReport && window.shardwiseReport.ready", timeout=30_000)

    def js(self, expression, arg=None):
        return self.page.evaluate(expression, arg)

    def rows(self) -> list[list[str]]:
        return self.js("[...document.querySelectorAll('#layout-body tr')].map(tr => [...tr.cells].map(td => td.textContent))")

    def column(self, key: str) -> int:
        return self.js(f"[...document.querySelectorAll('#layout-head th')].findIndex(th => th.dataset.key === '{key}')")

    def quiet(self) -> None:
        assert self.console == [], self.console
        assert self.requests == [self.url]  # the file itself and nothing else


@pytest.fixture(scope="module")
def report_405b(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "report.html"
    assert main(["report", *PLAN, "--out", str(out)]) == 0
    job = make_job(load_model("llama3.1-405b"), load_cluster("dgx-h100-80gb"), 2048, 8192)  # the CLI's default stack
    return out, search(job, 16384)


@pytest.fixture(scope="module")
def page(browser, report_405b):
    return Page(browser, report_405b[0])


def test_405b_page_is_small_and_loads_offline_without_errors(page, report_405b):
    assert report_405b[0].stat().st_size <= 2_000_000
    page.quiet()


def test_table_lists_the_planners_layouts(page, report_405b):
    result = report_405b[1]
    splits = best_per_split(result.ranked)
    rows = page.rows()
    assert len(rows) == min(20, len(splits))
    assert [r[page.column("layout")] for r in rows] == [e.layout.describe() for e in splits[:20]]  # plan's order, plan's names
    page.page.select_option("#page-size", "0")  # all rows
    assert len(page.rows()) == len(splits)
    page.page.uncheck("#best-of-split")  # every fitting variant
    assert len(page.rows()) == len(result.ranked) > len(splits)
    page.page.check("#best-of-split")
    page.page.select_option("#page-size", "20")
    page.quiet()


def test_sorting_and_filtering_change_the_rows(page):
    by_rank = page.rows()
    page.page.click("#layout-head th[data-key=mem_gib]")
    ascending = page.rows()
    mem = page.column("mem_gib")
    memory = [float(r[mem].replace(",", "")) for r in ascending]
    assert memory == sorted(memory) and ascending[0] != by_rank[0]
    page.page.click("#layout-head th[data-key=mem_gib]")
    memory = [float(r[mem].replace(",", "")) for r in page.rows()]
    assert memory == sorted(memory, reverse=True)
    page.page.select_option("select[data-filter=tp]", "8")
    assert page.rows() and {r[page.column("tp")] for r in page.rows()} == {"8"}
    page.page.select_option("select[data-filter=tp]", "")
    page.page.click("#layout-head th[data-key=rank]")
    assert page.rows() == by_rank
    page.quiet()


def test_winners_bars_add_up_to_its_predicted_memory_and_step_time(page, report_405b):
    win = report_405b[1].ranked[0]
    for chart, total in (("memory", win.memory_per_gpu / GIB), ("time", win.step_time)):
        drawn = page.js("""name => {
            const c = window.shardwiseReport.charts[name];
            const i = c.data.labels.findIndex(l => l.startsWith('#1 '));
            const parts = c.data.datasets.map(d => d.data[i]);
            const last = c.data.datasets.map((d, k) => k).filter(k => parts[k] > 0).pop();
            const end = c.getDatasetMeta(last).data[i].x;  // right edge of the stacked bar, in pixels
            return {index: i, sum: parts.reduce((a, b) => a + b, 0), end: c.scales.x.getValueForPixel(end),
                    perPixel: c.scales.x.getValueForPixel(1) - c.scales.x.getValueForPixel(0)};
        }""", chart)
        assert drawn["index"] == 0
        assert drawn["sum"] == pytest.approx(total, rel=1e-4)
        assert abs(drawn["end"] - total) <= 1.5 * drawn["perPixel"]  # the bar ends where the prediction is
    line = page.js("window.shardwiseReport.charts.memory.options.plugins.gpuLine.value")
    assert line == pytest.approx(report_405b[1].ranked[0].gpu_memory_bytes / GIB)  # the GPU's: 79.6 GiB of an H100
    page.quiet()


def test_timeline_draws_the_planners_pipeline_span(page, report_405b):
    win = report_405b[1].ranked[0]
    span = sum(win.time_s.get(k, 0.0) for k in ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_p2p", "pipeline_bubble"))
    drawn = page.js("""() => {
        const t = window.shardwiseReport.timeline, canvas = document.getElementById('timeline-canvas');
        const ctx = canvas.getContext('2d'), w = canvas.width, h = canvas.height;
        const pixels = ctx.getImageData(0, 0, w, h).data;
        let coloured = 0;
        for (let i = 0; i < pixels.length; i += 4) if (pixels[i + 3] > 0 && !(pixels[i] > 230 && pixels[i + 1] > 230)) coloured++;
        return {makespan: t.makespan, ranks: t.events.length, coloured: coloured / (w * h)};
    }""")
    assert span * 0.98 <= drawn["makespan"] <= span * (1 + 1e-5)  # closed_forms.uneven_makespan bounds it from above
    assert drawn["ranks"] == win.layout.pp and drawn["coloured"] > 0.2  # the step is drawn, not an empty canvas
    page.quiet()


def test_validate_run_beside_a_plan_without_pipeline(browser, tmp_path):
    from test_report import validate_result

    run = validate_result(7)  # on a busy machine: the page says what `validate` prints beside its table
    run["summary"] |= {"noisy_layouts": 1, "drift_corrected": {"median_abs_error": 0.032, "p90_abs_error": 0.08,
                                                               "kendall_tau": 0.97, "top1_regret": 0.0}}
    run["machine"] = {"cores": 2, "other_cpu_cores": 1.3, "calibration_other_cpu_cores": None, "speed_ratio": None}
    result = tmp_path / "v.json"
    result.write_text(json.dumps(run))
    out = tmp_path / "v.html"
    plan = ["--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "256",
            "--seq-len", "4096", "--pp", "1"]
    assert main(["report", *plan, "--validate", str(result), "--out", str(out)]) == 0
    page = Page(browser, out)
    points = page.js("window.shardwiseReport.charts.validate.data.datasets.filter(d => d.type !== 'line').reduce((n, d) => n + d.data.length, 0)")
    assert points == 7 and page.js("document.querySelectorAll('#validate-table tbody tr').length") == 7
    assert "no pipeline" in page.js("document.getElementById('timeline-note').textContent")
    # no blank space where the timeline would be: the hidden canvas takes no room
    assert page.js("document.getElementById('timeline-canvas').getBoundingClientRect().height") == 0
    said = page.js("document.getElementById('validate-summary').textContent")
    assert "At the machine's speed during the sweep: median error 3.2" in said and "Kendall τ 0.97" in said
    assert "Warning: other processes kept 1.3 of this machine's" in said and "1 layout(s) stayed noisy" in said
    page.quiet()


def test_screenshot_for_the_docs(page, tmp_path):
    shot = tmp_path / "report.png"
    page.page.screenshot(path=str(shot), full_page=True)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000
