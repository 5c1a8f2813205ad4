"""Regenerate every figure in README.md that the code computes, or check that none has drifted.

    python benchmarks/readme_figures.py            # rewrite the generated blocks of README.md
    python benchmarks/readme_figures.py --check    # exit 1 naming the blocks that differ (tests/test_readme_figures.py)

A generated block sits between `<!-- generated: NAME -->` and `<!-- /generated: NAME -->`; everything between the
markers is produced here from the code and the shipped data (the plan and explain outputs of the README's
command, the model presets, the published-runs comparison on benchmarks/data/published_runs.csv, the schedule
table from the simulator). Figures that depend on this machine's speed (benchmarks, calibrate/validate, the
resume transcript) are not regenerated: the README marks them as measured, with the command that measured them.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import io
import os
import re
import statistics
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DATA = ROOT / "benchmarks" / "data" / "published_runs.csv"
PLAN = ["--model", "llama-65b", "--cluster", "dgx-a100-80gb", "--gpus", "64", "--global-batch", "1024",
        "--seq-len", "2048"]
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /generated: (?P=name) -->)", re.S)


def _cli(argv: list[str], columns: int) -> str:
    """What `shardwise ARGV` prints in a terminal `columns` wide (no colours)."""
    from shardwise.cli import main

    out, old = io.StringIO(), os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)
    try:
        with contextlib.redirect_stdout(out):
            code = main(argv)
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    if code:
        raise SystemExit(f"readme_figures: `shardwise {' '.join(argv)}` failed with exit code {code}")
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


def plan() -> str:
    command = " ".join(["shardwise plan", *PLAN, "--top", "5"])
    return f"```bash\n{command}\n```\n\n```\n{_cli(['plan', *PLAN, '--top', '5'], 124)}\n```\n"


def explain() -> str:
    return f"```\n$ shardwise explain {' '.join(PLAN)}\n{_cli(['explain', *PLAN], 120)}\n```\n"


def models() -> str:
    from shardwise.specs import MODEL_TYPES, model_presets

    names = ", ".join(f"`{n}`" for n in model_presets())
    types = ", ".join(f"`{t}`" for t in sorted(MODEL_TYPES))
    text = (f"- Models: a preset ({names}) or any Hugging Face `config.json` whose `model_type` shardwise models "
            f"({types}; any other is refused by name), each read from its own keys. Parameter counts equal the real "
            f"models' exactly (tested against `transformers` and the authors' figures); `train` builds Llama, GPT-2 and "
            f"Mixtral blocks and names what else it does not.")
    return "\n".join(textwrap.wrap(text, 110, subsequent_indent="  ", break_on_hyphens=False)) + "\n"


def limits() -> str:
    from shardwise.commands.simulate import MAX_SIMULATED
    from shardwise.planner.search import MAX_CANDIDATES, MAX_GPUS, MOE_COST
    from shardwise.specs import MAX_LAYERS, TrainSpec

    text = (f"- Bounded answers: `plan`, `estimate`, `explain` and `simulate` answer within seconds or refuse in one "
            f"line: at most {MAX_GPUS:,} GPUs, {TrainSpec.MAX:,} sequences of {TrainSpec.MAX:,} tokens and "
            f"{MAX_LAYERS:,} layers; a search takes at most {MAX_CANDIDATES:,} candidate layouts ({MAX_CANDIDATES // MOE_COST:,} "
            f"for mixture-of-experts models), each a split, micro-batch, schedule, virtual-stage count and SP setting "
            f"whose ZeRO stages and recompute policies it then scores (plan's `scored` counts those). Beyond, it narrows itself step by step (virtual stages that split the "
            f"layers evenly, at most 4 of them, micro-batches of 1-8 sequences, expert parallelism of 8 or more, then "
            f"1-2 sequences and 2 virtual stages, then power-of-two tp and pp) and says so under the table, or refuses "
            f"with the flags that narrow it; `simulate` answers with the closed forms beyond {MAX_SIMULATED:,} actions (equal to the simulator for uniform costs).")
    return "\n".join(textwrap.wrap(text, 110, subsequent_indent="  ", break_on_hyphens=False)) + "\n"


def constants() -> str:
    """The planner's constants taken from training runs, as the code ships them (planner/kernels.py, planner/moe.py)."""
    from shardwise.planner.kernels import IN_SITU_EFFICIENCY
    from shardwise.planner.moe import MOE_LAYER_HOST_S, MOE_LAYER_OVERHEAD_S

    words = {"ampere": "A100", "hopper": "H100", "hopper-fp8": "H100 FP8 jobs"}
    shares = ", ".join(f"{words.get(arch, arch)} {share:.2f}" for arch, share in IN_SITU_EFFICIENCY.items())
    text = (f"- Three constants come from training runs, each checked leave-one-source-out below: the share of the "
            f"benchmark rates a full training step sustains (by GPU: {shares}) and, for mixtures of experts, a MoE "
            f"layer's fixed cost per micro-batch ({1e3 * MOE_LAYER_OVERHEAD_S:.1f} ms) and the host's time per MoE "
            f"layer ({1e3 * MOE_LAYER_HOST_S:.1f} ms).")
    return "\n".join(textwrap.wrap(text, 110, subsequent_indent="  ", break_on_hyphens=False)) + "\n"


def long_context() -> str:
    """Llama 3 405B's published 128K stage (Llama Team 2024, Table 4: tp 8, cp 16, pp 16, dp 8 on 16,384 H100s,
    128 sequences, 38 % MFU) under the `llama3` profile, and the planner's best for that job (as
    tests/test_planner_cp.py scores them)."""
    from shardwise.planner.job import make_job
    from shardwise.planner.search import SearchSpace, search
    from shardwise.specs import load_cluster, load_model

    job = make_job(load_model("llama3.1-405b"), load_cluster("dgx-h100-80gb"), 128, 131072, "llama3")
    pub = next(e for e in search(job, 16384, SearchSpace(tp=(8,), pp=(16,), cp=(16,))).ranked if e.layout.dp == 8)
    best = search(job, 16384).ranked[0]
    text = ("- Long context: when one sequence's activations no longer fit, the fourth split is the sequence itself. "
            "`shardwise plan --model llama3.1-70b --cluster dgx-h100-80gb --gpus 64 --global-batch 8 --seq-len 131072 "
            "--explain` splits it over cp ranks and says why (the activations one unsplit sequence would keep), what it "
            "costs (the K/V traffic per layer: ring hops hidden behind the attention, or an exposed all-gather) and "
            "whether cp · tp still fits a node. Llama 3 405B's published 128K stage (tp 8 · cp 16 · pp 16 · dp 8, "
            f"16,384 H100s, 38 % MFU) is predicted to {'fit' if pub.fits else 'NOT fit'} at {100 * pub.mfu:.1f} % MFU "
            f"(`--framework llama3`), and the best plan for that job is {100 * (pub.step_time / best.step_time - 1):.1f} "
            "% faster (docs/planner.md).")
    return "\n".join(textwrap.wrap(text, 110, subsequent_indent="  ", break_on_hyphens=False)) + "\n"


def _published_module():
    spec = importlib.util.spec_from_file_location("published_runs", ROOT / "benchmarks" / "published_runs.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _percent(values: list[float]) -> str:
    return f"{100 * statistics.median(values):.1f} %"


@functools.cache
def _comparison() -> tuple:
    """benchmarks/published_runs.py's (module, rows, summary) on the shipped data, computed once per run."""
    mod = _published_module()
    return (mod, *mod.compare(DATA))


def _wrap(text: str) -> str:
    """A generated paragraph, wrapped as the README's prose is; a figure keeps its unit on its line."""
    lines = textwrap.wrap(text.replace(" %", "\0%"), 115, break_on_hyphens=False)
    return "\n".join(line.replace("\0", " ") for line in lines) + "\n"


def published() -> str:
    """Per source: rows, frameworks, median and max |error|, the leave-one-source-out figures, how many fit
    (benchmarks/published_runs.py --markdown)."""
    mod, rows, summary = _comparison()
    weak = sum(1 for r in rows if r.get("weak"))
    skipped = sum(1 for r in rows if "skip" in r)
    moe = summary["moe"]
    return (mod.markdown(rows, summary) + f"\n\n{len(rows) + len(moe['runs'])} rows in the file: {summary['rows']} scored, "
            f"{weak} weak evidence (a `?` on their throughput, or a `Weak:` note saying why: printed but not scored), "
            f"{len(moe['runs'])} mixtures of "
            f"experts scored apart ({moe['rows']} strong: median |error| {100 * moe['median_abs_error']:.1f} %, max "
            f"{100 * moe['max_abs_error']:.1f} %; see below), {skipped} skipped with the reason the script prints ("
            f"{_skip_kinds(rows)}).\n")


SKIP_KINDS = (("MLA", "MLA's recompute"), ("row-wise", "torchao's row-wise FP8 scaling"),
              ("not a valid layout", "a layout the planner refuses"), ("profile:", "a layout the stack cannot run"))


def _skip_kinds(rows: list[dict]) -> str:
    """The kinds of reason the skipped rows print, as the README names them."""
    reasons = [r["skip"] for r in rows if "skip" in r]
    kinds = [name for key, name in SKIP_KINDS if any(key in why for why in reasons)]
    return ", ".join(kinds) if kinds else "none"


ARCH_WORDS = {"ampere": "A100", "hopper": "H100 BF16", "hopper-fp8": "H100 FP8"}


def published_loso() -> str:
    """The leave-one-source-out median against the plain one (the in-situ share is fitted with every source weighing
    the same; which source moves it most when left out), and how the one-knob series rank (Kendall tau)."""
    _, _, summary = _comparison()
    plain, loso = summary["median_abs_error"], summary["leave_one_source_out"]["median_abs_error"]
    everywhere = summary["in_situ_efficiency"]["fitted_on_all_rows"]
    shift, source, arch = max((abs(by["fitted_without"][a] - everywhere[a]), name, a)
                              for name, by in summary["leave_one_source_out"]["by_source"].items() for a in everywhere)
    without = summary["leave_one_source_out"]["by_source"][source]
    series = {name: s["kendall_tau"] for name, s in summary["kendall_tau_by_series"].items() if s["rows"] >= 3}
    low = sorted((tau, name) for name, tau in series.items() if tau < 0.8)
    exceptions = ("" if not low else "; below it: " + ", ".join(f"`{name}` ({tau:+.2f})" for tau, name in low))
    # compared as printed: two medians that print alike are the same figure to the reader
    relation = ("the same as" if f"{loso:.3f}" == f"{plain:.3f}" else "above" if loso > plain else "below")
    return _wrap(
        f"The leave-one-source-out median ({100 * loso:.1f} %) is {relation} the plain one ({100 * plain:.1f} %): the "
        f"share is fitted with every source weighing the same, whatever its rows, so no one source sets it; the one that "
        f"moves it most, {source}, takes the {ARCH_WORDS.get(arch, arch)} share from {everywhere[arch]:.3f} to "
        f"{without['fitted_without'][arch]:.3f} when left out, and its rows then come out "
        f"{100 * without['median_abs_error']:.1f} % off (median). Kendall τ is ≥ 0.8 on {len(series) - len(low)} of the "
        f"{len(series)} series of three or more rows that vary one knob, the flat weak-scaling series included (a "
        f"synchronous step waits for its slowest GPU, and the slowest of more GPUs is slower){exceptions}.")


MOE_SOURCES = {"NVIDIA/dgxc-benchmarking": "Grok-1 proxies on NeMo",
               "yanring/Megatron-MoE-ModelZoo": "Qwen3-235B-A22B on Megatron-Core",
               "NVIDIA-NeMo/Megatron-Bridge": "DeepSeek-V3, Qwen3 and GPT-OSS on Megatron-Bridge",
               "NVIDIA-NeMo/Automodel": "DeepSeek-V3, Kimi K2, Qwen3 and GPT-OSS on NeMo AutoModel"}


def published_moe() -> str:
    """The mixture-of-experts runs: per source, overall, the two constants fitted on them and their
    leave-one-source-out figures (benchmarks/published_runs.py, scored apart)."""
    _, _, summary = _comparison()
    moe = summary["moe"]
    by = moe["by_source"]
    order = [s for s in MOE_SOURCES if s in by] + sorted(set(by) - set(MOE_SOURCES))
    parts = [f"{MOE_SOURCES.get(s, s)} ({by[s]['rows']}{' rows, median' if i == 0 else ','} "
             f"{100 * by[s]['median_abs_error']:.1f} %)" for i, s in enumerate(order)]
    median, shipped = 100 * moe["median_abs_error"], moe["moe_constants_s"]["shipped"]
    weak = [r for r in moe["runs"] if r["weak"]]
    contradicted = sum(1 for r in weak if r["weak_reason"])
    fit = ("Every published MoE layout is predicted to fit" if not moe["not_fitting"] else
           f"{len(moe['not_fitting'])} published MoE layouts are predicted not to fit")
    return _wrap(
        f"Mixtures of experts are scored apart (the same script): {moe['rows']} runs — {', '.join(parts[:-1])} and "
        f"{parts[-1]} — **median |error| {median:.1f} %{', within the 10 % goal' if median <= 10 else ''}** (max "
        f"{100 * moe['max_abs_error']:.1f} %). Two constants come from these runs, a MoE layer's fixed cost per "
        f"micro-batch ({1e3 * shipped['MOE_LAYER_OVERHEAD_S']:.1f} ms: the router's and dispatcher's small kernels and "
        f"the host synchronisation of a dropless dispatch) and the host's time to issue a MoE layer's pass, below which "
        f"the pass does not go ({1e3 * shipped['MOE_LAYER_HOST_S']:.1f} ms); fitted without each source in turn they "
        f"score that source at a median of {100 * moe['leave_one_source_out']['median_abs_error']:.1f} % over all rows "
        f"(max {100 * moe['leave_one_source_out']['max_abs_error']:.1f} %). {fit}; {contradicted} rows their own source "
        f"contradicts and {len(weak) - contradicted} of weak evidence are printed with the reason but not scored.")


def published_stacks() -> str:
    """Each stack's record on each GPU, as `explain` and `estimate --json` report it (planner/published_check.json,
    which tests/test_planner_published.py keeps equal to the script's figures)."""
    from shardwise.planner.published_check import table as check_table

    table = check_table()
    cols = ("ampere", "hopper", "hopper-fp8")

    def cell(rec: dict | None) -> str:
        if not rec:
            return "—"
        return (f"{rec['rows']}: {100 * rec['median_abs_error']:.1f} % ({100 * rec['signed_median_error']:+.1f} %), "
                f"worst {100 * rec['max_abs_error']:.1f} %").replace("-0.0 %", "+0.0 %")  # a median that rounds to 0

    lines = ["| stack (`--framework`) | A100 | H100/H200 BF16 | H100/H200 FP8 |", "|---|---|---|---|"]
    for key, kind in (("by_stack", ""), ("moe_by_stack", " (mixtures of experts)")):
        for stack, by_gpu in table[key].items():
            lines.append(f"| `{stack}`{kind} | " + " | ".join(cell(by_gpu.get(c)) for c in cols) + " |")
    return _wrap("Each stack's record on each GPU (runs: median |error| (signed median; +: the planner too fast), "
                 "worst), what `explain` and `estimate --json` (`assumptions.checked_on_published_runs`) report for a "
                 "plan on that stack and GPU:") + "\n" + "\n".join(lines) + "\n"


def published_summary() -> str:
    """The dense published-runs figure the accuracy section quotes."""
    _, _, summary = _comparison()
    return _wrap(
        f"On datasheet GPU clusters the same planner is within {100 * summary['median_abs_error']:.1f} % (median; "
        f"{100 * summary['leave_one_source_out']['median_abs_error']:.1f} % leave-one-source-out) of "
        f"{summary['rows']} published dense runs (above).")


def schedules() -> str:
    from shardwise.schedules import Costs, build, simulate

    lines = ["| schedule (p=4, m=8, F=B=W) | bubble | peak activations in flight (rank 0) |", "|---|---|---|"]
    for label, name, v in (("GPipe", "gpipe", 1), ("1F1B", "1f1b", 1), ("interleaved 1F1B, v=2", "interleaved-1f1b", 2),
                           ("ZB-H1", "zb-h1", 1)):
        sim = simulate(build(name, 4, 8, v), Costs(1, 1, 1))
        lines.append(f"| {label} | {100 * sim.bubble_fraction:.1f} % | {sim.peak_inflight_per_rank[0]:g} |")
    return "\n".join(lines) + "\n"


def emit() -> str:
    """`plan --emit` for the README's plan: what each target's file holds and the layout it gets."""
    import json
    import tempfile

    what = {"megatron": ("a bash script: Megatron-LM / Megatron-Core arguments (`--tensor-model-parallel-size`, "
                         "`--pipeline-model-parallel-size`, `--num-layers-per-virtual-pipeline-stage` or "
                         "`--pipeline-model-parallel-layout`, `--sequence-parallel`, `--micro-batch-size`, "
                         "`--global-batch-size`, `--recompute-*`, `--use-distributed-optimizer` / Megatron-FSDP, overlap "
                         "flags) and the `torchrun` line",
                         "Megatron-LM's option table + megatron-core's config classes; Megatron-LM's own `validate_args` by hand"),
            "torchtitan": ("its TOML job config (`[parallelism]`, `[training]`, `[activation_checkpoint]`)",
                           "torchtitan's `ConfigManager`"),
            "deepspeed": ("its JSON config (ZeRO stage, micro-batch, accumulation, bf16, AutoTP, pipeline stages)",
                          "DeepSpeed's `DeepSpeedConfig`")}
    zero = {"megatron": {1: "distributed optimizer", 2: "Megatron-FSDP", 3: "Megatron-FSDP"},
            "torchtitan": {0: "DDP", 2: "FSDP", 3: "FSDP"}}
    lines = ["| `--emit` | writes | the plan above becomes | checked by (tests) |", "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for target, (writes, checked) in what.items():
            out = json.loads(_cli(["plan", *PLAN, "--emit", target, "--out", str(Path(tmp) / target), "--json"], 120))
            lay = out["emitted"]["layout"]
            split = (f"dp{lay['dp']}·tp{lay['tp']}·pp{lay['pp']}" + (f"·v{lay['vpp']}" if lay["vpp"] > 1 else "")
                     + f"·mb{lay['micro_batch']}")
            how = zero.get(target, {}).get(lay["zero"])
            knobs = [split, f"ZeRO-{lay['zero']}" + (f" ({how})" if how else "")]
            if lay["pp"] > 1:
                knobs.append(lay["schedule"])
            if lay["recompute"] != "none":
                knobs.append(f"{lay['recompute']} recompute")
            knobs.append(f"{lay['step_time_s']:.1f} s/step")
            lines.append(f"| `{target}` | {writes} | {', '.join(knobs)} | {checked} |")
    return "\n".join(lines) + "\n"


FIGURES = {"plan": plan, "explain": explain, "models": models, "limits": limits, "published": published,
           "published-loso": published_loso, "published-moe": published_moe, "published-summary": published_summary,
           "published-stacks": published_stacks,
           "schedules": schedules, "emit": emit, "long-context": long_context, "constants": constants}


def regenerate(text: str) -> tuple[str, list[str]]:
    """README text with every generated block rendered anew, and the names of the blocks that changed."""
    changed, seen = [], set()

    def render(match: re.Match) -> str:
        name = match["name"]
        if name not in FIGURES:
            raise SystemExit(f"readme_figures: README.md has a block '{name}' this script does not know")
        seen.add(name)
        body = FIGURES[name]()
        if body != match["body"]:
            changed.append(name)
        return match.group(1) + body + match.group(4)

    new = BLOCK.sub(render, text)
    missing = sorted(FIGURES.keys() - seen)
    if missing:
        raise SystemExit(f"readme_figures: README.md lacks the generated block(s) {', '.join(missing)}")
    return new, changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block differs")
    args = ap.parse_args(argv)
    text = README.read_text(encoding="utf-8")
    new, changed = regenerate(text)
    if args.check:
        if changed:
            print(f"README.md figures differ from the code: {', '.join(changed)} — run `python benchmarks/readme_figures.py`"
                  f" and commit README.md", file=sys.stderr)
            return 1
        print("README.md figures match the code")
        return 0
    if changed:
        README.write_text(new, encoding="utf-8")
    print(f"README.md: {'regenerated ' + ', '.join(changed) if changed else 'already up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
