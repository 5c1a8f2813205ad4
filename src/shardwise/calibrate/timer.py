"""One timing discipline for every measurement a rank runs: warm-up, a barrier before every timed repeat, the median
of the repeats (`Timer`); the reference workload that tracks the machine's speed (`reference`)."""

from __future__ import annotations

import math
import statistics
import time

import torch
import torch.distributed as dist

from shardwise import precision
from shardwise.calibrate.config import MODEL_LAYERS, MODEL_ROUNDS, CalibrateConfig


# Small operations run back to back in batches lasting at least this long, so that each repeat holds
# its share of the machine's scheduling hiccups (a rank descheduled for a 4 ms tick stalls a collective)
# as a training step of many such operations does; the median over repeats then drops only rare outliers.
MIN_REPEAT_S = 20e-3


MAX_INNER = 1000


# A measurement whose interquartile range exceeds this share of its median is measured once more
# (the quieter of the two is kept) and, if still noisy, flagged in the profile.
NOISY = 0.5


# Rounds of the in-context measurements (measure_sync, measure_fsdp), their variants alternating.
SYNC_ROUNDS = 5


class Timer:
    """This rank's device, dtype and timing discipline; reductions agree a figure across ranks."""

    def __init__(self, cfg: CalibrateConfig, rank: int, world: int, mesh=None):
        self.cfg, self.rank, self.world = cfg, rank, world
        cuda = cfg.device_type == "cuda"
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        self.dtype = precision.compute_dtype(self.device.type, cfg.dtype)
        self._mesh, self._tp_mesh = mesh, None

    def mesh(self):
        """The data-parallel mesh (dp = world) every measurement that needs one shares, built on first use
        (collective): one mesh, as a `train` job holds one. Each of its gloo groups keeps a thread that wakes 100 times
        a second, and the number of such threads changes how fast a CPU rank computes (validate.measure.mesh_split)."""
        if self._mesh is None:
            from shardwise.parallel import build_mesh

            self._mesh = build_mesh(1, self.world, 1, backend=self.cfg.backend, timeout_s=self.cfg.timeout_s)
        return self._mesh

    def tp_mesh(self):
        """The same ranks as one tensor-parallel group (tp = world), on the data-parallel mesh's groups: it adds no
        process group (no gloo thread) to the calibration, as validate's layouts share theirs."""
        if self._tp_mesh is None:
            from shardwise.parallel.mesh import moved

            self._tp_mesh = moved(self.mesh(), "dp", "tp")
        return self._tp_mesh

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def reduce(self, values: list[float], op: str) -> list[float]:
        """Element-wise 'max' or 'mean' over ranks (a collective's repeat lasts as long as its slowest rank)."""
        if self.world == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64 if self.device.type == "cpu" else torch.float32, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return [float(v) / (self.world if op == "mean" else 1) for v in t.cpu()]

    def times(self, fn) -> list[float]:
        """Seconds per call for each timed repeat; calls shorter than MIN_REPEAT_S run `inner` times a repeat."""
        for _ in range(self.cfg.warmup):
            fn()
        self.sync()
        self.barrier()
        t0 = time.perf_counter()
        fn()
        self.sync()
        once = time.perf_counter() - t0
        inner = int(self.reduce([min(MAX_INNER, math.ceil(MIN_REPEAT_S / max(once, 1e-9)))], "max")[0])
        out = []
        for _ in range(self.cfg.repeats):
            self.barrier()
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            self.sync()
            out.append((time.perf_counter() - t0) / inner)
        return out

    def interleaved(self, fns: dict, repeats: int, seed: int = 0, barrier_each: bool = False) -> dict:
        """Seconds per call of each of `fns` in each of `repeats` repeats, as long as the slowest rank: every
        repeat starts at a barrier and runs every function (`inner` calls each, so each lasts about
        MIN_REPEAT_S) back to back, in a new order (the same on every rank). A busy moment of a shared
        machine then falls on all of them within ~0.1 s, so their differences and ratios, taken repeat by
        repeat (`paired`), hold even when the load moves their absolute times by 2x between repeats.
        `barrier_each`: a barrier before every function too (for a function that some ranks skip, so the
        others wait instead of running the next one beside it)."""
        import random

        names = list(fns)
        for name in names:
            for _ in range(max(self.cfg.warmup, 1)):
                fns[name]()
        self.sync()
        once = []
        for name in names:
            self.barrier()
            t0 = time.perf_counter()
            fns[name]()
            self.sync()
            once.append(time.perf_counter() - t0)
        # From the slowest rank's call (a function some ranks skip takes its length from the others).
        inner = [min(MAX_INNER, math.ceil(MIN_REPEAT_S / max(o, 1e-9))) for o in self.reduce(once, "max")]
        order, rows = random.Random(seed), []
        for _ in range(repeats):
            row = [0.0] * len(names)
            self.barrier()
            for i in order.sample(range(len(names)), len(names)):
                if barrier_each:
                    self.barrier()
                t0 = time.perf_counter()
                for _ in range(inner[i]):
                    fns[names[i]]()
                self.sync()
                row[i] = (time.perf_counter() - t0) / inner[i]
            rows.append(row)
        flat = self.reduce([x for row in rows for x in row], "max")
        return {name: flat[i::len(names)] for i, name in enumerate(names)}


def paired(reps: dict, a: str, b: str) -> float:
    """Median over repeats of reps[a] - reps[b] (measured side by side in each repeat: Timer.interleaved)."""
    return statistics.median(x - y for x, y in zip(reps[a], reps[b]))


def in_rounds(t: Timer, fns: dict, repeats: int, label: str, **kw):
    """Timer.interleaved over `fns` in MODEL_ROUNDS parts of about repeats / MODEL_ROUNDS repeats, yielding `label`
    after each: measure_rank runs one part in each of its rounds, beside the model's, so a per-call cost holds the
    same spread of the machine's load as the model's rate (measured in one stretch of a few seconds, a neighbour's
    burst moved a whole figure: p2p_sync_s 3.8 and 1.8 ms, fsdp_call_s 3.5 and 2.2 ms in two calibrations of one
    job). Returns every part's repeats pooled, each as Timer.interleaved gives them."""
    reps: dict = {name: [] for name in fns}
    for r in range(MODEL_ROUNDS):
        for name, times in t.interleaved(fns, repeats // MODEL_ROUNDS + (r < repeats % MODEL_ROUNDS), seed=r,
                                         **kw).items():
            reps[name] += times
        yield f"{label}, round {r + 1} of {MODEL_ROUNDS}"
    return reps


def spread(times: list[float]) -> float:
    """Interquartile range / median."""
    s = sorted(times)
    med = statistics.median(s)
    return (s[(3 * len(s)) // 4] - s[len(s) // 4]) / med if med > 0 else 0.0


def reference(t: Timer, tokens: int = 0):
    """The reference workload: the runtime's model (at most MODEL_LAYERS layers and the LM head), forward +
    backward on micro_batch x seq_len tokens (or one sequence of `tokens`); returns the function that runs it once.
    measure_model times it as "none <micro_batch>" (Profile.reference_s) and, on a GPU, at HOST_FLOOR_TOKENS as
    "floor model" (the host's floor); validate times them again between its rounds."""
    from shardwise.model import Transformer

    spec = t.cfg.model
    model = Transformer(spec, seed=0, layer_ids=range(min(spec.num_layers, MODEL_LAYERS)), device=t.device)
    shape = (1, tokens) if tokens else (t.cfg.micro_batch, t.cfg.seq_len)
    x = torch.randint(0, spec.vocab_size, shape, device=t.device)

    def run():
        with autocast_for(t):
            loss = model(x, x)
        loss.backward()
    return run


def autocast_for(t: Timer):
    """The training loop's autocast (shardwise.precision) where the timer measures in BF16 (a GPU): the runtime's
    weights stay fp32 and every measured forward runs under it, else a bf16 input meets fp32 norm weights."""
    return precision.autocast(t.device.type, t.cfg.dtype)


def element_size(dtype) -> int:
    return dtype.itemsize
