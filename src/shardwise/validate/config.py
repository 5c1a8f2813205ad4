"""What a validation runs: its options, its layouts (parsed, swept, checked, named)."""

from __future__ import annotations

from dataclasses import dataclass

from shardwise.errors import UsageError
from shardwise.specs import (CP_MODES, RECOMPUTE, SCHEDULES, ClusterSpec, Layout, ModelSpec, default_schedule,
                             validate_layout)


@dataclass(frozen=True)
class ValidateConfig:
    model: ModelSpec
    cluster: ClusterSpec
    world: int = 2
    layouts: tuple[Layout, ...] = ()  # empty: default_layouts()
    global_batch: int = 8
    seq_len: int = 64
    steps: int = 5  # timed steps per layout and round
    repeats: int = 5  # rounds
    warmup: int = 2  # untimed steps per layout before the first round
    backend: str = "gloo"
    seed: int = 0
    timeout_s: float = 300.0


def parse_layout(text: str, world: int) -> Layout:
    """'dp2', 'tp2:sp', 'pp2:gpipe:mb2', 'pp2:interleaved-1f1b:v2', 'dp2:zero3:full', 'cp2:allgather' -> Layout."""
    return Layout(**layout_fields(text, world))


def layout_fields(text: str, world: int) -> dict:
    """The Layout fields a layout's text names, "schedule" always set ("vpp" only where named).

    Parts (':'-separated): dpN tpN ppN cpN epN etpN mbN vN zeroN, sp, a recompute policy (none, selective, full),
    a schedule name, a context-parallel mode (ring, allgather). dp defaults to world / (tp * pp * cp)."""
    fields: dict = {}
    for part in filter(None, text.strip().lower().split(":")):
        key = next((k for k in ("zero", "dp", "tp", "pp", "cp", "etp", "ep", "mb", "v")
                    if part.startswith(k) and part[len(k):].isdigit()), None)
        named = {"mb": "micro_batch", "v": "vpp"}.get(key, key) if key else (
            "cp_mode" if part in CP_MODES else "recompute" if part in RECOMPUTE else "schedule" if part in SCHEDULES
            else "sequence_parallel" if part == "sp" else None)
        if named in fields:  # 'tp2:sp:sp', 'zero1:zero3': a typo, not a layout
            what = {"zero": "ZeRO stage", "micro_batch": "micro-batch", "vpp": "virtual stages", "cp_mode":
                    "context-parallel mode", "recompute": "recompute policy", "sequence_parallel": "sequence "
                    "parallelism"}.get(named, named)
            raise UsageError(f"layout '{text}' names its {what} twice ('{part}') — name each part once")
        if key:
            fields[{"mb": "micro_batch", "v": "vpp"}.get(key, key)] = int(part[len(key):])
        elif part in CP_MODES:
            fields["cp_mode"] = part
        elif part in RECOMPUTE:
            fields["recompute"] = part
        elif part in SCHEDULES:
            fields["schedule"] = part
        elif part == "sp":
            fields["sequence_parallel"] = True
        else:
            raise UsageError(f"layout '{text}': unknown part '{part}' — use dpN tpN ppN cpN epN etpN mbN vN zeroN sp, "
                             f"{'/'.join(RECOMPUTE)}, {'/'.join(CP_MODES)} or a schedule ({', '.join(SCHEDULES)})")
    zero = [k for k in ("dp", "tp", "pp", "cp", "ep", "etp", "micro_batch", "vpp") if fields.get(k, 1) < 1]
    if zero:
        raise UsageError(f"layout '{text}': a degree of 0 ('{zero[0]}') — each of dpN tpN ppN cpN epN etpN mbN vN is 1 "
                         f"or more")
    tp, pp, cp = fields.get("tp", 1), fields.get("pp", 1), fields.get("cp", 1)
    if "dp" not in fields:
        if world % (tp * pp * cp):
            raise UsageError(f"layout '{text}': tp*pp*cp = {tp * pp * cp} does not divide the world of {world}")
        fields["dp"] = world // (tp * pp * cp)
    product = fields["dp"] * tp * pp * cp
    if product != world:  # every layout uses all of the sweep's ranks
        raise UsageError(f"layout '{text}': dp*tp*pp*cp = {product}, and the sweep runs {world} ranks (--world) — "
                         f"give degrees whose product is {world}, or leave dp out to fill the rest")
    fields.setdefault("schedule", default_schedule(fields.get("vpp", 1)))
    return fields


def default_layouts(model: ModelSpec, world: int, global_batch: int, seq_len: int, backend: str = "gloo") -> list[Layout]:
    """Every dp x tp x pp split of the world, and around each: ZeRO stages, recompute, sequence
    parallelism, every pipeline schedule, a bigger micro-batch and a MoE model's expert splits; and the
    context-parallel splits (ring and all-gather) — those this job can run on `backend`'s devices."""
    from shardwise.specs import divisors

    out = []
    for tp in divisors(world):
        for pp in divisors(world // tp):
            for cp in divisors(world // (tp * pp))[1:]:  # the sequence split too: ring and all-gather
                base = Layout(dp=world // (tp * pp * cp), tp=tp, pp=pp, cp=cp)
                out += [v for v in (base, base.with_(cp_mode="allgather")) if _runnable(v, model, world, global_batch, seq_len, backend)]
            base = Layout(dp=world // (tp * pp), tp=tp, pp=pp)
            variants = [base, base.with_(micro_batch=2)] + [base.with_(recompute=r) for r in RECOMPUTE[1:]]
            if base.dp > 1:
                variants += [base.with_(zero=z) for z in (1, 2, 3)]
            if tp > 1:
                variants.append(base.with_(sequence_parallel=True))
            if pp > 1:
                variants += [base.with_(schedule=s, vpp=2 if s == "interleaved-1f1b" else 1)
                             for s in SCHEDULES if s != base.schedule]
            variants += _expert_variants(base, model)
            out += [v for v in variants if _runnable(v, model, world, global_batch, seq_len, backend)]
    return list(dict.fromkeys(out))


def _expert_variants(base: Layout, model: ModelSpec) -> list[Layout]:
    """A MoE model's experts split over every rank of a stage (ep = dp x tp: its all-to-alls), also under ZeRO-3
    (the dense weights sharded over dp, the experts over their own replicas where they have any), and each
    expert's width split over tp (etp)."""
    if not model.is_moe:
        return []
    ranks = base.dp * base.tp
    out = [base.with_(ep=ranks)] if ranks > 1 else []
    out += [base.with_(ep=ranks, zero=3)] if base.dp > 1 else []
    return out + ([base.with_(etp=base.tp)] if base.tp > 1 else [])


def _runnable(layout: Layout, model: ModelSpec, world: int, global_batch: int, seq_len: int, backend: str) -> bool:
    try:
        check_layout(layout, model, world, global_batch, seq_len, backend)
    except UsageError:
        return False
    return True


def check_layout(layout: Layout, model: ModelSpec, world: int, global_batch: int, seq_len: int,
                 backend: str = "gloo") -> None:
    """The planner's and the runtime's checks (UsageError naming the layout), on `backend`'s devices (NCCL: the GPUs'
    count and free memory; gloo: this machine's memory)."""
    from shardwise import preflight
    from shardwise.launch import check
    from shardwise.train import TrainConfig

    try:
        validate_layout(layout, model, global_batch, world)
        cfg = TrainConfig(spec=model, layout=layout, steps=1, global_batch=global_batch, seq_len=seq_len, memory_check=False,
                          backend=backend)
        check(cfg)
        # validate has no flag to skip the memory check: name only the fixes it has
        preflight.check_memory(cfg, fix="use a smaller --model, --global-batch or --seq-len, or leave this layout out",
                               override="")
    except UsageError as exc:
        raise UsageError(f"layout {describe(layout)}: {exc}") from None


def describe(lay: Layout) -> str:
    """A short unique name: the split, then what differs from the defaults."""
    parts = [f"dp{lay.dp}", f"tp{lay.tp}", f"pp{lay.pp}"] + ([f"cp{lay.cp} {lay.cp_mode}"] if lay.cp > 1 else [])
    parts += [f"ep{lay.ep}"] if lay.ep > 1 else []
    parts += [f"etp{lay.etp}"] if lay.etp > 1 else []
    parts.append(f"mb{lay.micro_batch}")
    if lay.pp > 1:
        parts.append(lay.schedule + (f" v{lay.vpp}" if lay.vpp > 1 else ""))
    if lay.zero:
        parts.append(f"zero{lay.zero}")
    if lay.recompute != "none":
        parts.append(f"{lay.recompute} recompute")
    if lay.sequence_parallel:
        parts.append("sp")
    return " ".join(parts)
