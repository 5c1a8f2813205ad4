"""The framework profiles by name (`--framework`), the default and its fallback, and the one check of a layout against
a stack (`check`: a refusal in one line). What a profile states: planner/framework.py; the profiles themselves:
planner/profiles/.
"""

from __future__ import annotations

from shardwise.errors import UsageError
from shardwise.planner.framework import CALIBRATED_STEP_OVERHEAD, Framework
from shardwise.planner.profiles.deepspeed import DEEPSPEED, DEEPSPEED_2024, DEEPSPEED_BF16, GPT_NEOX
from shardwise.planner.profiles.labs import ALEPH_ALPHA, FLASH_ATTN, INTERNEVO, LLAMA2, LLAMA3, NANOTRON
from shardwise.planner.profiles.megatron import MEGATRON_2021, MEGATRON_CORE, NEMO
from shardwise.planner.profiles.pytorch import AUTOMODEL, COMPOSER, COMPOSER_PURE, FMS_FSDP, LIT_GPT, TORCHTITAN
from shardwise.planner.profiles.shardwise import SHARDWISE
from shardwise.specs import Layout

__all__ = ["CALIBRATED_STEP_OVERHEAD", "DEFAULT_FRAMEWORK", "FALLBACK_FRAMEWORK", "FRAMEWORKS", "Framework", "PRECISIONS",
           "check", "default_note", "get"]


class _Profiles(dict):
    """The profiles by name; an unknown name is the one-line error that lists them."""

    def __missing__(self, name: str) -> Framework:
        raise UsageError(f"unknown framework '{name}' — choose one of {', '.join(self)}")


FRAMEWORKS = _Profiles({f.name: f for f in (MEGATRON_2021, MEGATRON_CORE, NEMO, DEEPSPEED, TORCHTITAN, LLAMA3, SHARDWISE,
                                        LLAMA2,
                                        DEEPSPEED_2024, DEEPSPEED_BF16, AUTOMODEL, COMPOSER, COMPOSER_PURE, LIT_GPT, FMS_FSDP,
                                        INTERNEVO, ALEPH_ALPHA, FLASH_ATTN, GPT_NEOX, NANOTRON)})
# The profile of a name (UsageError for an unknown one): the planner asks it hundreds of thousands of times a search,
# so it is the dict's own lookup, not a Python function around it (a few per cent of a 405B plan's search).
get = FRAMEWORKS.__getitem__
# --framework not given: torchtitan, PyTorch's own stack (FSDP2, torch.distributed.pipelining, SDPA) on the
# torch.distributed this project's runtime uses; where it cannot run what the other flags ask (ZeRO-1, DDP with TP or
# PP, plain TP without sequence parallelism, Transformer Engine's attention, ...), megatron-core, the
# profile that runs the most layouts (commands/common.py under_framework).
# Why not megatron-core first: its fused kernels make it one of the fastest profiles, and a layout-free plan under it
# claims 8-35 % more than tuned runs made with other stacks (benchmarks/plausibility.py: Llama 2 7B-70B and LLaMA 65B
# on 2,048 A100), where torchtitan's plans stay within 15 % of every case; a user of a faster stack names it.
DEFAULT_FRAMEWORK = "torchtitan"
FALLBACK_FRAMEWORK = "megatron-core"
DEFAULT_HELP = (f"the training stack that will run the job (default {DEFAULT_FRAMEWORK}: PyTorch's own stack, eager "
                "FSDP2 and torch pipelining, whose layout-free plans stay within 15 %% of the tuned published runs "
                f"checked; where it cannot run what the other flags ask, such as --zero 1, or (estimate) cannot hold the "
                f"layout in memory where {FALLBACK_FRAMEWORK}'s fused kernels can, {FALLBACK_FRAMEWORK} is "
                f"used instead, and the output says so. Faster stacks plan faster steps, so name the stack you "
                "run; 'shardwise' plans for this project's own runtime, the default on a --cluster profile "
                "`shardwise calibrate` measured). "
                "It sets what overlaps, the reduce dtype, the attention kernel, the bytes per parameter, and "
                "which layouts can run at all")


def default_note(fallback_reason: str | None = None, held: bool = False) -> str:
    """What `assumptions.implied` (and plan's note) say of the framework when --framework was not given; `held`: the
    default runs the layout but cannot hold it in memory (estimate's DoesNotFit), where the fallback can."""
    if fallback_reason is None:
        return (f"framework {DEFAULT_FRAMEWORK} (the default, --framework not given; a faster stack plans faster "
                f"steps: name the stack you run)")
    reason = fallback_reason.split(" — ")[0]  # the refusal's own words, without the command's framing
    for framing in ("cannot run this layout: ", "cannot run any layout the search allows: "):
        reason = reason.split(framing, 1)[-1]
    return (f"framework {FALLBACK_FRAMEWORK} (--framework not given, and the default {DEFAULT_FRAMEWORK} cannot "
            f"{'hold' if held else 'run'} this: {reason})")


def check(framework: Framework, layout: Layout, chunk_layers: int | None = None, num_layers: int | None = None,
          microbatches: int | None = None, flash_attention: bool = True, num_kv_heads: int | None = None,
          unfused_fix: str = "drop --no-flash-attention") -> None:
    """UsageError (one line, exit 2) when the stack cannot run the layout (with `chunk_layers`, the most layers a
    model chunk holds, also the --recompute-layers counts it can run; with `num_layers`, also its pipeline's cut; with
    `microbatches`, also whether it accumulates that many a step; with `flash_attention` False, also whether its
    context parallelism runs without the fused attention; with `num_kv_heads`, also whether it splits them over tp)."""
    given = (layout, chunk_layers, num_layers, microbatches, flash_attention, num_kv_heads, unfused_fix)
    reason = _refusal(framework, *given)
    if reason:
        later = FRAMEWORKS.get(framework.later_release)
        if later is not None and not _refusal(later, *given):  # the same stack's later releases run it: say so
            fix = f" — {later.name}, its later releases, runs it: --framework {later.name}"
        else:
            fix = "" if " — " in reason else " — change the layout or pick another --framework"
        raise UsageError(f"--framework {framework.name} cannot run this layout: {reason}{fix}")


def _refusal(framework: Framework, layout: Layout, chunk_layers: int | None, num_layers: int | None,
             microbatches: int | None, flash_attention: bool, num_kv_heads: int | None, unfused_fix: str) -> str | None:
    return (framework.refusal(layout, num_layers, microbatches)
            or (framework.partial_refusal(layout, chunk_layers) if chunk_layers else None)
            or framework.attention_refusal(layout, flash_attention, unfused_fix)
            or (framework.kv_refusal(num_kv_heads, layout.tp) if num_kv_heads else None))


PRECISIONS = ("bf16", "fp8")
