"""The planner's layout in the user's own stack: Megatron-LM, torchtitan or DeepSpeed launch configurations.

    from shardwise.emit import Target, emitter
    text = emitter("megatron").render(target)        # UsageError (one line, the knob) if it cannot
    emitter("deepspeed").problem(job, layout)         # None, or why DeepSpeed cannot run this layout

Each target is one module (megatron.py, torchtitan.py, deepspeed.py) with
    model_problem(job) -> str | None      what of the planned model the file cannot say (it would build
                                          another model)
    problem(job, layout) -> str | None    what in the layout the target's configuration cannot express
    render(target) -> str                 the file, in the target's own format
    launch(target, path) -> str           the command that starts it
and the option names each one writes come from the target's source (docs/emit.md lists them with
their sources). Pure Python: no import of the target frameworks.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from shardwise.errors import UsageError
from shardwise.hf_architectures import PLANNER_ONLY

TARGETS = ("megatron", "torchtitan", "deepspeed")

# The planner framework profile (`plan --framework`) each target's layouts are scored with. This is the
# one place the mapping lives; `plan --emit X` applies it when --framework is not given.
FRAMEWORK = {"megatron": "megatron-core", "torchtitan": "torchtitan", "deepspeed": "deepspeed-2024"}  # the releases the files are for

# What a user sees as the target's name.
TITLE = {"megatron": "Megatron-LM", "torchtitan": "torchtitan", "deepspeed": "DeepSpeed"}

# A file name for each target's --out, in the examples its messages give (README's too).
OUT_EXAMPLE = {"megatron": "megatron.sh", "torchtitan": "job.toml", "deepspeed": "ds.json"}


@dataclass(frozen=True)
class Target:
    """What an emitter writes: the job, the chosen estimate (its layout and predictions) and its rank."""

    job: object  # planner Job
    estimate: object  # planner Estimate
    gpus: int
    rank: int  # 1-based, in plan's table

    @property
    def layout(self):
        return self.estimate.layout

    @property
    def framework(self) -> str:
        """The planner's framework profile the layout was scored with."""
        return profile(self.job)

    @property
    def nodes(self) -> int:
        return max(1, -(-self.gpus // self.job.cluster.gpus_per_node))

    @property
    def gpus_per_node(self) -> int:
        return min(self.gpus, self.job.cluster.gpus_per_node)

    def summary(self) -> list[str]:
        """Provenance lines for the file's header comment."""
        from shardwise.units import seconds

        est, lay, job = self.estimate, self.layout, self.job
        gib = 2**30
        knobs = [lay.describe(), lay.schedule if lay.pp > 1 else "no pipeline", f"ZeRO-{lay.zero}",
                 lay.recompute_phrase()] + (["sequence parallel"] if lay.sequence_parallel else [])
        assumes = [f"framework {self.framework}", job.precision + (", compiled" if job.compile else ""),
                   "fused attention" if job.flash_attention else "materialised softmax",
                   "TP overlap on" if job.tp_comm_overlap else "TP overlap off"]
        return [printable(line) for line in [
            f"{job.model.name} on {self.gpus} x {job.cluster.name} ({self.nodes} nodes x {self.gpus_per_node} GPUs), "
            f"global batch {job.train.global_batch} x {job.train.seq_len} tokens",
            f"layout #{self.rank} of `shardwise plan`: {', '.join(knobs)}",
            f"predicted {est.memory_per_gpu / gib:.1f} of {est.gpu_memory_bytes / gib:.0f} GiB per GPU, "
            f"{seconds(est.step_time)} per step, MFU {est.mfu:.1%} ({', '.join(assumes)})",
        ]]


def printable(text: str) -> str:
    """`text` on one line of printable characters: names from the user's files (a config's folder, a cluster's name) go
    into comment lines of a shell script or TOML file, where a newline would start a command."""
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def stage_counts(job, layout) -> tuple[int, ...]:
    """Layers per virtual stage as the planner scored the job: its stack's cut (Framework.stage_split), which a
    target writes stage by stage where it differs from the target's own default."""
    from shardwise.planner.frameworks import get as get_framework
    from shardwise.stage_split import stage_layer_counts

    return stage_layer_counts(job.model, layout.pp * layout.vpp, job.train.seq_len,
                              get_framework(job.framework).stage_split)


def block_kinds(m) -> dict:
    """A planned model's MLP, norms, positions and biases (model_spec.ModelSpec), its family's own where its config
    named none: what an emitter must write for the target to build the same blocks."""
    llama = m.family == "llama"
    return {"mlp": m.mlp or ("swiglu" if llama else "gelu"), "norm": m.norm or ("rmsnorm" if llama else "layernorm"),
            "positions": m.positions or ("rotary" if llama else "learned"),
            "attn_bias": m.attn_bias if m.attn_bias is not None else not llama,
            "mlp_bias": m.mlp_bias if m.mlp_bias is not None else not llama}


def unwritable(job) -> list[tuple[bool, str]]:
    """(whether, what) for the model features no emitter's file says, which each target's model_problem checks
    before its own: blocks of their own (a bias on the LM head, attention sinks, norms beyond two per layer, a
    parallel residual) and a sliding window shorter than the sequence. (Architectures read from keys of their own,
    Nemotron's LayerNorm1P among them, are refused before: check_model.)"""
    m = job.model
    return [(m.head_bias, "a bias on the LM head"),
            (m.attention_sinks, "attention sinks"),
            (m.layer_norms != 2 or m.embed_norm, "norms other than two per layer"),
            (m.parallel_residual, "attention and MLP side by side (a parallel residual)"),
            (m.windowed(job.train.seq_len), f"a {m.sliding_window:,}-token sliding attention window shorter than --seq-len")]


def profile(job) -> str:
    """The framework profile a planner Job was scored with (planners without profiles: shardwise's own model)."""
    return getattr(job, "framework", None) or "shardwise default"


def emitter(name: str):
    """The module that writes target `name`."""
    if name not in TARGETS:
        raise UsageError(f"unknown --emit target '{name}' — choose one of {', '.join(TARGETS)}")
    return importlib.import_module(f"shardwise.emit.{name}")


def check_nodes(name: str, job, gpus: int) -> None:
    """UsageError where `gpus` are not whole nodes: every launch file starts as many processes on each node."""
    per_node = job.cluster.gpus_per_node
    if gpus > per_node and gpus % per_node:
        raise UsageError(f"--emit {name}: {gpus} GPUs are not whole {per_node}-GPU nodes of {job.cluster.name}, and the "
                         f"launch file starts as many processes on every node — plan for a multiple of {per_node} GPUs")


def check_model(name: str, job) -> None:
    """UsageError where the target's file would build another model than the one planned: an architecture planned
    from keys of its own (hf_architectures.PLANNER_ONLY), or a block feature the emitter has no argument for
    (its model_problem)."""
    if job.model.model_type in PLANNER_ONLY:
        raise UsageError(f"--emit {name}: shardwise writes {TITLE[name]} model arguments for Llama- and GPT-2-style "
                         f"blocks, not {job.model.model_type}'s — plan without --emit and set the layout in your own launch")
    why = emitter(name).model_problem(job)
    if why:
        raise UsageError(f"--emit {name}: the planned model has {why}, which the {TITLE[name]} file shardwise writes "
                         f"cannot say — plan without --emit and set the layout in your own launch")


def problem(name: str, job, layout) -> str | None:
    """Why target `name` cannot run this layout: its own configuration's limits, or a tp above the KV heads, which
    every target's release splits over tp (Framework.kv_refusal; a plan under megatron-2021 may replicate them)."""
    from shardwise.planner.frameworks import get as get_framework

    return get_framework(FRAMEWORK[name]).kv_refusal(job.model.num_kv_heads, layout.tp) or emitter(name).problem(job, layout)


def expressible(name: str, job, estimates, gpus: int | None = None):
    """The estimates whose layouts target `name` can run, in order; UsageError naming the knob when none can, or
    when `gpus` are not whole nodes (every launch file starts the same number of processes on each node)."""
    if gpus is not None:
        check_nodes(name, job, gpus)
    check_model(name, job)
    kept = [e for e in estimates if problem(name, job, e.layout) is None]
    if not kept and estimates:
        others = " or ".join(t for t in TARGETS if t != name and problem(t, job, estimates[0].layout) is None)
        raise UsageError(f"{TITLE[name]} cannot run any layout that fits: the fastest, {estimates[0].layout.describe()}, "
                         f"needs {problem(name, job, estimates[0].layout)}"
                         + (f" — --emit {others} can run it" if others else ""))
    return kept


def render(name: str, target: Target) -> str:
    """The file for target `name`, or UsageError naming what the target cannot express."""
    mod = emitter(name)
    check_nodes(name, target.job, target.gpus)
    check_model(name, target.job)
    why = problem(name, target.job, target.layout)
    if why is not None:
        raise UsageError(f"{TITLE[name]} cannot run {target.layout.describe()}: {why}")
    return mod.render(target)


__all__ = ["TARGETS", "FRAMEWORK", "TITLE", "Target", "emitter", "expressible", "profile", "render"]
