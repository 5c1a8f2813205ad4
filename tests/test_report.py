"""The report page's file: self-contained, its data equal to the planner's numbers; the `report` command.

What the page does in a browser is tested in test_report_browser.py."""

from __future__ import annotations

import json
import math
import re
from html.parser import HTMLParser

import pytest

from shardwise.cli import main
from shardwise.commands.plan import best_per_split
from shardwise.planner.job import make_job
from shardwise.planner.search import search
from shardwise.specs import load_cluster, load_model

PLAN = ["--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--gpus", "64", "--global-batch", "256", "--seq-len", "4096"]
GIB = 2**30


class Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.data_json = [], None
        self._in_data = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_data = tag == "script" and dict(attrs).get("id") == "report-data"

    def handle_data(self, data):
        if self._in_data:
            self.data_json = (self.data_json or "") + data

    def handle_endtag(self, tag):
        self._in_data = False


def parse(path) -> Tags:
    tags = Tags()
    tags.feed(path.read_text(encoding="utf-8"))
    return tags


def validate_result(n: int = 6) -> dict:
    """A `validate --json` result, as that command writes it (the fields the report reads)."""
    layouts = []
    for i in range(n):
        meas = 0.01 * (1 + i)
        layouts.append({"name": f"dp{2 if i % 2 else 1} tp{1 if i % 2 else 2} pp1 mb1", "dp": 2 if i % 2 else 1,
                        "tp": 1 if i % 2 else 2, "pp": 1, "predicted_step_time_s": meas * (1 + 0.05 * (i - 2)),
                        "measured_step_time_s": meas, "noisy": i == 3, "predicted_memory_bytes": 2e6 + i,
                        "measured_memory_bytes": 2e6})
    return {"model": "tiny", "world": 2, "backend": "gloo", "cluster": "profile", "global_batch": 8, "seq_len": 64,
            "layouts": layouts, "summary": {"median_abs_error": 0.05, "p90_abs_error": 0.1, "spearman": 0.9,
                                            "kendall_tau": 0.8, "top1_regret": 0.0, "best_in_top3": True,
                                            "memory_median_abs_error": 0.0, "memory_p90_abs_error": 0.0}}


@pytest.fixture(scope="module")
def planned():
    job = make_job(load_model("llama3-8b"), load_cluster("dgx-h100-80gb"), 256, 4096)  # the CLI's default stack
    return job, search(job, 64)


def test_page_is_one_self_contained_file(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", *PLAN, "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["path"] == str(out) and printed["bytes"] == len(out.read_bytes())
    tags = parse(out)
    names = [t for t, _ in tags.tags]
    assert "link" not in names and "iframe" not in names and "img" not in names
    assert all("src" not in attrs for tag, attrs in tags.tags if tag == "script")
    assert not [a for _, attrs in tags.tags for k, a in attrs.items() if k in ("href", "src") and a and not a.startswith("#")]
    csp = next(attrs["content"] for tag, attrs in tags.tags if tag == "meta" and attrs.get("http-equiv") == "Content-Security-Policy")
    assert "default-src 'none'" in csp  # the browser itself refuses any fetch
    assert not re.search(r"url\((?!data:)", out.read_text())  # no stylesheet fetches either


def test_page_data_are_the_planners_numbers(planned, tmp_path):
    job, result = planned
    out = tmp_path / "r.html"
    assert main(["report", *PLAN, "--out", str(out)]) == 0
    data = json.loads(parse(out).data_json)["plan"]
    lay = data["layouts"]
    assert len(lay["rows"]) == len(result.ranked) == data["fit"]
    col = {c: i for i, c in enumerate(lay["columns"])}
    split = {id(e): i + 1 for i, e in enumerate(best_per_split(result.ranked))}
    for row, mem, time, est in zip(lay["rows"], lay["memory"], lay["time"], result.ranked):
        assert (row[col["dp"]], row[col["tp"]], row[col["pp"]], row[col["vpp"]], row[col["mb"]], row[col["zero"]],
                row[col["recompute"]]) == (est.layout.dp, est.layout.tp, est.layout.pp, est.layout.vpp,
                                           est.layout.micro_batch, est.layout.zero,
                                           est.layout.recompute + (f":{est.layout.recompute_layers}"
                                                                   if est.layout.recompute_layers else ""))
        # full recompute of some layers is told apart from all (full:N, as plan's table), ring CP from all-gather
        assert row[col["cp_mode"]] == (est.layout.cp_mode if est.layout.cp > 1 else "-")
        # The stacked parts add up to the planner's totals (each rounded to 5 significant digits).
        assert sum(mem) == pytest.approx(est.memory_per_gpu / GIB, rel=1e-4)
        assert sum(time) == pytest.approx(est.step_time, rel=1e-4)
        assert row[col["mem_gib"]] == pytest.approx(est.memory_per_gpu / GIB, rel=1e-4)
        assert row[col["split_rank"]] == split.get(id(est))  # plan's row number, for the best of each split
        # shown to 0.1 % as plan shows it: stored at 4 digits it was rounded twice (41.45 % -> 0.4145 -> 41.4 %)
        assert f"{100 * row[col['mfu']]:.1f}" == f"{100 * est.mfu:.1f}"
    assert [k for k, *_ in lay["memory_keys"]] == list(result.ranked[0].memory_bytes)
    assert [k for k, *_ in lay["time_keys"]] == list(result.ranked[0].time_s)
    assert data["explanation"] and data["explanation"][0].startswith("Fit: M_model")
    assert "bf16" in data["assumptions"] and "no torch.compile" in data["assumptions"]  # what the numbers assume
    # torchtitan's FP8 compiles unless told not to (commands.common.COMPILE_IMPLIED): the page says both
    assert main(["report", *PLAN, "--precision", "fp8", "--out", str(out)]) == 0
    said = " ".join(json.loads(parse(out).data_json)["plan"]["assumptions"])
    assert "torchao" in said and "blocks and loss under torch.compile" in said


def test_timeline_is_the_simulated_schedule_and_matches_the_planners_closed_form(planned, tmp_path):
    """The winner's timeline is simulated (schedules.simulate) with each rank's own costs; the closed form the planner
    times (closed_forms.uneven_makespan) bounds its span from above, within 2 % (the head's stage costs more)."""
    job, result = planned
    out = tmp_path / "r.html"
    assert main(["report", *PLAN, "--pp", "4", "--out", str(out)]) == 0
    plan = json.loads(parse(out).data_json)["plan"]
    t, win = plan["timeline"], plan["winner"]
    assert (t["pp"], t["vpp"], t["m"], t["schedule"]) == (win["pp"], win["vpp"], win["num_microbatches"], win["schedule"])
    span = sum(win["time_breakdown_s"][k] for k in ("compute", "recompute", "tp_comm", "pp_p2p", "pipeline_bubble"))
    assert span * 0.98 <= t["makespan_s"] <= span * (1 + 1e-6)
    assert len(set(t["duration_s"]["F"])) > 1  # the ranks' own costs, not the slowest's everywhere
    # the page's bubble is the busiest rank's idle share, the planner's pipeline_bubble over its span (within the
    # closed form's bound)
    assert t["bubble_fraction"] == pytest.approx(win["time_breakdown_s"]["pipeline_bubble"] / span, abs=0.02)
    # Every rank runs every micro-batch's forward once per chunk; ends follow from the encoded gaps and durations.
    for r, rank in enumerate(t["ranks"]):
        assert rank["kind"].count("F") == t["m"] * t["vpp"]
        end = 0.0
        for kind, chunk, gap in zip(rank["kind"], rank["chunk"], rank["gap"]):
            end += gap + t["duration_s"][kind][chunk * t["pp"] + r]
        assert end <= t["makespan_s"] * (1 + 1e-9)


def test_validate_only_report_and_both(tmp_path, capsys):
    result = tmp_path / "v.json"
    result.write_text(json.dumps(validate_result()))
    out = tmp_path / "v.html"
    assert main(["report", "--validate", str(result), "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["layouts"] == 0 and printed["validate"]["kendall_tau"] == 0.8
    data = json.loads(parse(out).data_json)
    assert data["plan"] is None and len(data["validate"]["layouts"]) == 6
    both = tmp_path / "b.html"
    capsys.readouterr()
    assert main(["report", *PLAN, "--validate", str(result), "--out", str(both)]) == 0
    data = json.loads(parse(both).data_json)
    assert data["plan"] is not None and data["validate"] is not None
    # the tiny model's sweep on 2 ranks beside another model's plan: said, not silently combined
    assert "note: the validate run is tiny on 2 ranks and the plan" in capsys.readouterr().err
    assert any("describe different jobs" in w for w in data["validate"]["warnings"])  # and on the page (helper-229)


def test_plan_html_writes_the_same_page(tmp_path, capsys):
    out = tmp_path / "p.html"
    assert main(["plan", *PLAN, "--html", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["html"]["path"] == str(out) and printed["html"]["bytes"] == len(out.read_bytes())
    assert json.loads(parse(out).data_json)["plan"]["winner"]["describe"]


@pytest.mark.parametrize("argv, words", [
    (["--model", "llama3-8b"], "--cluster"),
    ([], "nothing to report"),
    (["--validate", "missing.json"], "missing.json"),
    (["--validate", "bad.json"], "malformed JSON"),
    (["--validate", "other.json"], "not a validate result"),
    (["--validate", "no-machine.json"], "its 'machine' is null, not an object"),  # was a traceback
    (["--validate", "word-world.json"], "its 'world' is \"two\", not a whole number"),
])
def test_report_mistakes_are_one_line_exit_2(argv, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "other.json").write_text('{"best": {}}')
    layout = {"name": "dp2", "predicted_step_time_s": 0.01, "measured_step_time_s": 0.01, "predicted_memory_bytes": 1,
              "measured_memory_bytes": 1}
    (tmp_path / "no-machine.json").write_text(json.dumps({"layouts": [layout], "machine": None}))
    (tmp_path / "word-world.json").write_text(json.dumps({"layouts": [layout], "world": "two"}))
    assert main(["report", *argv, "--out", "r.html"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err
    assert not (tmp_path / "r.html").exists()


def test_every_step_term_of_an_offloaded_moe_plan_has_its_own_label_and_colour(tmp_path):
    """The page names each part of the step: an offloaded mixture of experts has the EP all-to-all and the host side
    of the optimizer, which once fell to an unlabelled grey."""
    from shardwise.report.data import TIME_LABELS

    out = tmp_path / "moe.html"
    assert main(["report", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-80gb", "--gpus", "16", "--global-batch",
                 "64", "--seq-len", "4096", "--framework", "megatron-core", "--offload", "optimizer", "--tp", "2",
                 "--out", str(out)]) == 0
    keys = json.loads(parse(out).data_json)["plan"]["layouts"]["time_keys"]
    assert {"ep_comm", "offload"} <= {k for k, *_ in keys}
    assert all(k in TIME_LABELS and colour != "#666666" for k, _, colour in keys)


def test_no_two_rows_of_the_table_read_the_same(tmp_path):
    # A long sequence's layouts differ by their context-parallel mode alone (ring against all-gather attention): the
    # page had shown such pairs as identical rows, and explain called the runner-up by the winner's own words.
    out = tmp_path / "cp.html"
    assert main(["report", "--model", "llama3.1-8b", "--cluster", "dgx-h100-80gb", "--gpus", "16", "--global-batch",
                 "16", "--seq-len", "32768", "--out", str(out)]) == 0
    data = json.loads(parse(out).data_json)
    lay = data["plan"]["layouts"]
    col = {c: i for i, c in enumerate(lay["columns"])}
    shown = [c for c in lay["columns"] if c not in ("mem_gib", "step_s", "tokens_per_s", "mfu", "split_rank")]
    rows = [tuple(row[col[c]] for c in shown) for row in lay["rows"]]
    assert any(row[col["cp"]] > 1 for row in lay["rows"]) and len(set(rows)) == len(rows)
    assert {row[col["cp_mode"]] for row in lay["rows"] if row[col["cp"]] > 1} == {"ring", "allgather"}


def test_a_pipeline_too_long_to_simulate_is_said_not_drawn(tmp_path):
    """A winner whose schedule has more actions than schedules.MAX_SIMULATED: the page says so in the timeline's place,
    where it had simulated every action (a global batch of a million sequences took 21 s and 1 GB; ten million, more
    than a minute)."""
    from shardwise.schedules import MAX_SIMULATED, action_count

    out = tmp_path / "r.html"
    assert main(["report", *PLAN[:4], "--global-batch", "1000000", "--seq-len", "1024", "--gpus", "8", "--pp", "2",
                 "--out", str(out)]) == 0
    plan = json.loads(parse(out).data_json)["plan"]
    win = plan["winner"]
    actions = action_count(win["schedule"], win["pp"], win["num_microbatches"], win["vpp"])
    assert actions > MAX_SIMULATED
    said = plan["timeline"]["omitted"]
    assert f"{win['num_microbatches']:,} micro-batches" in said
    # the factors said multiply to the count said (it had left out the chunks and the passes: helper-229)
    factors = re.search(r"has ([\d,]+) actions \((.*?)\)", said)
    numbers = [int(n.replace(",", "")) for n in re.findall(r"[\d,]+", factors.group(2))]
    assert int(factors.group(1).replace(",", "")) == actions == math.prod(numbers), said
