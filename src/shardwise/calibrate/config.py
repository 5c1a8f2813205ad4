"""What a calibration measures: the options, their checks, and the model's GEMM shapes (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardwise.errors import UsageError
from shardwise.specs import ModelSpec

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv")
DEFAULT_SIZES = {"cpu": tuple(2**k for k in range(10, 25, 2)),  # 1 KiB .. 16 MiB
                 "cuda": tuple(2**k for k in range(10, 31, 2))}  # 1 KiB .. 1 GiB
# Rounds of the model measurement (its variants side by side in every repeat), spread over the calibration
# (measure_rank: first, middle and last third).
MODEL_ROUNDS = 3
# The model measurement uses at most this many layers (plus embedding and LM head).
MODEL_LAYERS = 4
DEFAULT_COPY_BYTES = {"cpu": 64 * 2**20, "cuda": 2 * 2**30}


@dataclass(frozen=True)
class CalibrateConfig:
    model: ModelSpec
    world: int = 2
    backend: str = "gloo"
    sizes: tuple[int, ...] = ()  # collective message bytes; empty: DEFAULT_SIZES for the device
    repeats: int = 10
    warmup: int = 3
    micro_batch: int = 1
    seq_len: int = 64
    copy_bytes: int = 0  # 0: DEFAULT_COPY_BYTES for the device
    timeout_s: float = 120.0  # any collective; also the longest a spawning parent waits without progress
    # The precision of the measured work: "" is the device's own (bf16 under autocast on a GPU, fp32 on a CPU);
    # "bfloat16" on a CPU runs a GPU calibration's code path there (tests: its fp32 weights under bf16 autocast).
    dtype: str = ""
    model_source: str | None = None  # the config.json the model was read from (model_spec.config_path): refusals name it

    @property
    def device_type(self) -> str:
        return "cuda" if self.backend == "nccl" else "cpu"

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq_len

    def resolved(self) -> "CalibrateConfig":
        return replace(self, sizes=tuple(sorted(set(self.sizes or DEFAULT_SIZES[self.device_type]))),
                       copy_bytes=self.copy_bytes or DEFAULT_COPY_BYTES[self.device_type])


def check_config(cfg: CalibrateConfig, cuda_devices: int) -> None:
    """Raise UsageError (one line: the problem and the fix) before any process starts."""
    if cfg.world < 1:
        raise UsageError(f"--world must be at least 1, got {cfg.world}")
    if cfg.backend not in ("gloo", "nccl"):
        raise UsageError(f"unknown backend '{cfg.backend}' — use gloo (CPU) or nccl (GPU)")
    if cfg.backend == "nccl" and cuda_devices == 0:
        raise UsageError("--backend nccl needs CUDA GPUs and none is visible — use --backend gloo on CPU")
    if cfg.backend == "nccl" and cfg.world > cuda_devices:
        raise UsageError(f"--world {cfg.world} exceeds the {cuda_devices} visible GPUs — lower --world")
    if cfg.repeats < 1 or cfg.warmup < 0:
        raise UsageError(f"--repeats must be at least 1 and --warmup at least 0 (got {cfg.repeats}, {cfg.warmup})")
    for flag, value in (("--micro-batch", cfg.micro_batch), ("--seq-len", cfg.seq_len)):  # (validate has no --micro-batch)
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    if 4 * cfg.micro_batch * cfg.world > 2**32:  # check_memory's job: four micro-batches at once on every rank
        raise UsageError(f"--micro-batch {cfg.micro_batch:,} is more than calibrate measures (it runs four at once on "
                         f"each of --world {cfg.world} ranks, at most 2^32 sequences in all) — give a smaller --micro-batch")
    from shardwise.launch import MIN_TIMEOUT_S

    if not MIN_TIMEOUT_S <= cfg.timeout_s <= 10**7:  # the ranks' rendezvous waits under it too
        raise UsageError(f"--timeout must be {MIN_TIMEOUT_S:g} to 10,000,000 seconds, got {cfg.timeout_s}")
    if cfg.sizes and len(set(cfg.sizes)) < 2:  # each collective's table is a line through its sizes: a single point has no slope
        raise UsageError(f"--sizes needs two message sizes or more (got {len(set(cfg.sizes))}): a collective's "
                         f"bandwidth is read off the line through them — e.g. --sizes 1K,64K,1M")
    if cfg.copy_bytes and cfg.copy_bytes < 1024:  # float32 elements copied to read the memory bandwidth
        raise UsageError(f"--copy-size {cfg.copy_bytes} bytes is too small to time a copy — use 1K or more (default "
                         f"64M on CPU)")
    biggest = max((*cfg.sizes, cfg.copy_bytes, 0))
    if biggest > MAX_BYTES:
        raise UsageError(f"a {human(biggest)} message or copy is above the {human(MAX_BYTES)} calibrate measures — "
                         f"pass smaller --sizes / --copy-size")
    for flag, value in (("--repeats", cfg.repeats), ("--warmup", cfg.warmup)):
        if value > MAX_REPEATS:
            raise UsageError(f"{flag} {value:,} is more than a median needs (at most {MAX_REPEATS:,}) — 10 is plenty")
    from shardwise import preflight

    preflight.check_runtime_model(cfg.model, cfg.seq_len, cfg.model_source)
    preflight.check_cores(cfg.world, gpu=cfg.backend == "nccl")
    check_memory(cfg)


MAX_REPEATS = 10_000  # timed or untimed repeats of one measurement


def check_memory(cfg: CalibrateConfig) -> None:
    """The model measured (at most MODEL_LAYERS layers with the embedding and LM head, four micro-batches at once at
    most) on every rank, against this machine's memory: the planner's prediction, before any rank starts."""
    from types import SimpleNamespace

    from shardwise import preflight
    from shardwise.specs import Layout

    spec = replace(cfg.model, num_layers=min(cfg.model.num_layers, MODEL_LAYERS))
    batch = 4 * cfg.micro_batch
    job = SimpleNamespace(spec=spec, layout=Layout(dp=cfg.world, micro_batch=batch), global_batch=batch * cfg.world,
                          seq_len=cfg.seq_len, device_type=cfg.device_type)
    preflight.check_memory(job, fix="use a smaller --model, --micro-batch or --seq-len, or fewer --world ranks",
                           override="")


MAX_BYTES = 2**34  # 16 GiB: the largest collective or copy one rank measures


def parse_size(text: str, flag: str = "size") -> int:
    """'4096', '64K', '1M', '1G' (binary units; a trailing B or iB is fine) -> bytes; `flag` names it in a refusal."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise UsageError(f"{flag} '{text}' is not a number of bytes — write it like 4096, 64K, 1M or 1G") from None
    if not 1 <= value <= MAX_BYTES:
        raise UsageError(f"{flag} '{text}' must be between 1 byte and {human(MAX_BYTES)} — e.g. 64K or 1G")
    return int(value)


def human(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def gemm_shapes(model: ModelSpec, tokens: int) -> list[tuple[int, int, int, int]]:
    """(m, n, k, times per step) of every GEMM one step runs: out = (m x k) @ (k x n).

    Each linear layer (in -> out) runs forward (tokens, out, in), input gradient (tokens, in, out)
    and weight gradient (out, in, tokens); the layers are those planner/step_time.py counts.
    Shapes that repeat are merged, their counts added.
    """
    h, f, L = model.hidden, model.ffn_hidden, model.num_layers
    linears = [(model.q_dim, h, L), (model.kv_dim, h, 2 * L), (h, model.q_dim, L),
               (f, h, (2 if model.gated_mlp else 1) * L), (h, f, L), (model.vocab_size, h, 1)]
    counts: dict[tuple[int, int, int], int] = {}
    for out, inp, times in linears:
        for shape in ((tokens, out, inp), (tokens, inp, out), (out, inp, tokens)):
            counts[shape] = counts.get(shape, 0) + times
    return [(m, n, k, c) for (m, n, k), c in counts.items()]


def rank_steps(cfg: CalibrateConfig) -> int:
    """Progress steps of a calibration: one per GEMM shape, the copy, one per collective and size, and one per
    round of each measurement spread over the rounds (the model, the split backward, train's loop; with other ranks,
    the calls between layers and the FSDP layer; where cp = world splits the sequence, the context-parallel layer)."""
    collectives = len(COLLECTIVES) * len(cfg.resolved().sizes) + 2 * MODEL_ROUNDS if cfg.world > 1 else 0
    collectives += MODEL_ROUNDS if cfg.world > 1 and cfg.seq_len % (2 * cfg.world) == 0 else 0
    return len(gemm_shapes(cfg.model, cfg.tokens)) + 1 + collectives + 3 * MODEL_ROUNDS
