"""Predicted vs measured: train a sweep of real layouts for a few steps and score the planner.

    result = validate(ValidateConfig(model=load_model("tiny"), cluster=load_cluster("profile.toml"), world=2))
    result["summary"]  # median_abs_error, p90_abs_error, spearman, kendall_tau, top1_regret, best_in_top3

All layouts run in one world of `world` ranks (one thread each). Each is built once (its own mesh,
runtime and optimizer, from the same seed) and warmed up; then `repeats` rounds each run every layout
for `steps` timed steps, in a new random order per round (the same on every rank), so slow drifts of
a shared machine spread over all layouts instead of biasing one. A timed step starts at a barrier
and lasts as long as its slowest rank; a layout's time is the median of its steps. A layout whose
spread (interquartile range / median) exceeds NOISY runs one more round; if still noisy it is flagged.

Memory, per rank after one more (untimed) step: parameters, gradients and optimizer states as
allocated, plus the peak of the bytes autograd saves for backward (parameters excluded) — against
the planner's weights + gradients + optimizer + activations + logits of its worst rank (its
workspace and fragmentation allowances are GPU-allocator terms, not compared here).
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, replace

from shardwise.errors import UsageError
from shardwise.specs import SCHEDULES, ClusterSpec, Layout, ModelSpec, TrainSpec, validate_layout

NOISY = 0.25
STATE_KEYS = ("weights", "gradients", "optimizer", "activations")


@dataclass(frozen=True)
class ValidateConfig:
    model: ModelSpec
    cluster: ClusterSpec
    world: int = 2
    layouts: tuple[Layout, ...] = ()  # empty: default_layouts()
    global_batch: int = 8
    seq_len: int = 64
    steps: int = 5  # timed steps per layout and round
    repeats: int = 3  # rounds
    warmup: int = 2  # untimed steps per layout before the first round
    backend: str = "gloo"
    seed: int = 0
    timeout_s: float = 300.0


# --------------------------------------------------------------------------- which layouts


def parse_layout(text: str, world: int) -> Layout:
    """'dp2', 'tp2:sp', 'pp2:gpipe:mb2', 'pp2:interleaved-1f1b:v2', 'dp2:zero3:full' -> Layout.

    Parts (':'-separated): dpN tpN ppN mbN vN zeroN, sp, a recompute policy (none, selective, full),
    a schedule name. dp defaults to world / (tp * pp)."""
    fields: dict = {}
    for part in filter(None, text.strip().lower().split(":")):
        key = next((k for k in ("zero", "dp", "tp", "pp", "mb", "v") if part.startswith(k) and part[len(k):].isdigit()), None)
        if key:
            fields[{"mb": "micro_batch", "v": "vpp"}.get(key, key)] = int(part[len(key):])
        elif part in ("none", "selective", "full"):
            fields["recompute"] = part
        elif part in SCHEDULES:
            fields["schedule"] = part
        elif part == "sp":
            fields["sequence_parallel"] = True
        else:
            raise UsageError(f"layout '{text}': unknown part '{part}' — use dpN tpN ppN mbN vN zeroN sp, "
                             f"none/selective/full or a schedule ({', '.join(SCHEDULES)})")
    tp, pp = fields.get("tp", 1), fields.get("pp", 1)
    if "dp" not in fields:
        if world % (tp * pp):
            raise UsageError(f"layout '{text}': tp*pp = {tp * pp} does not divide the world of {world}")
        fields["dp"] = world // (tp * pp)
    if fields.get("vpp", 1) > 1:
        fields.setdefault("schedule", "interleaved-1f1b")
    return Layout(**fields)


def default_layouts(model: ModelSpec, world: int, global_batch: int, seq_len: int) -> list[Layout]:
    """Every dp x tp x pp split of the world, and around each: ZeRO stages, recompute, sequence
    parallelism, every pipeline schedule, and a bigger micro-batch — those this job can run."""
    from shardwise.specs import divisors

    out = []
    for tp in divisors(world):
        for pp in divisors(world // tp):
            base = Layout(dp=world // (tp * pp), tp=tp, pp=pp)
            variants = [base, base.with_(micro_batch=2), base.with_(recompute="selective"), base.with_(recompute="full")]
            if base.dp > 1:
                variants += [base.with_(zero=z) for z in (1, 2, 3)]
            if tp > 1:
                variants.append(base.with_(sequence_parallel=True))
            if pp > 1:
                variants += [base.with_(schedule=s) for s in ("naive", "gpipe", "zb-h1")]
                variants.append(base.with_(schedule="interleaved-1f1b", vpp=2))
            out += [v for v in variants if _runnable(v, model, world, global_batch, seq_len)]
    return list(dict.fromkeys(out))


def _runnable(layout: Layout, model: ModelSpec, world: int, global_batch: int, seq_len: int) -> bool:
    try:
        check_layout(layout, model, world, global_batch, seq_len)
    except UsageError:
        return False
    return True


def check_layout(layout: Layout, model: ModelSpec, world: int, global_batch: int, seq_len: int) -> None:
    """The planner's and the runtime's checks (UsageError naming the layout)."""
    from shardwise.launch import check
    from shardwise.train import TrainConfig

    try:
        validate_layout(layout, model, global_batch, world)
        check(TrainConfig(spec=model, layout=layout, steps=1, global_batch=global_batch, seq_len=seq_len))
    except UsageError as exc:
        raise UsageError(f"layout {describe(layout)}: {exc}") from None


def describe(lay: Layout) -> str:
    """A short unique name: the split, then what differs from the defaults."""
    parts = [f"dp{lay.dp}", f"tp{lay.tp}", f"pp{lay.pp}", f"mb{lay.micro_batch}"]
    if lay.pp > 1:
        parts.append(lay.schedule + (f" v{lay.vpp}" if lay.vpp > 1 else ""))
    if lay.zero:
        parts.append(f"zero{lay.zero}")
    if lay.recompute != "none":
        parts.append(f"{lay.recompute} recompute")
    if lay.sequence_parallel:
        parts.append("sp")
    return " ".join(parts)


# --------------------------------------------------------------------------- predictions


def planner_job(cfg: ValidateConfig):
    """The planner's view of the runtime: fp32 AdamW states on CPU (bf16 activations under autocast
    on GPU), SDPA's fused attention, and the tensors shardwise's model saves for backward."""
    from shardwise.planner.memory import SHARDWISE_RUNTIME, Job

    train = TrainSpec(cfg.global_batch, cfg.seq_len, weight_bytes=4, grad_bytes=4, optimizer_bytes=8,
                      activation_bytes=2 if cfg.backend == "nccl" else 4)
    return Job(cfg.model, cfg.cluster, train, flash_attention=True, saved=SHARDWISE_RUNTIME)


def predict(cfg: ValidateConfig, layout: Layout) -> dict:
    from shardwise.planner import estimate

    est = estimate(planner_job(cfg), layout)
    memory = {k: est.memory_bytes[k] for k in ("weights", "gradients", "optimizer")}
    memory["activations"] = est.memory_bytes["activations"] + est.memory_bytes.get("logits", 0.0)
    return {"step_time_s": est.step_time, "memory": memory, "total_bytes": est.memory_per_gpu}


# --------------------------------------------------------------------------- measurements (every rank)


def _storage(t) -> int:
    """The storage address of `t`; 0 for a freed storage (FSDP's resharded parameters)."""
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:
        return 0


class SavedActivations:
    """Peak bytes autograd saves for backward, by key (a micro-batch or a (micro-batch, chunk)).

    Parameters and buffers are excluded by storage, looked up when a tensor is saved, so FSDP's
    gathered parameters count as parameters too. A tensor saved by several ops counts once.
    Same interface as the pipeline executor's `saved` (hooks(key), release(key))."""

    def __init__(self, modules):
        self.modules, self.held, self.current, self.peak = modules, {}, 0, 0

    def _constants(self) -> set:
        return {_storage(t) for m in self.modules for t in (*m.parameters(), *m.buffers())}

    def hooks(self, key):
        import torch

        self.held.setdefault(key, 0)
        constants, seen = self._constants(), set()

        def pack(t):
            ident = (_storage(t), t.storage_offset(), t.numel())
            if ident[0] not in constants and ident not in seen:
                seen.add(ident)
                nbytes = t.numel() * t.element_size()
                self.held[key] += nbytes
                self.current += nbytes
                self.peak = max(self.peak, self.current)
            return t

        return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)

    def release(self, key):
        self.current -= self.held.pop(key, 0)


def _local_bytes(t) -> int:
    from torch.distributed.tensor import DTensor

    t = t.to_local() if isinstance(t, DTensor) else t
    return t.numel() * t.element_size()


def measure_memory(rt) -> dict:
    """One untimed step with saved-tensor accounting, then the states this rank holds (bytes).
    On a GPU also the caching allocator's peak over that step ("allocator_peak")."""
    import torch

    from shardwise.train import train_step

    cuda = rt.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    models = rt.models
    counter = SavedActivations(models)
    executor = getattr(rt.forward_backward, "executor", None)
    if executor is not None:  # the pipeline executor keys by (micro-batch, chunk) and releases after backward
        executor.saved = counter
        train_step(rt)
        executor.saved = None
    else:  # micro-batches run forward then backward one at a time: a new forward releases the last one
        state = {"n": 0, "ctx": None}

        def pre(module, args):
            counter.release(state["n"] - 1)
            state["ctx"] = counter.hooks(state["n"])
            state["ctx"].__enter__()

        def post(module, args, output):
            state["ctx"].__exit__(None, None, None)
            state["n"] += 1

        handles = [models[0].register_forward_pre_hook(pre), models[0].register_forward_hook(post)]
        try:
            train_step(rt)
        finally:
            for h in handles:
                h.remove()
    params = {id(p): p for m in models for p in m.parameters()}.values()
    opt = getattr(rt.optimizer, "optim", rt.optimizer)  # ZeroRedundancyOptimizer keeps its shard's optimizer
    optim = sum(_local_bytes(v) for s in opt.state.values() for v in s.values() if hasattr(v, "numel"))
    return {"weights": sum(_local_bytes(p) for p in params),
            "gradients": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
            "optimizer": optim, "activations": counter.peak,
            "allocator_peak": torch.cuda.max_memory_allocated() if cuda else 0}


def _timed_steps(rt, steps: int, world: int) -> list[float]:
    import torch
    import torch.distributed as dist

    from shardwise.train import train_step

    out = []
    for _ in range(steps):
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        train_step(rt)  # ends with .item() of the loss: the step's work is done
        if rt.device.type == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def _slowest(values: list[float], world: int, op: str = "max") -> list[float]:
    """Element-wise max over ranks."""
    import torch
    import torch.distributed as dist

    if world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def run_rank(cfg: ValidateConfig, rank: int, world: int, report) -> list[dict] | None:
    """Every layout on this rank: build, warm up, timed rounds in random order, memory."""
    import torch

    from shardwise.parallel import build_mesh
    from shardwise.train import TrainConfig, build_runtime, train_step

    torch.manual_seed(cfg.seed)
    runtimes = []
    for lay in cfg.layouts:
        tcfg = TrainConfig(spec=cfg.model, layout=lay, steps=10**6, global_batch=cfg.global_batch,
                           seq_len=cfg.seq_len, seed=cfg.seed, backend=cfg.backend, timeout_s=cfg.timeout_s,
                           progress=False)
        mesh = build_mesh(lay.pp, lay.dp, lay.tp, backend=cfg.backend, timeout_s=cfg.timeout_s) if world > 1 else None
        rt = build_runtime(tcfg, mesh)
        for _ in range(cfg.warmup):
            train_step(rt)
        runtimes.append(rt)
        report(f"built {describe(lay)}")
    order, times = random.Random(cfg.seed), [[] for _ in runtimes]

    def round_of(indices):
        indices = list(indices)
        order.shuffle(indices)
        for i in indices:
            times[i] += _slowest(_timed_steps(runtimes[i], cfg.steps, world), world)
            report(f"timed {describe(cfg.layouts[i])}")

    for _ in range(cfg.repeats):
        round_of(range(len(runtimes)))
    round_of(i for i, ts in enumerate(times) if spread(ts) > NOISY)  # every rank has the same times
    out = []
    for i, rt in enumerate(runtimes):
        mem = measure_memory(rt)
        states = [float(mem[k]) for k in STATE_KEYS]
        worst = _slowest(states + [sum(states), float(mem["allocator_peak"])], world)
        out.append({"times": times[i], "memory": dict(zip(STATE_KEYS, worst[:4])), "memory_total": worst[4],
                    "allocator_peak": worst[5]})
        report(f"memory {describe(cfg.layouts[i])}")
    return out if rank == 0 else None


# --------------------------------------------------------------------------- statistics


def spread(times: list[float]) -> float:
    """Interquartile range / median."""
    if len(times) < 2:
        return 0.0
    s = sorted(times)
    return (quantile(s, 0.75) - quantile(s, 0.25)) / statistics.median(s)


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _ranks(xs: list[float]) -> list[float]:
    """1-based ranks, ties get their average rank."""
    order = sorted(range(len(xs)), key=xs.__getitem__)
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    """Pearson correlation of the ranks."""
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = (sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)) ** 0.5
    return cov / var if var else 0.0


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-b (ties in either list are neither concordant nor discordant)."""
    conc = disc = ties_a = ties_b = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            da, db = a[i] - a[j], b[i] - b[j]
            if da == 0 and db == 0:
                continue
            if da == 0:
                ties_a += 1
            elif db == 0:
                ties_b += 1
            elif (da > 0) == (db > 0):
                conc += 1
            else:
                disc += 1
    den = ((conc + disc + ties_a) * (conc + disc + ties_b)) ** 0.5
    return (conc - disc) / den if den else 0.0


def summarize(predicted: list[float], measured: list[float]) -> dict:
    """The contract's summary of step times (errors are fractions of the measured time)."""
    errors = [abs(p - m) / m for p, m in zip(predicted, measured)]
    pick = min(range(len(predicted)), key=predicted.__getitem__)
    best = min(range(len(measured)), key=measured.__getitem__)
    top3 = sorted(range(len(predicted)), key=predicted.__getitem__)[:3]
    return {"median_abs_error": statistics.median(errors), "p90_abs_error": quantile(errors, 0.9),
            "spearman": spearman(predicted, measured), "kendall_tau": kendall_tau(predicted, measured),
            "top1_regret": measured[pick] / measured[best] - 1, "best_in_top3": best in top3}


# --------------------------------------------------------------------------- the whole sweep


def validate(cfg: ValidateConfig, report=lambda label: None) -> dict | None:
    """Run the sweep; the report dict on rank 0 (None on other torchrun ranks)."""
    from shardwise.calibrate.launch import run_ranks

    if not cfg.layouts:
        cfg = replace(cfg, layouts=tuple(default_layouts(cfg.model, cfg.world, cfg.global_batch, cfg.seq_len)))
    runs = run_ranks(run_rank, cfg, cfg.world, cfg.backend, cfg.timeout_s, report)
    if runs is None:
        return None
    layouts = []
    for lay, run in zip(cfg.layouts, runs):
        pred = predict(cfg, lay)
        layouts.append({
            "name": describe(lay), **lay.to_dict(),
            "predicted_step_time_s": pred["step_time_s"], "measured_step_time_s": statistics.median(run["times"]),
            "step_time_spread": spread(run["times"]), "noisy": spread(run["times"]) > NOISY,
            "timed_steps": len(run["times"]),
            "predicted_memory_bytes": sum(pred["memory"].values()), "measured_memory_bytes": run["memory_total"],
            "predicted_memory": pred["memory"], "measured_memory": run["memory"],
        })
        if run["allocator_peak"]:  # GPU: torch.cuda.max_memory_allocated over a step vs the planner's total
            layouts[-1].update(measured_allocator_peak_bytes=run["allocator_peak"],
                               predicted_total_bytes=pred["total_bytes"])
    summary = summarize([x["predicted_step_time_s"] for x in layouts], [x["measured_step_time_s"] for x in layouts])
    mem_errors = [abs(x["predicted_memory_bytes"] - x["measured_memory_bytes"]) / x["measured_memory_bytes"] for x in layouts]
    summary.update(memory_median_abs_error=statistics.median(mem_errors), memory_p90_abs_error=quantile(mem_errors, 0.9),
                   noisy_layouts=sum(x["noisy"] for x in layouts))
    calibrated = {k: cfg.cluster.measured[k] for k in ("matmul_tflops", "model_tflops", "layer_overhead_s")
                  if k in (cfg.cluster.measured or {})}
    return {"model": cfg.model.name, "world": cfg.world, "backend": cfg.backend, "cluster": cfg.cluster.name,
            "calibration": calibrated,
            "global_batch": cfg.global_batch, "seq_len": cfg.seq_len, "steps": cfg.steps, "repeats": cfg.repeats,
            "layouts": layouts, "summary": summary}


def plot(result: dict, path: str) -> None:
    """Predicted vs measured step time (scatter, y = x line) and per-layout bars of both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lays = sorted(result["layouts"], key=lambda x: x["measured_step_time_s"])
    pred = [1e3 * x["predicted_step_time_s"] for x in lays]
    meas = [1e3 * x["measured_step_time_s"] for x in lays]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, max(4.5, 0.32 * len(lays) + 1.5)),
                                   gridspec_kw={"width_ratios": [1, 1.4]})
    ax1.scatter(meas, pred, color="tab:blue")
    hi = max(pred + meas) * 1.08
    ax1.plot([0, hi], [0, hi], color="grey", lw=1, ls="--", label="predicted = measured")
    ax1.set(xlim=(0, hi), ylim=(0, hi), xlabel="measured step time (ms)", ylabel="predicted step time (ms)")
    s = result["summary"]
    ax1.set_title(f"{result['model']} on {result['world']} ranks ({result['backend']}): median error "
                  f"{100 * s['median_abs_error']:.1f} %, Kendall τ {s['kendall_tau']:.2f}", fontsize=10)
    ax1.legend(loc="upper left")
    y = range(len(lays))
    ax2.barh([i + 0.2 for i in y], meas, height=0.4, label="measured", color="tab:orange")
    ax2.barh([i - 0.2 for i in y], pred, height=0.4, label="predicted", color="tab:blue")
    ax2.set_yticks(list(y), [x["name"] for x in lays], fontsize=8)
    ax2.set_xlabel("step time (ms)")
    ax2.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
