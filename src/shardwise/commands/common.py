"""Arguments and output helpers shared by several sub-commands."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

from shardwise.errors import DoesNotFit, InputError, UsageError
from shardwise.specs import (CP_MODES, PLANNED_SCHEDULES, RECOMPUTE, SCHEDULES, Layout, cluster_presets, default_schedule,
                             load_cluster, load_model, model_presets)


def add_model_arg(p: argparse.ArgumentParser, default: str | None = None) -> None:
    p.add_argument("--model", required=default is None, default=default,
                   help=f"model preset ({', '.join(model_presets())}) or path to a Hugging Face config.json or model "
                        "folder" + ("" if default is None else " (default %(default)s)"))


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", required=True,
                   help=f"cluster preset ({', '.join(cluster_presets())}) or path to a cluster .toml")
    p.add_argument("--gpus", type=int, required=True, help="total number of GPUs")


def add_job_args(p: argparse.ArgumentParser, global_batch: int | None = None, seq_len: int | None = None) -> None:
    p.add_argument("--global-batch", type=int, required=global_batch is None, default=global_batch,
                   help="sequences per optimizer step (same for every layout)")
    p.add_argument("--seq-len", type=int, required=seq_len is None, default=seq_len, help="tokens per sequence")


RECOMPUTE_LAYERS_HELP = ("full recompute of only the first N layers of each pipeline stage (of each virtual stage with "
                         "--vpp); the others keep their activations. Megatron's --recompute-method block "
                         "--recompute-num-layers N; torchtitan's selective_ac_option k is N = layers per stage // k. "
                         "Implies --recompute full")


def add_layout_args(p: argparse.ArgumentParser, *, micro_batch_required: bool = False, unnamed: bool = False) -> None:
    """The knobs of one layout, with the contract's flag names. `unnamed`: --vpp, --zero, --recompute and
    --sequence-parallel / --no-sequence-parallel default to None when not given, for the planner to fill in as the
    framework runs them (planner.estimate.complete_layout)."""
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel degree")
    if unnamed:
        p.add_argument("--micro-batch", type=int, default=None,
                       help="sequences per micro-batch (default: of those dividing each data-parallel replica's share "
                            "of the batch, the fastest that fits, said under 'filled in')")
    else:
        p.add_argument("--micro-batch", type=int, required=micro_batch_required,
                       default=None if micro_batch_required else 1, help="sequences per micro-batch")
    if not unnamed:
        p.add_argument("--vpp", type=int, default=1, help="virtual pipeline stages (model chunks) per rank, interleaved-1f1b only")
        p.add_argument("--zero", type=int, default=0, choices=[0, 1, 2, 3], help="ZeRO stage")
        p.add_argument("--recompute", default="none", choices=list(RECOMPUTE), help="activation recompute")
        p.add_argument("--recompute-layers", type=int, default=None, metavar="N", help=RECOMPUTE_LAYERS_HELP)
        p.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (with tp > 1)")
    else:
        edge = _stacks(lambda fw: fw.edge_chunks and fw.schedules)
        p.add_argument("--vpp", type=int, default=None,
                       help="virtual pipeline stages (model chunks) per rank, interleaved-1f1b only (default 1; with "
                            "--schedule interleaved-1f1b, the fastest that fits). pp*vpp may exceed the layers by two "
                            f"where the framework gives the embedding and the loss a chunk each ({edge}; Megatron-Core's "
                            "--account-for-embedding/loss-in-pipeline-split)")
        p.add_argument("--zero", type=int, default=None, choices=[0, 1, 2, 3],
                       help="ZeRO stage (default: the framework's own — megatron-core and nemo the distributed "
                            "optimizer, ZeRO-1; torchtitan FSDP2, ZeRO-3, or 2 with a pipeline — or the next stage "
                            "that fits)")
        p.add_argument("--recompute", default=None, choices=list(RECOMPUTE),
                       help="activation recompute (default: none, or the cheapest policy that fits, which may be full "
                            "recompute of only some layers)")
        p.add_argument("--recompute-layers", type=int, default=None, metavar="N", help=RECOMPUTE_LAYERS_HELP)
        p.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                       help="Megatron sequence parallelism (with tp > 1); --no-sequence-parallel: plain TP. Default: what "
                            "the stack runs (always with TP on nemo and torchtitan, never on deepspeed), else the faster "
                            "of the two that fits (megatron-2021, shardwise and internevo: off unless named)")
    p.add_argument("--schedule", default=None, choices=list(SCHEDULES),
                   help="pipeline schedule (default 1f1b; interleaved-1f1b when vpp > 1" + (
                       f"; on {_stacks(lambda fw: fw.weighs_interleaving)}, whose papers and recipes interleave their "
                       "pipelines, interleaved-1f1b at the fastest depth that fits, or 1f1b if faster; elsewhere the "
                       "output says when "
                       "interleaving would be 5%% faster)" if unnamed else ")"))
    p.add_argument("--ep", type=int, default=1,
                   help="expert-parallel degree (MoE models): experts split over ep of the same dp x tp x cp ranks; ep*etp "
                        "must divide dp*tp*cp")
    p.add_argument("--etp", type=int, default=None if unnamed else 1,
                   help="tensor-parallel degree inside each expert (default 1" + (
                       "; on megatron-core and nemo the dense layers' tp, as Megatron-Core's "
                       "--expert-tensor-parallel-size defaults, where tp divides the expert FFN and ep*tp folds over "
                       "dp*tp*cp)" if unnamed else ")"))
    p.add_argument("--cp", type=int, default=1,
                   help="context-parallel degree: each sequence split over cp ranks (zig-zag chunks; default 1)")
    p.add_argument("--cp-mode", default=None, choices=list(CP_MODES),
                   help="attention over the sequence shards: ring (K/V passed around the cp ranks, overlapped with "
                        "compute) or allgather (K/V gathered once per layer, as Llama 3 does). Default: ring, or the "
                        "framework's own when it runs only one (plan weighs both where the stack runs both)")


def layout_from_args(args, dp: int) -> Layout:
    schedule = args.schedule or default_schedule(args.vpp)
    return Layout(dp=dp, tp=args.tp, pp=args.pp, micro_batch=args.micro_batch, vpp=args.vpp, zero=args.zero,
                  recompute=args.recompute, recompute_layers=args.recompute_layers,
                  sequence_parallel=args.sequence_parallel and args.tp > 1, schedule=schedule,
                  ep=args.ep, etp=args.etp or 1, cp=args.cp, cp_mode=args.cp_mode or "ring",
                  dp_shard=getattr(args, "dp_shard", 0))


def dp_from_gpus(gpus: int, tp: int, pp: int, cp: int = 1) -> int:
    from shardwise.planner.search import check_gpus

    check_gpus(gpus, "estimate")
    for flag, value in (("--tp", tp), ("--pp", pp), ("--cp", cp)):
        if value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}")
    if gpus % (tp * pp * cp):
        what, values = ("tp*pp*cp", f"{tp}*{pp}*{cp}") if cp > 1 else ("tp*pp", f"{tp}*{pp}")
        raise InputError(f"{what} = {values} does not divide {gpus} GPUs — choose degrees whose product divides --gpus")
    return gpus // (tp * pp * cp)


def add_framework_arg(p: argparse.ArgumentParser, help: str | None = None) -> None:
    """--framework NAME, one of planner.frameworks.FRAMEWORKS (an unknown name: one line, exit 2, where it is read)."""
    from shardwise.planner.frameworks import DEFAULT_HELP, FRAMEWORKS

    p.add_argument("--framework", default=None, metavar="{" + ",".join(FRAMEWORKS) + "}",
                   help=(help or DEFAULT_HELP) + " (docs/planner.md describes each)")


def _stacks(fits) -> str:
    """The framework names whose profile `fits(profile)`, as a list in words (help texts read them from the profiles)."""
    from shardwise.planner.frameworks import FRAMEWORKS

    names = [name for name, fw in FRAMEWORKS.items() if fits(fw)]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)


def _unnamed_recompute() -> str:
    """Which stacks `plan` searches with only their own recompute policies unless --recompute lists others
    (Framework.search_as_unnamed: megatron-2021's full recompute, the 2021-22 Megatron-DeepSpeed's none or full), read
    from the profiles."""
    from shardwise.planner.frameworks import FRAMEWORKS

    policies = sorted({fw.unnamed_recompute for fw in FRAMEWORKS.values() if fw.search_as_unnamed and fw.unnamed_recompute})
    return "; ".join(f"{_stacks(lambda fw: fw.search_as_unnamed and fw.unnamed_recompute == r)}: {' or '.join(r)}"
                     for r in policies)


def add_software_args(p: argparse.ArgumentParser) -> None:
    """Facts about the training software the planner models (not searched)."""
    from shardwise.planner.job import ATTENTION_BACKENDS

    add_framework_arg(p)
    te, torchao = _stacks(lambda fw: fw.fp8 == "te"), _stacks(lambda fw: fw.fp8 == "torchao")
    p.add_argument("--flash-attention", action=argparse.BooleanOptionalAction, default=None,
                   help="the attention core is a fused kernel (FlashAttention/SDPA/cuDNN) that stores no s x s scores "
                        f"(the default of every framework but {_stacks(lambda fw: not fw.flash_attention)}, the "
                        "2021-22 stacks, which run FlashAttention-1 on A100 when given it); --no-flash-attention models "
                        "the materialised softmax of Korthikanti et al. 2022")
    p.add_argument("--precision", choices=["bf16", "fp8"], default="bf16",
                   help="GEMM precision: bf16 (default), or fp8 — the layers' linears in FP8 on Hopper with the "
                        f"framework's scaling recipe (Transformer Engine for {te}, torchao for {torchao}), attention "
                        "and the LM head in bf16")
    p.add_argument("--fp8-params", action="store_true",
                   help=f"with --precision fp8 on a Transformer Engine stack ({te}): the weights themselves in FP8 "
                        "(NeMo fp8_params, Megatron-Core --fp8-param-gather, Transformer Engine's fp8_model_init): one "
                        "byte each in memory and in the distributed optimizer's all-gather; with torchao's float8 "
                        f"({torchao}): torchao's float8 all-gather (enable_fsdp_float8_all_gather): each layer's "
                        "weights cast to FP8 on their FSDP shard, gathered and held at one byte")
    p.add_argument("--tp-comm-overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="TP collectives overlap their GEMMs (Transformer Engine userbuffers; on by default for nemo, "
                        "available for megatron-core and torchtitan's async TP)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="the model's blocks and loss run under torch.compile (Inductor), which fuses each chain of "
                        "point-wise ops and reductions between two matmuls/attention calls into one kernel (torchtitan's "
                        "compile.enable, off by default, so torchtitan is eager unless you add this; also composer and "
                        "fms-fsdp; stacks that already run fused kernels refuse it). Default: eager, except torchtitan "
                        "with --precision fp8, whose torchao Float8 runs compiled (its casts are fused; the output says "
                        "so); --no-compile: eager")
    p.add_argument("--compile-loss", action=argparse.BooleanOptionalAction, default=None,
                   help="with --compile: whether the cross-entropy is compiled with the blocks (default: what the "
                        "stack does — torchtitan compiles both, composer and fms-fsdp the model only). "
                        "--no-compile-loss: the loss stays eager, keeping FP32 log-probabilities and their gradients, "
                        "as torchtitan did until 2025-04 ('compiling loss function causes CUDA errors')")
    p.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default=None,
                   help="Transformer Engine's attention for the stacks that run it (megatron-core, nemo, automodel), "
                        "as Megatron-Core's --attention-backend or TE's NVTE_FUSED_ATTN / NVTE_FLASH_ATTN choose it: "
                        "fused, cuDNN's fused attention (TE's pick on Hopper); flash, flash-attn's FlashAttention-2 "
                        "(TE's pick on Ampere, and on Hopper under NVTE_FUSED_ATTN=0); auto (default), TE's own pick")
    p.add_argument("--fused-norms", action="store_true",
                   help="the RMSNorm/LayerNorm layers run as one fused kernel in a stack whose other element-wise "
                        "work is eager (torchtitan's norm_type fused_rmsnorm, its presets' default until 2024-08; and "
                        "torchtitan's nn.RMSNorm on a GPU under torch 2.8 or later, whose rms_norm calls the fused "
                        "_fused_rms_norm kernel when the weight's dtype is the input's, as FSDP2's BF16 parameters "
                        "make it): their time and the tensors they keep are a fused kernel's. Without it, torch's "
                        "composite RMSNorm of earlier releases is priced, as the published torchtitan runs ran it")
    p.add_argument("--moe-dispatcher", choices=["alltoall", "deepep"], default=None,
                   help="mixture of experts: how tokens reach their experts — alltoall (default: NCCL's all-to-all, a "
                        "token's row sent once per expert it chose) or deepep (DeepEP's kernels: once per node, then "
                        "NVLink; Megatron-Core's --moe-token-dispatcher-type flex, NeMo, AutoModel)")
    p.add_argument("--ep-comm-overlap", action="store_true",
                   help="mixture of experts: one micro-batch's all-to-alls run behind another's compute "
                        "(Megatron-Core's --overlap-moe-expert-parallel-comm; megatron-core and nemo); without it they "
                        "are priced exposed")
    from shardwise.planner.offload import OFFLOADS

    p.add_argument("--offload", choices=OFFLOADS, default=None,
                   help="keep states in the host's CPU memory: optimizer — the optimizer states and FP32 master, "
                        "stepped on the CPU (DeepSpeed's ZeRO-Offload: " + _stacks(lambda fw: "optimizer" in fw.offload)
                        + "); params — the parameter shards and their gradients too (DeepSpeed's ZeRO-3 offload_param, "
                        "FSDP's CPU offload: " + _stacks(lambda fw: "params" in fw.offload) + "). Priced with the "
                        "cluster's host keys (host_link_gbs, host_memory_bandwidth_gbs, host_memory_gib)")
    p.add_argument("--capacity-factor", type=float, default=1.0, metavar="C",
                   help="mixture of experts: the busiest expert's tokens over the mean (router imbalance: a measured "
                        "skew, or the capacity factor a run pads experts to); default 1.0, balanced routing")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"values must not be negative, got {text!r}")
    return values


def _choice_list(choices):
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(v.strip() for v in text.split(","))
        bad = [repr(v) if not v else v for v in values if v not in choices]  # an empty name shown as ''
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(bad)} — choose from {', '.join(choices)}")
        return values
    return parse


def add_search_args(p: argparse.ArgumentParser) -> None:
    """Narrow the search (default: every valid value of every knob). Lists are comma-separated."""
    g = p.add_argument_group("search space (default: everything valid)")
    g.add_argument("--tp", type=_int_list, default=None, metavar="T,...", help="tensor-parallel degrees to try")
    g.add_argument("--pp", type=_int_list, default=None, metavar="P,...", help="pipeline-parallel degrees to try")
    g.add_argument("--micro-batch", type=_int_list, default=None, metavar="B,...", help="micro-batch sizes to try")
    g.add_argument("--ep", type=_int_list, default=None, metavar="E,...",
                   help="expert-parallel degrees to try (MoE models; default: every divisor of the experts that divides "
                        "dp*tp*cp)")
    g.add_argument("--zero", type=_int_list, default=None, metavar="Z,...",
                   help="ZeRO stages to try (default: every stage the framework runs; megatron-2021: ZeRO-0, its 2021 "
                        "default, unless listed)")
    g.add_argument("--recompute", type=_choice_list(RECOMPUTE), default=None, metavar="R,...",
                   help="activation recompute policies to try (none, selective, full; default: every policy the "
                        "framework runs; " + _unnamed_recompute() + ", their stacks' own, unless listed)")
    g.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None,
                   help="only layouts with Megatron sequence parallelism (with tp > 1); --no-sequence-parallel: only "
                        "plain TP, refused (as estimate refuses it) where the stack always shards the sequence with "
                        "TP (torchtitan, or under --tp-comm-overlap: nemo's default). Default: both where the stack runs "
                        "it as an option (megatron-2021: off unless given), on where it always does or its recipes do "
                        "(nemo)")
    g.add_argument("--schedules", type=_choice_list(PLANNED_SCHEDULES), default=PLANNED_SCHEDULES, metavar="S,...",
                   help="pipeline schedules to try")
    g.add_argument("--max-vpp", type=int, default=None, metavar="V", help="at most V virtual stages per rank")
    g.add_argument("--cp", type=_int_list, default=None, metavar="C,...",
                   help="context-parallel degrees to try (default: 1 and every cp that leaves each GPU at least "
                        "4096 tokens of every sequence)")
    g.add_argument("--cp-modes", type=_choice_list(list(CP_MODES)), default=CP_MODES, metavar="M,...",
                   help="context-parallel attention to consider: ring, allgather (the one with less exposed K/V "
                        "traffic is scored)")


def space_from_args(args):
    from shardwise.planner.search import SearchSpace

    if args.max_vpp is not None and args.max_vpp < 1:
        raise InputError(f"--max-vpp must be at least 1, got {args.max_vpp}")

    sp = None if args.sequence_parallel is None else (args.sequence_parallel,)
    return SearchSpace(tp=args.tp, pp=args.pp, micro_batch=args.micro_batch, zero=args.zero,
                       recompute=args.recompute, sequence_parallel=sp, schedules=args.schedules, max_vpp=args.max_vpp,
                       cp=args.cp, cp_modes=args.cp_modes, ep=getattr(args, "ep", None))


def under_framework(args, attempt):
    """attempt(args) under the --framework the user named. Unnamed: under the default (planner/frameworks.py
    DEFAULT_FRAMEWORK), or, where that stack refuses what the other flags ask (its one-line UsageError) or, for
    `estimate`, cannot hold the layout where the fallback can (DoesNotFit), under FALLBACK_FRAMEWORK;
    `args.framework_note` then says which and why (`assumptions.implied`, plan's note). A layout neither holds is the
    default's answer, fits false."""
    from copy import copy

    from shardwise.planner.frameworks import DEFAULT_FRAMEWORK, FALLBACK_FRAMEWORK, default_note

    if not hasattr(args, "framework") or args.framework is not None:
        return attempt(args)

    def under(framework: str, note: str, **flags):
        one = copy(args)
        one.framework, one.framework_note = framework, note
        vars(one).update(flags)
        return one

    if _runtime_calibration(args):  # its measured costs are this project's runtime's: plan for that runtime
        first = under("shardwise", f"framework shardwise (--framework not given, and --cluster {args.cluster} is "
                                   f"`shardwise calibrate`'s measurement of this project's runtime: its costs are that "
                                   f"runtime's)")
        out = attempt(first)
        _take_notes(args, first)
        return out

    # estimate: a layout the default cannot hold is tried under the fallback too (fallback_if_unfit)
    first = under(DEFAULT_FRAMEWORK, default_note(), fallback_if_unfit=True)
    try:
        out = attempt(first)
    except UsageError as refusal:
        unheld = isinstance(refusal, DoesNotFit)
        # framework_fallback: what the command suggests must name the stack (estimate's fit_options)
        second = under(FALLBACK_FRAMEWORK, default_note(str(refusal), held=unheld), framework_fallback=True,
                       fallback_if_unfit=unheld)
        try:
            out = attempt(second)
        except UsageError as again:  # the same words: the input itself; else each stack's own reason, in one line
            if unheld:  # neither stack holds it: the default's own answer, fits false
                first = under(DEFAULT_FRAMEWORK, default_note())
                out = attempt(first)
                _take_notes(args, first)
                return out
            if str(again) == str(refusal):
                raise
            if all(str(e).startswith("nothing fits") for e in (refusal, again)):
                raise refusal from None  # no stack fits it: the default's leanest layout and GPU count answer
            # A refusal of the input itself (errors.InputError: a range, a divisor) is said plainly: either stack
            # meets it, one earlier than the other (helper-232: --gpus 0 --compile read "the default cannot run
            # this"); a stack's own limit keeps both reasons (helper-233)
            plain = [e for e in (refusal, again) if isinstance(e, InputError)]
            if plain:
                raise plain[0] from None
            raise UsageError(f"--framework not given: the default {DEFAULT_FRAMEWORK} cannot run this ({refusal}), nor "
                             f"can {FALLBACK_FRAMEWORK} ({again}) — name a --framework that does, or change the "
                             f"flags") from None
        _take_notes(args, second)
        return out
    _take_notes(args, first)
    return out


def _calibrated_on_other(cluster, model, seq_len: int) -> str | None:
    """The note for a calibration measured on another model or sequence length than the job's: its per-layer and
    per-call costs are the measured model's, carried over by FLOPs and bytes, not timed on this one."""
    measured = cluster.measured or {}
    on, tokens = measured.get("model"), measured.get("tokens")
    if on is None or (on == model.name and tokens in (None, seq_len)):
        return None
    return (f"--cluster was calibrated on {on} at {tokens} tokens a sequence: {model.name} at {seq_len} is priced from "
            f"those measurements, carried over by FLOPs and bytes (`shardwise calibrate --model {model.name} --seq-len "
            f"{seq_len}` times its own)")


def _runtime_calibration(args) -> bool:
    """Whether --cluster is a profile `shardwise calibrate` measured (its [measured] tables: the runtime's own step,
    layers and calls), not a datasheet cluster or one fitted to nccl-tests logs."""
    from shardwise.specs import load_cluster

    cluster = getattr(args, "cluster", None)
    try:
        return bool(cluster) and bool(load_cluster(cluster).measured)
    except UsageError:  # a bad --cluster: the command's own check says so
        return False


def _take_notes(args, attempted) -> None:
    """The notes (`notes`) of the attempt that ran, onto the caller's args."""
    for key, note in note_fields(attempted).items():
        setattr(args, key, note)


# What a command says when it compiled a job the user did not ask to compile (Framework.compiles_by_default).
COMPILE_IMPLIED = ("torch.compile (torchao's Float8 runs compiled, its amax and casts fused: torchtitan's float8 docs "
                   "call compile.enable required for competitive performance; --compile not given, --no-compile for eager)")


# What a command filled in that the user did not name: the stack (`under_framework`), torch.compile and the GPU's
# kernel-model keys a cluster file left out (`job_from_args`); each an attribute of the command's args, and a field of
# plan's and explain's JSON.
NOTE_KEYS = ("framework_note", "compile_note", "cluster_note", "model_note", "winner_note")


def job_fields(args, job) -> dict:
    """What the prediction was asked about, echoed in --json: the model, the cluster and the job's shape."""
    return {"job": {"model": job.model.name, "cluster": job.cluster.name, "gpus": args.gpus,
                    "global_batch": job.train.global_batch, "seq_len": job.train.seq_len, "precision": job.precision}}


def note_fields(args) -> dict[str, str]:
    """The notes a command filled in, by NOTE_KEYS name."""
    return {key: getattr(args, key) for key in NOTE_KEYS if getattr(args, key, None)}


def notes(args) -> list[str]:
    """The notes a command filled in (note_fields), in order, for its text output and estimate's implied list."""
    return list(note_fields(args).values())


def model_note(job) -> str:
    """What of the model the planner does not price, or prices in a way worth saying, where it matters: a sequence
    beyond a learned position table (the table counted as given) or beyond the positions a rotary model's config is
    set up for, attention through a sliding window shorter than the sequence (model FLOPs over the window; time over
    it where the stack's kernel skips the rest: window_note), Gemma 2's soft-caps (softcap_note; its final logits'
    tensor and passes), DeepSeek's multi-token-prediction modules (not counted)."""
    model, seq_len = job.model, job.train.seq_len
    parts = []
    if model.learned_positions and seq_len > model.max_positions:  # runnable only with a longer table
        parts.append(f"{model.name} learns positions for {model.max_positions:,} tokens: --seq-len {seq_len:,} needs a "
                     f"longer position table (its parameters are counted at {model.max_positions:,}; the rest of the "
                     f"numbers do not depend on it)")
    elif model.rotary and seq_len > model.max_positions:  # any length runs, but past what the config is set up for
        scaling = dict(model.rope_scaling)
        if scaling:
            parts.append(f"{model.name}'s config scales RoPE ({scaling['rope_type']}) to {model.max_positions:,} "
                         f"positions (max_position_embeddings): --seq-len {seq_len:,} is past that, priced as given")
        else:
            parts.append(f"{model.name}'s config is set up for {model.max_positions:,} positions "
                         f"(max_position_embeddings): --seq-len {seq_len:,} is priced as given; training at it needs "
                         f"RoPE scaling or a context extension the config does not state")
    if model.windowed(seq_len):
        parts.append(window_note(job))
    if model.attn_softcap:
        parts.append(softcap_note(job))
    if model.final_softcap:
        parts.append(f"{model.name} soft-caps its final logits at {model.final_softcap:g} (final_logit_softcapping): "
                     f"priced as one more logits-sized tensor kept for backward and its element-wise passes")
    if model.mtp_layers:
        parts.append(f"{model.name}'s {model.mtp_layers} multi-token-prediction module(s) (num_nextn_predict_layers) "
                     f"are not counted: each adds about one layer and one LM-head pass to the last pipeline stage")
    return "; ".join(parts)


def window_note(job) -> str:
    """How the layers that attend through a sliding window shorter than the sequence are priced: their model FLOPs
    over the window (ModelSpec.attended_keys, MaxText's count), their time over it where the stack's kernel skips the
    keys outside it (layer_time.window_skipped), over the whole causal sequence where it does not."""
    from shardwise.planner.layer_time import attention_family, attention_kernel, window_skipped

    model = job.model
    which = ("every layer" if model.window_layers == model.num_layers
             else f"{model.window_layers} of its {model.num_layers} layers")
    head = (f"{model.name} attends through a {model.sliding_window:,}-token sliding window on {which}: their model "
            f"FLOPs count the window's keys, not --seq-len {job.train.seq_len:,} (MaxText's count)")
    if window_skipped(job):
        return (f"{head}, and their attention time the band alone, as {job.framework}'s kernel skips the keys outside "
                f"it (with --cp above 1, priced as full causal attention over the ring)")
    family = attention_family(job)
    kernel = ("a materialised softmax" if not attention_kernel(job) else "FlashAttention-1" if family == "fa1"
              else "torch's SDPA")  # the families that take no window, and the stacks that call SDPA with a mask
    return (f"{head}, but their attention time is full causal attention: {job.framework}'s attention here ({kernel}) "
            f"takes no window and computes every block")


def softcap_note(job) -> str:
    """How attention with soft-capped logits (Gemma 2) is priced: in the stack's fused kernel where it takes the cap,
    else as the materialised softmax the stack falls back to (planner/job.softcap_unfused)."""
    from shardwise.planner.frameworks import get as get_framework
    from shardwise.planner.job import softcap_unfused

    fw = get_framework(job.framework)
    head = f"{job.model.name} soft-caps its attention logits at {job.model.attn_softcap:g} (attn_logit_softcapping)"
    if not softcap_unfused(job.model, fw, job.attention):
        return head + (f": {fw.name}'s fused attention applies the cap, priced as the fused kernel" if job.flash_attention
                       else ", in the materialised softmax priced here")
    return (f"{head}, which {fw.name}'s fused attention ({job.attention or fw.attention}) cannot apply: its layers are "
            f"priced with the stack's unfused attention, the s x s scores in memory and through HBM (kernels that "
            f"take the cap: flash-attn 2.6 or later, FlashAttention-3)")


def idle_knobs(tp: int, pp: int, cp: int, *, schedule=None, vpp=None, sequence_parallel=None, cp_mode=None,
               tp_comm_overlap=None, dp: int | None = None, zero=None, dp_shard=None) -> dict[str, str]:
    """The named layout knobs that change nothing in this layout, each with the note that says so (said, not silently
    dropped: Megatron-LM likewise turns SP off at tp 1): a pipeline schedule at pp 1 (no stages to order: every stack
    accumulates one micro-batch after another), a CP mode at cp 1, SP or TP comm overlap at tp 1, a ZeRO stage where
    dp x cp is 1 (no ranks to shard over: plan scores such layouts as ZeRO-0). estimate and train set each back to
    what runs."""
    idle = {}
    for flag, value in (("zero", zero), ("dp_shard", dp_shard)):
        if value and dp is not None and dp * cp <= 1:
            idle[flag] = (f"--{flag.replace('_', '-')} {value} changes nothing at dp {dp}, cp {cp} (no data-parallel "
                          f"ranks to shard over)")
    if cp_mode is not None and cp <= 1:
        idle["cp_mode"] = f"--cp-mode {cp_mode} changes nothing at --cp {cp} (no context-parallel ranks)"
    if sequence_parallel and tp <= 1:
        idle["sequence_parallel"] = "--sequence-parallel changes nothing at --tp 1 (no tensor-parallel ranks)"
    if pp == 1 and schedule not in (None, "1f1b") and vpp in (None, 1):
        idle["schedule"] = (f"--schedule {schedule} changes nothing at --pp 1 (no pipeline stages to order: micro-batches "
                            f"run one after another)")
    if tp_comm_overlap and tp <= 1:
        idle["tp_comm_overlap"] = "--tp-comm-overlap changes nothing at --tp 1 (no tensor-parallel collectives to overlap)"
    return idle


def settle_idle_knobs(values: dict, vpp_named: bool, said=lambda key, note: note) -> list[str]:
    """Set a layout's knobs that change nothing back to what runs (a schedule at pp 1, sequence parallelism at tp 1, a
    CP mode at cp 1: idle_knobs), in `values` (Layout's fields, "schedule" set), and return the notes that say so
    (`said(key, note)` words each). Interleaved 1F1B without a depth runs 2 virtual stages per rank (one chunk per
    rank interleaves nothing); with a depth of 1 named (`vpp_named`) it is refused. train and validate run layouts
    through it, so a layout is recorded, compared and deduplicated as it ran."""
    from shardwise.specs import check_named_interleaving

    tp, pp, cp = values.get("tp", 1), values.get("pp", 1), values.get("cp", 1)
    mode = values.get("cp_mode", "ring")
    idle = idle_knobs(tp, pp, cp, schedule=values["schedule"], vpp=values.get("vpp", 1),
                      sequence_parallel=values.get("sequence_parallel"), cp_mode=None if mode == "ring" else mode)
    values.update({k: {"schedule": "1f1b", "sequence_parallel": False, "cp_mode": "ring"}[k] for k in idle})
    notes = [said(k, note) for k, note in idle.items()]
    if pp > 1 and values["schedule"] == "interleaved-1f1b" and values.get("vpp", 1) == 1:
        if vpp_named:
            check_named_interleaving(pp, 1, values["schedule"])
        values["vpp"] = 2
        notes.append("2 virtual stages per rank (interleaved 1F1B interleaves at least 2; --vpp not given)")
    return notes


def winner_note(args, job, layout) -> str:
    """What a flag of plan or explain narrowed or switched that their winner has no use for, said as estimate says its
    idle flags: --schedules where the winner has no pipeline, --tp-comm-overlap where it has no tensor parallelism;
    and, --recompute not given, the policies a stack searched as its published runs trained left out (deepspeed,
    megatron-2021); a later release's opt-in flag the winner uses (estimate.release_note); a pipeline cut its stack
    builds only when told (estimate.split_note)."""
    from shardwise.planner.search import PLANNED_SCHEDULES

    parts = []
    schedules = getattr(args, "schedules", None)
    if schedules and set(schedules) != set(PLANNED_SCHEDULES) and layout.pp == 1:
        parts.append(f"--schedules {','.join(schedules)} orders pipeline stages, and the winner has none (pp 1): its "
                     f"micro-batches run one after another whatever the schedule")
    if getattr(args, "tp_comm_overlap", None) and layout.tp == 1:
        parts.append("--tp-comm-overlap changes nothing for the winner (tp 1: no tensor-parallel collectives to overlap)")
    zero = getattr(args, "zero", None)
    if zero and layout.dp * layout.cp == 1 and layout.zero not in zero:
        parts.append(f"--zero {','.join(map(str, zero))} changes nothing for the winner (dp {layout.dp}, cp {layout.cp}: "
                     f"no data-parallel ranks to shard over; it runs as ZeRO-0)")
    from shardwise.planner.frameworks import get

    fw = get(job.framework)
    others = [r for r in fw.recompute if r not in fw.unnamed_recompute]
    if fw.search_as_unnamed and fw.unnamed_recompute and others and getattr(args, "recompute", None) is None:
        parts.append(f"{fw.name} is searched with {' and '.join(fw.unnamed_recompute)} recompute, as its published runs "
                     f"trained; --recompute {','.join([*fw.unnamed_recompute, *others])} searches "
                     f"{' and '.join(others)} too")
    from shardwise.planner.estimate import release_note, split_note

    if later := release_note(job, layout):  # the winner uses a later release's opt-in flag, listed
        parts.append(f"the winner's {later}")
    if uneven := split_note(job, layout):  # a cut the stack builds only when told (helper-226)
        parts.append(f"the winner's {uneven}")
    if not getattr(args, "emit", None) and (unwritable := _emit_refusal(job, layout)):
        parts.append(unwritable)
    return "; ".join(parts)


def _emit_refusal(job, layout) -> str:
    """Where the stack the plan is for has a launch file `plan --emit` writes, and that file cannot hold the winner
    (DeepSpeed's JSON has no TP beside its pipeline, which Megatron-DeepSpeed runs): said, with what --emit then
    writes instead, so a winner is never mistaken for a file the stack's own config expresses."""
    from shardwise.emit import FRAMEWORK, TITLE, problem

    target = next((t for t, fw in FRAMEWORK.items() if fw == job.framework), None)
    why = problem(target, job, layout) if target is not None else None
    if why is None:
        return ""
    return (f"{TITLE[target]}'s own launch file cannot hold the winner (it needs {why}): plan --emit {target} writes "
            f"the fastest layout it can")


def job_from_args(args):
    """The planner's Job from --model/--cluster/--global-batch/--seq-len and the framework (+ software flags)."""
    from shardwise.planner.frameworks import DEFAULT_FRAMEWORK, get
    from shardwise.planner.job import make_job

    named = getattr(args, "framework", None)  # None only outside under_framework (e.g. a library caller)
    framework = get(DEFAULT_FRAMEWORK if named is None else named).name  # unknown (or empty) name: one line, exit 2
    capacity = getattr(args, "capacity_factor", 1.0)
    if not 1.0 <= capacity <= 1e3:
        raise InputError(f"--capacity-factor {capacity} must be between 1 (balanced routing) and 1000, e.g. 1.25")
    model = load_model(args.model)
    if capacity != 1.0 and not model.is_moe:
        raise UsageError(f"--capacity-factor {capacity:g} is the busiest expert's load over the mean, but {model.name} has "
                         f"no experts — drop it, or plan a mixture-of-experts model")
    precision = getattr(args, "precision", None) or "bf16"
    compiled = getattr(args, "compile", None)
    fused_norms = bool(getattr(args, "fused_norms", False))
    if compiled is None and get(framework).compiles_by_default(precision, fused_norms):
        compiled, args.compile_note = True, COMPILE_IMPLIED
    elif compiled is None and fused_norms and get(framework).compiles_by_default(precision):
        args.compile_note = ("eager, not torch.compile (--fused-norms describes a release that ran its model eager with "
                             "fused norm kernels; torchao's Float8 otherwise runs compiled)")
    cluster = load_cluster(args.cluster)
    if cluster.inferred:
        args.cluster_note = cluster.inferred
    elif (other := _calibrated_on_other(cluster, model, args.seq_len)):
        args.cluster_note = other
    if getattr(args, "gpus", None):  # the job's own GPUs: which groups exist, where they sit on nodes (comm.placement)
        cluster = replace(cluster, num_gpus=args.gpus)
    job = make_job(model, cluster, args.global_batch, args.seq_len, framework,
                   flash_attention=getattr(args, "flash_attention", None),
                   tp_comm_overlap=getattr(args, "tp_comm_overlap", None),
                   precision=precision,
                   fp8_params=bool(getattr(args, "fp8_params", False)),
                   compile=bool(compiled), compile_loss=getattr(args, "compile_loss", None),
                   fused_norms=bool(getattr(args, "fused_norms", False)),
                   attention_backend=getattr(args, "attention_backend", None),
                   offload=getattr(args, "offload", None) or "")
    job = replace(job, capacity_factor=capacity, **_moe_software(args, model, get(framework)))
    args.model_note = model_note(job)
    return job


def _moe_software(args, model, fw) -> dict:
    """--moe-dispatcher and --ep-comm-overlap, checked against the model and the stack (one line each, exit 2)."""
    dispatcher, overlap = getattr(args, "moe_dispatcher", None), bool(getattr(args, "ep_comm_overlap", False))
    named = [flag for flag, given in (("--moe-dispatcher", dispatcher), ("--ep-comm-overlap", overlap)) if given]
    if named and not model.is_moe:
        raise UsageError(f"{' and '.join(named)}: {model.name} has no experts — drop {'them' if len(named) > 1 else 'it'}, "
                         f"or plan a mixture-of-experts model")
    from shardwise.planner.frameworks import FRAMEWORKS

    if dispatcher and dispatcher not in fw.moe_dispatchers:
        runs = ", ".join(n for n, f in FRAMEWORKS.items() if dispatcher in f.moe_dispatchers)
        raise UsageError(f"--moe-dispatcher {dispatcher}: {fw.name} dispatches tokens only by "
                         f"{' or '.join(fw.moe_dispatchers)} — drop it, or pick a stack that runs it ({runs})")
    if overlap and not fw.ep_comm_overlap_available:
        runs = ", ".join(n for n, f in FRAMEWORKS.items() if f.ep_comm_overlap_available)
        raise UsageError(f"--ep-comm-overlap: {fw.name} does not overlap its expert all-to-alls with compute — drop it, "
                         f"or pick a stack that does ({runs})")
    return {"moe_dispatcher": dispatcher or "alltoall", "ep_comm_overlap": overlap}


SHORT = {"interleaved-1f1b": "i-1f1b", "selective": "sel", "none": "-"}  # narrow tables: schedule and recompute
WIDE = 118  # below this many columns the table gets short headers and values, so nothing is cut


def layout_table(estimates, title: str, width: int | None = None):
    """A rich table of ranked layout estimates (plan, estimate). Narrower than WIDE columns (a pipe, an 80-column
    terminal): short headers and values, no borders; at 80 columns no value is cut or folded but the layout, which,
    where even that is too wide (dp16384·tp4·pp16·ep16·v2·mb1), folds onto a second line. Narrower still, the layout,
    schedule and recompute fold and no number does; where the numbers alone are too wide, the least telling columns
    are left out, the caption says which (console.fit_table)."""
    from rich import box
    from rich.table import Table

    from shardwise.console import fit_table
    from shardwise.units import seconds

    gib = 2**30
    narrow = width is not None and width < WIDE
    short = (lambda text: SHORT.get(text, text)) if narrow else (lambda text: text)
    if narrow:
        table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0))
        headers = ("#", "layout", "sched", "Z", "rc", "SP", "GiB", "fits", "step", "tok/s", "MFU")
    else:
        table = Table(title=title)
        headers = ("#", "layout", "schedule", "ZeRO", "recompute", "SP", "mem GiB/GPU", "fits", "step", "tokens/s", "MFU")
    for col, just in zip(headers, ("right", "left", "left", "right", "left", "center", "right", "center", "right",
                                   "right", "right")):
        table.add_column(col, justify=just, no_wrap=col != "layout", overflow="fold")
    for i, e in enumerate(estimates, 1):
        lay = e.layout
        table.add_row(str(i), lay.describe() + (f" ({lay.cp_mode})" if lay.cp > 1 else ""),  # ring / allgather CP
                      short(lay.schedule) if lay.pp > 1 else "-", str(lay.zero),
                      short(lay.recompute) + (f":{lay.recompute_layers}" if lay.recompute_layers else ""),
                      "yes" if lay.sequence_parallel else "-", f"{e.memory_per_gpu / gib:.1f}",
                      "[green]yes[/]" if e.fits else "[red]no[/]", seconds(e.step_time),
                      _tokens(e.tokens_per_s, narrow), f"{e.mfu:.1%}")
    if narrow:  # text columns fold, numbers stay whole; where they alone are too wide, columns are left out
        gone = fit_table(table, width, text=(1, 2, 4), drop=(5, 3, 4, 2, 0, 8), sep="·")
        legend = {"sched": "i-1f1b: interleaved 1F1B", "Z": "Z: ZeRO stage",  # the abbreviations of the columns shown
                  "rc": "rc: recompute (sel: selective; full:N: N layers of each stage)", "tok/s": "M: million"}
        if not any(e.tokens_per_s >= 1e6 for e in estimates):  # no figure in millions to explain
            legend.pop("tok/s")
        said = [text for header, text in legend.items() if header not in gone]
        said += [f"left out to fit {width} columns: {', '.join(gone)} (--json has every field)"] if gone else []
        table.caption = "; ".join(said) or None
    return table


def _tokens(per_s: float, narrow: bool) -> str:
    """Tokens per second; in a narrow table a million or more as millions (a 16,384-GPU job's 2,169,782 would fold)."""
    return f"{per_s / 1e6:.2f}M" if narrow and per_s >= 1e6 else f"{per_s:,.0f}"


def breakdown_table(est, width: int | None = None):
    """Memory and time breakdown of one estimate, side by side; in `width` columns the names fold, no figure does."""
    from rich.table import Table

    from shardwise.console import fit_table
    from shardwise.units import seconds

    gib = 2**30
    table = Table(title=f"breakdown (worst pipeline rank {est.worst_rank})")
    table.add_column("memory", justify="left")
    table.add_column("GiB", justify="right")
    table.add_column("time", justify="left")
    table.add_column("", justify="right")
    mem, tim = list(est.memory_bytes.items()), list(est.time_s.items())
    for i in range(max(len(mem), len(tim))):
        mk, mv = mem[i] if i < len(mem) else ("", None)
        tk, tv = tim[i] if i < len(tim) else ("", None)
        table.add_row(mk, "" if mv is None else f"{mv / gib:.2f}", tk, "" if tv is None else seconds(tv))
    table.add_row("[b]total[/]", f"[b]{est.memory_per_gpu / gib:.2f}[/]", "[b]step[/]", f"[b]{seconds(est.step_time)}[/]")
    fit_table(table, width, text=(0, 2))
    return table


def print_explanation(console, paragraphs, title: str) -> None:
    """The title, then each paragraph as a bullet (console.print_wrapped)."""
    from shardwise.console import print_wrapped

    console.print(f"[b]{title}[/]")
    for text in paragraphs:
        print_wrapped(console, f"- {text}")


def prepare_output(path, flag: str, example: str = "out") -> None:
    """Create the folder an output file goes to, before any long work; a path we cannot write (a folder, a
    file where a folder must be, no permission) is a usage error."""
    from shardwise.paths import output_file

    output_file(path, flag, example)


def check_html_name(path, flag: str, existing: bool = True) -> None:
    """A report page goes to a file named .html (or .htm), as a browser opens it: a page written into notes.txt or a
    script's name would open as its source (os.devnull passes, to discard it). `existing` False: only a path that
    does not exist yet (checked before its folder is made; an existing one after the checks that name it better)."""
    if path is None or str(path) == os.devnull or os.path.isdir(path):  # a folder: output_file names it
        return
    if not existing and os.path.lexists(path):
        return
    if not str(path).lower().endswith((".html", ".htm")):
        raise UsageError(f"{flag} {path}: the report page's name must end in .html — e.g. report.html")


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")


def print_failure_json(args, message: str, code: int) -> None:
    """Under --json, what ended a command after it had started (a failed or an interrupted run): one JSON object on
    stdout, with a run's metrics file (where its finished steps are). Under torchrun rank 0 alone prints it. A refusal
    (exit 2) prints none: its one line is on stderr, before anything ran."""
    import os

    if not getattr(args, "json", False) or os.environ.get("RANK", "0") != "0":
        return
    out = {"error": message, "exit_code": code} | ({"metrics_file": args.metrics_file} if hasattr(args, "metrics_file") else {})
    try:
        print_json(out)
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):  # the reader went away, or stdout was closed
        pass


__all__ = ["add_model_arg", "add_cluster_args", "add_job_args", "add_layout_args", "layout_from_args",
           "dp_from_gpus", "print_json", "print_failure_json", "add_framework_arg", "add_software_args", "job_from_args", "under_framework",
           "layout_table", "breakdown_table", "print_explanation", "load_model", "load_cluster"]
