"""How the planner's step times compared with the published runs of each stack on each GPU: what `explain` and
`estimate --json` (assumptions.checked_on_published_runs) say of a prediction's record before anyone measures it.

published_check.json is written by `python benchmarks/published_runs.py --write-check` from the strong rows (dense and,
apart, mixture-of-experts) of benchmarks/data/published_runs.csv, each scored under the profile of the stack that ran it with the shipped constants;
tests/test_planner_published.py fails when the file no longer matches what the script computes.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

PATH = Path(__file__).with_name("published_check.json")
GPU_NAMES = {"ampere": "A100", "hopper": "H100/H200 (BF16)", "hopper-fp8": "H100/H200 (FP8)"}


@lru_cache(maxsize=1)
def table() -> dict:
    """published_check.json as shipped, read once."""
    return json.loads(PATH.read_text())


def record(framework: str, arch_key: str, moe: bool = False) -> dict | None:
    """The published-run record of `framework` on `arch_key` (kernels.situ_key), of its dense runs or (`moe`) its
    mixture-of-experts runs: rows, median |error|, signed median (+: the planner faster than published), max |error|;
    None where the set has no such run."""
    found = table()["moe_by_stack" if moe else "by_stack"].get(framework, {}).get(arch_key)
    return dict(found) if found else None


def sentence(framework: str, arch_key: str, moe: bool = False) -> str:
    """One sentence for `explain`: the stack's record on this GPU, or that it has none."""
    gpu = GPU_NAMES.get(arch_key)
    if gpu is None:
        return ""
    kind = f"{framework} mixture-of-experts" if moe else framework
    found = record(framework, arch_key, moe)
    if not found:
        return (f"No published {kind} run on {gpu} is in shardwise's reference set: these figures are the "
                f"model's, unchecked for this stack on this GPU.")
    return (f"Checked on {found['rows']} published {kind} run{'s' * (found['rows'] > 1)} on {gpu} "
            f"(benchmarks/published_runs.py): median |error| {found['median_abs_error']:.1%}, signed median "
            f"{found['signed_median_error']:+.1%} (+: predicted faster than published), worst "
            f"{found['max_abs_error']:.1%}.")
