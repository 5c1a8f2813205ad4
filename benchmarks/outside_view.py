"""Every published dense run scored through the command line only, as an outside checker scores the planner.

For each scored dense row of benchmarks/data/published_runs.csv (read by published_runs.py) this builds what a
user who has only the row would type: a Hugging Face config.json of the model (or a shipped preset of the same
shape), the cluster preset of its GPU, the nearest of the six `--framework` names, the degrees, micro-batch,
interleaving depth, ZeRO stage, recompute, sequence parallelism and precision the row states. Knobs the row does
not state are left out, for `shardwise estimate` to fill in as the stack runs them. Where the row does not state
its micro-batch (estimate needs one), `shardwise plan` narrowed to the row's degrees and stated knobs runs instead
("plan" in the `path` column), and that plan's best layout is the prediction. Otherwise `shardwise estimate ...
--json`. Both run in-process through the command's own entry point (shardwise.cli.main with the same argv;
--subprocess runs `python -m shardwise` for each instead).

Each row prints the published step time, the command line's prediction and the one published_runs.py
--six-profiles makes (which may set what no flag can), their errors (predicted throughput / published - 1), the
difference in points, and whether the layout fits; rows that differ by more than DIFF_POINTS, or do not fit, list
what differs (the model read from config.json, the cluster preset, the knobs the command filled in).

    python benchmarks/outside_view.py [--csv PATH] [--json] [--subprocess] [--only TEXT]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import published_runs as pr

from shardwise.errors import UsageError
from shardwise.forked import map_pieces, worker_count
from shardwise.model_spec import load_model, model_presets
from shardwise.specs import load_cluster
from shardwise.validate.stats import kendall_tau, widest_discordant_gap

DIFF_POINTS = 0.02  # command line vs internal view: rows further apart than this are explained
# ModelSpec fields a config.json carries that the step time and memory depend on (name and positions do not).
SHAPE = ("family", "hidden", "ffn_hidden", "num_layers", "num_heads", "num_kv_heads", "vocab_size", "head_dim",
         "tie_embeddings", "gated_mlp", "trains_with_dropout", "attention")
# Layout knobs the command fills in when not given (planner/estimate.complete_layout), compared with the internal view.
KNOBS = ("micro_batch", "vpp", "schedule", "zero", "recompute", "recompute_layers", "sequence_parallel", "cp_mode",
         "dp_shard")


def _stated(cell: str, certain_only: bool) -> bool:
    """A cell that states a value, not 'NR' or empty; one the row marks uncertain ('?') only unless `certain_only`
    (--certain-only: then the command line fills it in)."""
    c = cell.split("(")[0].strip()
    return bool(c) and not c.startswith(("NR", "n/a")) and not (certain_only and "?" in c)


def _shape(spec) -> dict:
    return {k: getattr(spec, k) for k in SHAPE}


def model_ref(row: dict, folder: Path) -> tuple[str, str]:
    """What --model names for the row: a preset of the same shape, else a config.json written from the row's
    columns (ModelSpec.to_hf_config of the parsed architecture); and a word saying which."""
    spec = pr._model(row)
    for name in model_presets():
        preset = load_model(name)
        # A preset's positions are no limit on the sequence (docs/planner.md, context parallelism): an outsider names
        # llama2-7b for NeMo's 32K-token runs, and a learned table is sized to the sequence (make_job).
        if _shape(preset) == _shape(spec):
            return name, "preset"
    path = folder / f"{abs(hash(row['run'])):x}" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec.to_hf_config(), indent=1))
    return str(path), "config.json"


def outsider_argv(row: dict, run: pr.Run, folder: Path, certain_only: bool) -> tuple[list[str], bool, list[str]]:
    """`estimate` arguments from the row's stated fields; whether the micro-batch must come from `plan`; and the
    stated knobs given (for the listing)."""
    model, how = model_ref(row, folder)
    lay, train = run.layout, run.job.train
    argv = ["--model", model, "--cluster", pr.cluster_preset(row["gpu_type"]), "--framework", run.framework,
            "--gpus", str(pr._int(row["gpus"])), "--global-batch", str(train.global_batch), "--seq-len", str(train.seq_len),
            "--tp", str(lay.tp), "--pp", str(lay.pp)]
    if lay.cp > 1 or _stated(row["cp"], certain_only):  # a stated CP 1 too: plan would otherwise weigh CP
        argv += ["--cp", str(lay.cp)] + (["--cp-mode", "allgather"] if "CP uses all-gather" in row["notes"] else [])
    vpp = row["vpp_interleave"]
    if pr._depth_unreported(row):
        argv += ["--schedule", "interleaved-1f1b"]
    elif _stated(vpp, certain_only) and lay.pp > 1:  # a stated depth, or plain 1F1B ("no", "1")
        depth = pr._int(vpp.split(" / ")[-1]) or 1
        argv += ["--vpp", str(depth)] if depth > 1 else ["--schedule", "1f1b"]
    elif vpp.strip().startswith("n/a") and lay.pp > 1:  # no virtual stages in that run (nanotron, a recipe without)
        argv += ["--schedule", "1f1b"]
    if _stated(row["zero_stage"], certain_only):
        argv += ["--zero", str(pr._zero(row["zero_stage"]))]
    if lay.dp_shard:
        argv += ["--dp-shard", str(lay.dp_shard)]
    if _stated(row["recompute"], certain_only):
        argv += ["--recompute", lay.recompute] + (["--recompute-layers", str(lay.recompute_layers)]
                                                  if lay.recompute_layers else [])
    if pr.stated_sequence_parallel(row) and lay.tp > 1:
        argv += ["--sequence-parallel"]
    elif pr.stated_no_sequence_parallel(row) and lay.tp > 1:
        argv += ["--no-sequence-parallel"]
    overlap = pr.stated_tp_comm_overlap(row)
    if overlap is not None and pr.FRAMEWORKS[run.framework].tp_comm_overlap_available and lay.tp > 1:
        argv += ["--tp-comm-overlap" if overlap else "--no-tp-comm-overlap"]
    if pr.pre_flash(row):
        argv += ["--no-flash-attention"]
    elif pr.stated_flash(row):
        argv += ["--flash-attention"]
    if run.job.precision == "fp8":
        argv += ["--precision", "fp8"] + (["--fp8-params"] if pr.stated_fp8_params(row) else [])
    plan = not _stated(row["micro_batch"], certain_only)
    if not plan:
        argv += ["--micro-batch", str(pr._int(row["micro_batch"]))]
    return argv, plan, [how]


def shardwise(argv: list[str], in_process: bool) -> tuple[int, str, str]:
    """Run the command line: exit code, stdout, stderr."""
    if not in_process:
        done = subprocess.run([sys.executable, "-m", "shardwise", *argv], capture_output=True, text=True, check=False)
        return done.returncode, done.stdout, done.stderr
    from shardwise.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


# estimate's flags as `plan` narrows its search to the same value (a list of one); None: plan has no such knob.
PLAN_FLAG = {"--vpp": "--max-vpp", "--schedule": "--schedules", "--cp-mode": "--cp-modes", "--dp-shard": None,
             "--recompute-layers": None}


def plan_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """`shardwise plan` over the row's degrees and stated knobs (the estimate arguments `argv`, each as plan
    spells it), and the stated knobs plan cannot narrow."""
    planned, dropped, i = ["plan", "--json", "--top", "1"], [], 0
    while i < len(argv):
        flag = argv[i]
        takes = i + 1 < len(argv) and not argv[i + 1].startswith("--")
        name = PLAN_FLAG.get(flag, flag)
        if name is None:
            dropped.append(" ".join(argv[i:i + 1 + takes]))
        else:
            planned += [name, *argv[i + 1:i + 1 + takes]]
        if flag == "--vpp":
            planned += ["--schedules", "interleaved-1f1b"]
        i += 1 + takes
    return planned, dropped


def score_row(row: dict, folder: Path, in_process: bool, certain_only: bool = False,
              as_eager: bool = False) -> dict | None:
    """One dense row through the command line and through published_runs.py --six-profiles; None when the
    internal view does not score it (skipped, mixture of experts). A torch.compile run passes --compile (and
    --no-compile-loss where its release compiled the blocks only), or with `as_eager` not (a checker who passes only
    the row's layout); a release whose preset fused its norms passes --fused-norms, a run that told Transformer Engine
    to use flash-attn --attention-backend flash."""
    run = pr.parse(row, six_profiles=True, as_eager=as_eager)
    if run.skip or run.job.model.is_moe:
        return None
    internal = pr._predict(run)
    argv, plan, how = outsider_argv(row, run, folder, certain_only)
    argv += software_flags(run.job, pr.ran_compiled(row) and not as_eager)
    out = {"run": run.name, "series": run.series, "framework": run.framework, "weak": run.weak,
           "path": "plan" if plan else "estimate", "model_from": how[0], "published_step_s": run.published_step_s,
           "internal_step_s": internal.step_time, "internal_error": run.published_step_s / internal.step_time - 1,
           "published_tokens_per_s_per_gpu": run.job.train.global_batch * run.job.train.seq_len
           / run.published_step_s / pr._int(row["gpus"]),
           "internal_tokens_per_s_per_gpu": internal.tokens_per_s / pr._int(row["gpus"])}
    # No micro-batch stated: plan's best over the row's degrees and stated knobs is the prediction.
    out["argv"], dropped = plan_argv(argv) if plan else (["estimate", *argv, "--json"], [])
    code, stdout, stderr = shardwise(out["argv"], in_process)
    if code:
        return out | {"cli_error": stderr.strip()}
    est = json.loads(stdout)["best"] if plan else json.loads(stdout)
    out |= {"cli_step_s": est["step_time_s"], "cli_error_pct": None, "fits": est["fits"],
            "cli_tokens_per_s_per_gpu": est["tokens_per_s"] / pr._int(row["gpus"]),
            "cli_layout": {k: est[k] for k in KNOBS},
            "memory_share": est["memory_gib_per_gpu"] / est["gpu_memory_gib"]}
    out["cli_error_pct"] = run.published_step_s / est["step_time_s"] - 1
    out["difference"] = out["cli_error_pct"] - out["internal_error"]
    out["why"] = differences(row, run, est, argv) + [f"stated, but plan has no flag for it: {d}" for d in dropped]
    return out


def score_rows(csv_rows: list[dict], folder: Path, in_process: bool, certain_only: bool = False,
               as_eager: bool = False, progress: bool = False, workers: int | None = None) -> list[dict]:
    """score_row of every row the internal view scores, in order, over `workers` forked processes (None: one per
    core, forked.worker_count); a row whose config cannot be written as a config.json keeps the one-line reason.
    `progress`: each process writes the row it is at to stderr."""
    def one(piece: tuple[int, dict]) -> dict | None:
        i, row = piece
        if progress:
            print(f"\r{i}/{len(csv_rows)} {row['run'][:60]:60}", end="", file=sys.stderr, flush=True)
        try:
            return score_row(row, folder, in_process, certain_only, as_eager)
        except UsageError as exc:  # the row's own config cannot be written as a config.json
            return {"run": row["run"], "cli_error": str(exc), "weak": False, "path": "", "framework": ""}

    pieces = list(enumerate(csv_rows, 1))
    n = worker_count(workers, len(pieces), PARALLEL_ROWS)
    scored = [r for r in map_pieces(one, pieces, [1] * len(pieces), n) if r]
    if progress:
        print(file=sys.stderr)
    return scored


# Rows above which score_rows forks (a row takes ~20 ms through the command line in process; a fork ~50 ms).
PARALLEL_ROWS = 40


def differences(row: dict, run: pr.Run, est: dict, argv: list[str]) -> list[str]:
    """What the command line's job differs in from the internal view's: model, cluster, filled-in knobs, software."""
    why = []
    model = load_model(argv[argv.index("--model") + 1])
    for k, v in _shape(run.job.model).items():
        if _shape(model)[k] != v:
            why.append(f"model {k}: config.json {_shape(model)[k]}, row {v}")
    preset, stated = load_cluster(argv[argv.index("--cluster") + 1]), run.job.cluster
    for k in ("inter_node_bandwidth", "gpu_memory_bytes"):
        if getattr(preset, k) != getattr(stated, k):
            why.append(f"cluster {k}: preset {getattr(preset, k) / 1e9:g} GB(/s), row states {getattr(stated, k) / 1e9:g}")
    lay = run.layout.record()
    for k in KNOBS:
        if est[k] != lay[k]:
            why.append(f"{k}: command line {est[k]}, internal {lay[k]}")
    return why


def software_flags(job, compiled: bool) -> list[str]:
    """What the row's release ran that the command line states by flag: torch.compile where the row says so
    (`compiled`; the command line compiles torchao's Float8 unasked), a loss left out of it, a preset's fused norms,
    Transformer Engine told to run flash-attn (NVTE_FUSED_ATTN=0)."""
    return ((["--compile"] if compiled else []) + (["--no-compile-loss"] if job.compile and not job.compile_loss else [])
            + (["--fused-norms"] if job.fused_norms else [])
            + (["--attention-backend", "flash"] if job.attention == "fa2" else []))


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


# Bins of the predicted memory per GPU over the GPU's usable memory (by_memory_share); from 1.0 on, it does not fit.
MEMORY_SHARE_BINS = (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0)


def by_memory_share(rows: list[dict]) -> list[dict]:
    """The signed and absolute median error of the rows by how full the planner says each one's GPUs are: whether
    layouts near the memory limit run slower than predicted (the caching allocator's cudaMalloc retries, which a
    run at the limit pays and the planner does not price) shows as a signed median that grows in the top bins."""
    out = []
    for lo, hi in zip(MEMORY_SHARE_BINS, (*MEMORY_SHARE_BINS[1:], float("inf"))):
        errors = [r["cli_error_pct"] for r in rows if lo <= r["memory_share"] < hi]
        if errors:
            out.append({"from": lo, "to": hi if hi != float("inf") else None, "rows": len(errors),
                        "median_error": statistics.median(errors),
                        "median_abs_error": statistics.median(abs(e) for e in errors)})
    return out


def summary(rows: list[dict]) -> dict:
    """Median / max |error| of the strong rows both ways, which do not fit, and Kendall tau per one-knob series."""
    strong = [r for r in rows if not r["weak"]]
    cli = [r for r in strong if "cli_step_s" in r]
    series = {}
    for name in sorted({r["series"] for r in cli if r["series"]}):
        members = [r for r in cli if r["series"] == name]
        if len(members) >= 2:
            pub = [r["published_tokens_per_s_per_gpu"] for r in members]
            series[name] = {"rows": len(members),
                            "cli": kendall_tau(pub, [r["cli_tokens_per_s_per_gpu"] for r in members]),
                            "internal": kendall_tau(pub, [r["internal_tokens_per_s_per_gpu"] for r in members]),
                            "cli_widest_discordant_gap": widest_discordant_gap(pub, [r["cli_tokens_per_s_per_gpu"]
                                                                                     for r in members])}
    return {"rows": len(strong), "cli_failed": [r["run"] for r in strong if "cli_error" in r],
            "cli_median_abs_error": _median([abs(r["cli_error_pct"]) for r in cli]),
            "cli_max_abs_error": max((abs(r["cli_error_pct"]) for r in cli), default=None),
            "internal_median_abs_error": _median([abs(r["internal_error"]) for r in strong]),
            "internal_max_abs_error": max((abs(r["internal_error"]) for r in strong), default=None),
            "not_fitting": [r["run"] for r in cli if not r["fits"]],
            "micro_batch_from_plan": [r["run"] for r in strong if r["path"] == "plan"],
            "apart": [r["run"] for r in cli if abs(r["difference"]) > DIFF_POINTS],
            "kendall_tau_by_series": series, "by_memory_share": by_memory_share(cli)}


def print_table(rows: list[dict], s: dict) -> None:
    print(f"{'run':52} {'framework':13} {'path':8} {'publ s':>8} {'cli s':>8} {'int s':>8} {'cli err':>8} "
          f"{'int err':>8} {'diff':>6} fits")
    for r in rows:
        weak = " (weak: not in summary)" if r["weak"] else ""
        if "cli_error" in r:
            print(f"{r['run'][:52]:52} {r['framework']:13} {r['path']:8} command line refused: {r['cli_error']}{weak}")
            continue
        print(f"{r['run'][:52]:52} {r['framework']:13} {r['path']:8} {r['published_step_s']:8.3f} {r['cli_step_s']:8.3f} "
              f"{r['internal_step_s']:8.3f} {r['cli_error_pct']:+8.1%} {r['internal_error']:+8.1%} "
              f"{r['difference'] * 100:+6.1f} {'yes' if r['fits'] else 'NO'}{weak}")
        if abs(r["difference"]) > DIFF_POINTS or not r["fits"]:
            for why in r["why"] or ["(nothing the listing compares)"]:
                print(f"{'':10}{why}")
    if s["rows"]:
        print(f"\n{s['rows']} strong dense rows through the command line: median |error| {s['cli_median_abs_error']:.1%}, "
              f"max {s['cli_max_abs_error']:.1%}; internal (--six-profiles) {s['internal_median_abs_error']:.1%} / "
              f"{s['internal_max_abs_error']:.1%}")
    else:  # every selected row weak or refused (e.g. --only AWS): nothing to summarise
        print("\nno strong dense row in the summary")
    print(f"predicted not to fit: {len(s['not_fitting'])}" + (f" ({'; '.join(s['not_fitting'])})" if s["not_fitting"] else ""))
    print(f"refused by the command line: {len(s['cli_failed'])}" + (f" ({'; '.join(s['cli_failed'])})" if s["cli_failed"] else ""))
    print(f"micro-batch not stated, so `shardwise plan`'s best over the row's degrees and stated knobs: "
          f"{len(s['micro_batch_from_plan'])} rows")
    print(f"command line and internal view more than {DIFF_POINTS:.0%} apart: {len(s['apart'])} rows")
    print("by predicted memory over the GPU's (+: the planner too fast):")
    for b in s["by_memory_share"]:
        span = f"{b['from']:.2f}-{b['to']:.2f}" if b["to"] is not None else f">= {b['from']:.2f} (does not fit)"
        print(f"  {span:22} {b['rows']:4} rows  median {b['median_error']:+.1%}, median |error| {b['median_abs_error']:.1%}")
    taus = s["kendall_tau_by_series"].values()
    print(f"Kendall tau >= 0.8 on {sum(v['cli'] >= 0.8 for v in taus)} of {len(taus)} one-knob series through the command "
          f"line, {sum(v['internal'] >= 0.8 for v in taus)} internal; per series (command line / internal):")
    for name, v in s["kendall_tau_by_series"].items():
        print(f"  {name:45} {v['rows']:2} rows  tau {v['cli']:+.2f} / {v['internal']:+.2f}"
              f"{pr.discordant_note(v['cli_widest_discordant_gap'])}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=pr.DEFAULT_CSV, help="published_runs.csv")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--subprocess", action="store_true", help="run `python -m shardwise` per call (slower; the same)")
    ap.add_argument("--only", default="", metavar="TEXT", help="only rows whose name contains TEXT")
    ap.add_argument("--certain-only", action="store_true",
                    help="leave out what a row marks uncertain ('?'): the command line's defaults fill it in")
    ap.add_argument("--as-eager", "--compiled", dest="as_eager", action="store_true",
                    help="score the runs built with torch.compile without --compile (as if eager), as a checker who "
                         "passes only the row's layout does")
    args = ap.parse_args(argv)
    csv_rows = [r for r in pr.read_rows(args.csv) if args.only in r["run"]]
    with tempfile.TemporaryDirectory() as folder:
        rows = score_rows(csv_rows, Path(folder), not args.subprocess, args.certain_only, args.as_eager, progress=True)
    s = summary(rows)
    if args.json:
        print(json.dumps({"rows": rows, "summary": s}, indent=1, default=str))
    else:
        print_table(rows, s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
