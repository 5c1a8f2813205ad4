"""Will this training job fit this machine? Answered by the planner before any process starts.

- Memory: the planner's prediction of shardwise's own runtime (`planner.job.runtime_job`: fp32 states,
  the activations shardwise saves) per rank, plus the full-precision weights a rank builds before tensor
  parallelism slices them, plus what a rank's interpreter holds (torch imported, process group up). On CPU all
  local ranks share this machine's RAM; on GPUs each rank's states and activations must fit its GPU, and the
  weights are still built in host memory first. More than is available is refused in one line, with the
  numbers and the fix; the prediction can be overridden (`--no-memory-check`).
- Cores: ranks far beyond this machine's cores spend their time waiting for the OS scheduler; every
  collective then waits on the slowest and the job crawls into its timeout. Beyond OVERSUBSCRIBED ranks per
  core the job is refused; beyond CROWDED a one-line note says what to expect.
"""

from __future__ import annotations

import functools
import os
import sys

from shardwise.errors import UsageError
from shardwise.units import GIB

# A rank's interpreter with torch and shardwise imported and a gloo group up: 265 MiB peak RSS measured on the
# development machine (torch 2.13 CPU wheel, Linux x86-64), rounded up for the group's buffers.
RANK_OVERHEAD_BYTES = 320 * 2**20
CROWDED, OVERSUBSCRIBED = 2, 8  # ranks per core: a note beyond the first, a refusal beyond the second


def available_host_memory() -> float | None:
    """Bytes this machine can still give (Linux MemAvailable; else physical memory; None if unknown)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _counted(cfg) -> dict[str, float]:
    """The planner's prediction of one rank's bytes at its peak (planner.memory.counted_memory) for this run."""
    from shardwise.planner.job import runtime_job
    from shardwise.planner.memory import counted_memory
    from shardwise.specs import load_cluster

    # The runtime's memory does not depend on the cluster (only its time does): any preset will do.
    job = runtime_job(cfg.spec, load_cluster("dgx-h100-80gb"), cfg.global_batch, cfg.seq_len,
                      gpu=cfg.device_type == "cuda")
    return counted_memory(job, cfg.layout)


def rank_memory(cfg) -> tuple[float, float]:
    """(device bytes, host bytes) one rank needs at its peak, as the planner predicts them."""
    lay = cfg.layout
    device = sum(_counted(cfg).values())
    build = 4.0 * cfg.spec.num_params() / lay.pp  # fp32 weights of a whole stage, before TP slices them
    started = "LOCAL_WORLD_SIZE" in os.environ  # under torchrun the ranks' interpreters already exist
    host = (0 if started else RANK_OVERHEAD_BYTES) + (build if cfg.device_type == "cuda" else max(build, device))
    return device, host


def local_ranks(cfg) -> int:
    if "LOCAL_WORLD_SIZE" in os.environ:  # under torchrun: the ranks of this machine
        return int(os.environ["LOCAL_WORLD_SIZE"])
    return cfg.layout.world_size


def runtime_kv_refusal(spec, tp: int) -> str | None:
    """Why shardwise's runtime cannot run tp over this model's KV heads (its attention splits them), or None."""
    from shardwise.planner.frameworks import get as get_framework

    return get_framework("shardwise").kv_refusal(spec.num_kv_heads, tp, planned=False)


def check_runtime_model(spec, seq_len: int, source: str | None = None) -> None:
    """UsageError if shardwise's runtime cannot build this model at this sequence length (train, calibrate and
    validate all run it). `source`: the config.json it was read from, named by the refusals (None: a preset)."""
    check_runtime_blocks(spec, source)  # first: no --seq-len or other flag makes blocks the runtime lacks trainable
    # At any cp: context parallelism splits the tokens, each keeping its global position (specs.check_sequence_split).
    # Rotary positions are a function of the index, but shardwise.model builds its cos/sin tables for n of them.
    n = spec.max_positions
    if seq_len > n:
        table = ("'s learned position table" if spec.learned_positions
                 else " (max_position_embeddings), which shardwise's runtime builds its RoPE tables for")
        raise UsageError(f"--seq-len {seq_len} exceeds the {n} positions of {spec.name}{table} — use at most {n} "
                         f"tokens, or raise n_positions / max_position_embeddings in the config.json to train longer")
    if spec.windowed(seq_len):  # a Mixtral config's sliding_window: its layers see fewer keys than the sequence
        raise UsageError(f"{spec.name} attends through a sliding window of {spec.sliding_window} tokens "
                         f"(sliding_window), shorter than --seq-len {seq_len}, and shardwise's runtime attends over the "
                         f"whole sequence (its logits would not be the model's) — train at --seq-len "
                         f"{spec.sliding_window} or less, or plan and estimate it (the planner prices the window)")
    if spec.rotary and spec.head_dim % 2:  # the runtime's RoPE rotates the two halves of every head
        raise UsageError(f"{spec.name}'s head dimension {spec.head_dim} is odd, and shardwise's runtime rotates each "
                         f"head's two halves (RoPE) — plan and estimate it, or train a model with an even head_dim")


def check_runtime_blocks(spec, source: str | None = None) -> None:
    """UsageError if shardwise's runtime has no blocks for this model (the first thing to say of a model folder whose
    config it cannot train at all, before what of its weights or activation differs). `source`: the config.json file
    the spec was read from (model_spec.config_path), named first as the file that holds the keys (rope_scaling, ...)
    to look at; None (a preset, or a caller that does not know it): the model's name alone."""
    from shardwise.model import unsupported

    missing = unsupported(spec)
    if missing:
        where = f"{source}: {spec.name}" if source else spec.name
        raise UsageError(f"{where} uses {missing}, which shardwise's runtime does not implement — plan and estimate "
                         "it (counted exactly), or train a model of the blocks the runtime builds (Llama's, GPT-2's, "
                         "Mixtral's)")


TRAIN_FIX = "use a smaller model, --global-batch or --seq-len, more --tp/--pp/--zero to shard it, or a bigger machine"


def check_memory(cfg, fix: str = TRAIN_FIX, override: str = "--no-memory-check") -> None:
    """UsageError if the planner predicts this job needs more memory than this machine has. `fix` and `override`
    (the flag that skips the check, or "") name the way out for the command at hand."""
    ranks = local_ranks(cfg)
    device, host = rank_memory(cfg)
    anyway = f" (or {override} to try anyway)" if override else ""
    if cfg.device_type == "cuda":
        free = free_gpu_bytes(ranks)
        if device > free:
            raise UsageError(f"each rank needs about {device / GIB:,.1f} GiB of GPU memory (planner: states and "
                             f"activations of this layout), but a GPU has {free / GIB:,.1f} GiB free — {fix}{anyway}")
    have = available_host_memory()
    if have is not None and ranks * host > have:
        raise UsageError(f"this run needs about {ranks * host / GIB:,.1f} GiB of memory ({ranks} rank{'s' * (ranks > 1)} x "
                         f"{host / GIB:,.1f} GiB: weights, gradients, optimizer states, activations, the process) but "
                         f"this machine has {have / GIB:,.1f} GiB available — {fix}{anyway}")


def check_sweep_memory(cfgs, fix: str) -> None:
    """UsageError if a sweep that keeps every layout built at once (validate: each runtime's weights, gradients and
    optimizer states live for the whole sweep, one layout trains at a time) needs more GPU memory than a GPU has free:
    the states of all, and the activations of the largest. Each layout alone is check_memory's."""
    if len(cfgs) < 2 or cfgs[0].device_type != "cuda":  # on CPU the ranks' host memory: check_memory's per layout
        return
    counted = [_counted(cfg) for cfg in cfgs]
    states = sum(c["weights"] + c["gradients"] + c["optimizer"] for c in counted)
    need = states + max(c["activations"] for c in counted)
    free = free_gpu_bytes(local_ranks(cfgs[0]))
    if need > free:
        raise UsageError(f"the sweep keeps its {len(cfgs)} layouts built at once: their weights, gradients and optimizer "
                         f"states ({states / GIB:,.1f} GiB) and the largest one's activations need about "
                         f"{need / GIB:,.1f} GiB of a GPU, which has {free / GIB:,.1f} GiB free — {fix}")


# The least free memory of the first `ranks` GPUs, read in a process of its own: mem_get_info opens a CUDA context on
# each GPU it asks, which the asking process keeps for its life (a few hundred MiB a GPU).
_FREE_GPU = ("import sys, torch; n = min(int(sys.argv[1]), torch.cuda.device_count()); "
             "print(min(torch.cuda.mem_get_info(i)[0] for i in range(n)))")


def free_gpu_bytes(ranks: int) -> int:
    """Free memory of the GPUs this machine's ranks will train on, without leaving a CUDA context behind: under
    torchrun, a rank asks its own GPU only (where it trains anyway); the launcher asks from a short-lived process,
    not from itself (it would hold a context on every GPU while the ranks train)."""
    if "LOCAL_RANK" in os.environ:
        import torch

        return torch.cuda.mem_get_info(int(os.environ["LOCAL_RANK"]))[0]
    return _free_gpu_bytes_elsewhere(ranks)


@functools.lru_cache(maxsize=None)  # validate checks dozens of layouts before any rank starts: one read
def _free_gpu_bytes_elsewhere(ranks: int) -> int:
    import subprocess

    out = subprocess.run([sys.executable, "-c", _FREE_GPU, str(ranks)], capture_output=True, text=True, timeout=300)
    if out.returncode:
        raise UsageError(f"could not read the GPUs' free memory ({(out.stderr.strip().splitlines() or ['?'])[-1]}) — "
                         "check the GPUs with nvidia-smi")
    return int(out.stdout)


def check_cores(ranks: int, gpu: bool = False, cores: int | None = None) -> None:
    """UsageError for far more local ranks than cores; a one-line note on stderr for somewhat more."""
    if gpu:
        return  # each rank drives its own GPU
    cores = cores or os.cpu_count() or 1
    if ranks > OVERSUBSCRIBED * cores:
        raise UsageError(f"{ranks} ranks on {cores} CPU core{'s' * (cores > 1)}: each rank would wait its turn for a core "
                         f"and every collective for the slowest one, until the job times out — use at most "
                         f"{OVERSUBSCRIBED * cores} ranks here, or run under torchrun on more machines")
    if ranks > CROWDED * cores and os.environ.get("RANK", "0") == "0":
        from shardwise.console import note

        note(f"{ranks} ranks share {cores} CPU core{'s' * (cores > 1)}: steps will be slow and their times noisy")


def check(cfg, memory: bool = True) -> None:
    check_cores(local_ranks(cfg), gpu=cfg.device_type == "cuda")
    if memory:
        check_memory(cfg)
