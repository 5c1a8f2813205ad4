"""Validated descriptions of what is trained, where, and how it is split.

ModelSpec   — the architecture (from a preset or a Hugging Face config.json): model_spec.py, re-exported here.
ClusterSpec — the hardware (from a preset or a TOML file).
TrainSpec   — the job: global batch, sequence length, optimizer bytes.
Layout      — one way to split the job: dp x tp x pp, micro-batch, ZeRO, recompute, schedule.

Everything here is plain Python (no torch), so the planner imports in milliseconds.
Every check raises UsageError with one line that names the problem and the fix.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from shardwise.errors import InputError, UsageError
from shardwise.frozen import cached_hash, replaced
from shardwise.model_spec import (  # noqa: F401 - re-exported: callers find every spec here
    MAX_LAYERS, MODEL_TYPES, ModelSpec, load_model, model_from_hf_config, model_presets, preset_dir, read_json_file)
from shardwise.stage_split import max_chunk_layers, max_chunks  # the most layers a model chunk holds (--recompute-layers)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

# The one list of pipeline schedules (schedules/generators.py builds each) and of recompute policies.
SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1")
PLANNED_SCHEDULES = SCHEDULES[1:]  # what `plan` searches and `simulate --compare` draws: all but the article's naive
RECOMPUTE = ("none", "selective", "full")


def default_schedule(vpp: int) -> str:
    """The schedule a layout runs when none is named: interleaved 1F1B with virtual stages, else 1F1B."""
    return "interleaved-1f1b" if vpp > 1 else "1f1b"


CP_MODES = ("ring", "allgather")
ZERO_STAGES = (0, 1, 2, 3)


# --------------------------------------------------------------------------- cluster


def cluster_presets() -> list[str]:
    return sorted(p.name[: -len(".toml")] for p in preset_dir("clusters").iterdir() if p.name.endswith(".toml"))


@cached_hash
@dataclass(frozen=True)
class ClusterSpec:
    """Hardware, per GPU. Bandwidths are unidirectional bytes/s one GPU can drive on that link."""

    name: str
    gpus_per_node: int
    gpu_memory_bytes: float
    peak_flops: float  # dense BF16 FLOP/s per GPU
    hbm_bandwidth: float  # bytes/s
    intra_node_bandwidth: float  # NVLink, bytes/s per GPU, one direction
    inter_node_bandwidth: float  # network, bytes/s per GPU, one direction
    intra_node_latency: float = 5e-6  # seconds per collective step
    inter_node_latency: float = 10e-6
    num_gpus: int = 0  # 0 = not fixed by the cluster; `--gpus` sets it
    # Optional measured tables from `shardwise calibrate` (size -> seconds); empty for datasheet presets.
    measured: dict = field(default_factory=dict, compare=False, hash=False)
    # What the planner's kernel and collective models read (planner/kernels.py, planner/comm.py);
    # 0 / "" = unknown, and those models fall back to plain rates (docs/planner.md).
    sm_count: int = 0  # streaming multiprocessors: GEMM tiles run in waves of this many
    mamf_tflops: float = 0.0  # maximum achievable dense BF16 matmul TFLOP/s (a kernel measurement)
    arch: str = ""  # "ampere" | "hopper": picks the attention kernels' and NCCL's constants
    fp8_flops: float = 0.0  # dense FP8 tensor-core FLOP/s per GPU (0: no FP8 tensor cores, e.g. A100)
    power_limit_w: float = 0.0  # board power limit below the rated TDP (0: the rated TDP); POWER_CURVES
    # Seconds each network crossing of a collective takes beyond NCCL's tuner constants: 0 on a datasheet cluster;
    # fitted to the cluster's own nccl-tests logs by `shardwise calibrate --nccl-tests` (calibrate/nccl_tests.py).
    net_step_extra: float = 0.0
    network_fit: str = ""  # what the network keys were fitted to ("nccl-tests"); "" for a datasheet's
    # The host, for CPU offload (planner/offload.py); 0 = not stated, and --offload is refused on the cluster:
    host_link_bandwidth: float = 0.0  # GPU <-> CPU memory, bytes/s per GPU, one direction, with every GPU copying
    host_memory_bandwidth: float = 0.0  # the node's CPU memory, bytes/s (all its sockets)
    host_memory_bytes: float = 0.0  # the node's CPU memory
    # What the cluster file left out and the planner took from the datasheet GPU its peak names (_datasheet_gpu)
    inferred: str = field(default="", compare=False)

    @property
    def gpu_memory_gib(self) -> float:
        return self.gpu_memory_bytes / 2**30


_CLUSTER_KEYS = {
    "gpus_per_node": int, "gpu_memory_gib": float, "peak_tflops": float, "hbm_bandwidth_gbs": float,
    "intra_node_bandwidth_gbs": float, "inter_node_bandwidth_gbs": float,
}
# The most GPU memory a cluster file may give, GiB: past every GPU's (B300 and MI355X hold 288 GB), short of the MiB
# nvidia-smi prints (an 80 GB card: 81,559 MiB)
MAX_GPU_MEMORY_GIB = 1024
# Optional [cluster] keys of the kernel models (each preset cites its source).
_OPTIONAL_KEYS = {"sm_count": int, "mamf_tflops": float, "fp8_peak_tflops": float, "power_limit_w": float,
                  "host_link_gbs": float, "host_memory_bandwidth_gbs": float, "host_memory_gib": float}
# What a [cluster] number may be (GiB, TFLOP/s, GB/s, count, us): far beyond any GPU either way, and inside it every
# predicted time and rate stays a finite positive float.
CLUSTER_RANGE = (1e-6, 1e7)
ARCHS = ("ampere", "hopper")
# Tensor-core rate against the board power limit, per architecture: (rated TDP in W, a lower TDP in W, the rated
# dense tensor peak at that lower TDP as a share of the rated one). NVIDIA's H100 datasheet rates the same 132-SM GH100
# at 1,979 BF16 TFLOP/s (with sparsity) as the SXM at up to 700 W and at 1,671 as the NVL at up to 400 W: the tensor
# clock each board sustains within its TDP (1,830 and 1,545 MHz). A limit between the two runs the tensor cores at
# (limit / rated)^(1/n) of the rated rate, n through both points (planner/kernels.py power_share; docs/planner.md).
POWER_CURVES = {"hopper": (700.0, 400.0, 1671 / 1979)}


def cluster_from_toml(data: dict, name: str, source: str) -> ClusterSpec:
    """Cluster TOML: a [cluster] table with the keys in _CLUSTER_KEYS (GB/s = 1e9 bytes/s, TFLOP/s = 1e12)."""
    table = data.get("cluster", {k: v for k, v in data.items() if k != "measured"})
    if not isinstance(table, dict):
        raise UsageError(f"{source}: [cluster] must be a table of keys — see the presets in shardwise/presets/clusters")
    tables = [k for k, v in table.items() if isinstance(v, dict)] if "cluster" not in data else []
    if tables:  # [clusterx]: a misspelt header, not a key of a headerless file
        raise UsageError(f"{source}: [{tables[0]}] is not a table a cluster file has — name it [cluster] (a cluster "
                         f"file holds a [cluster] table, and the [measured] one calibrate writes)")
    stray = [k for k in data if k not in ("cluster", "measured")] if "cluster" in data else []
    if stray:  # a key above the [cluster] header, or a table nobody reads ([measure], [network]): never silently dropped
        raise UsageError(f"{source}: '{stray[0]}' is outside [cluster] — a cluster file holds a [cluster] table (and "
                         f"the [measured] one calibrate writes): move the key under [cluster], or remove it")
    _check_cluster_keys(table, source)
    missing = [key for key in _CLUSTER_KEYS if key not in table]
    if missing:  # every one at once, with what the file needs
        raise UsageError(f"{source}: missing {', '.join(repr(k) for k in missing)} in [cluster] — a cluster file "
                         f"gives {', '.join(_CLUSTER_KEYS)} (bandwidths per GPU, one way, GB/s; README.md, Plan, "
                         f"has an example)")
    values = {}
    for key, kind in (*_CLUSTER_KEYS.items(), *_OPTIONAL_KEYS.items()):
        if key not in table:
            continue
        values[key] = _cluster_number(table, key, kind, source)
        if values[key] <= 0:
            raise UsageError(f"{source}: key '{key}' must be positive, got {table[key]!r}")
        if not CLUSTER_RANGE[0] <= values[key] <= CLUSTER_RANGE[1]:  # beyond, times overflow or MFU underflows
            raise UsageError(f"{source}: key '{key}' is {table[key]!r}, outside {CLUSTER_RANGE[0]:g} to "
                             f"{CLUSTER_RANGE[1]:g} — " + ("check the count" if kind is int else
                                                             "check its unit (GiB, TFLOP/s, GB/s) in the presets"))
    for key in ("intra_node_latency_us", "inter_node_latency_us", "net_step_extra_us", "num_gpus"):
        if key in table and _cluster_number(table, key, int if key == "num_gpus" else float, source) < 0:
            raise UsageError(f"{source}: key '{key}' must not be negative, got {table[key]!r}")
        if key in table and key != "num_gpus" and table[key] > CLUSTER_RANGE[1]:
            raise UsageError(f"{source}: key '{key}' is {table[key]!r} microseconds, more than {CLUSTER_RANGE[1]:g} — "
                             f"check its unit (us)")
    # nvidia-smi's MiB (81,559 on an H100 80GB); a measured file's figure stands (calibrate on CPU: the host's RAM)
    if values["gpu_memory_gib"] > MAX_GPU_MEMORY_GIB and not data.get("measured"):
        raise UsageError(f"{source}: gpu_memory_gib {table['gpu_memory_gib']:g} is more than any GPU holds — the key is "
                         f"GiB per GPU (nvidia-smi prints MiB: {table['gpu_memory_gib']:g} MiB = "
                         f"{values['gpu_memory_gib'] / 1024:.1f} GiB)")
    fp8 = values.get("fp8_peak_tflops")
    if fp8 is not None and not values["peak_tflops"] <= fp8 <= 2 * values["peak_tflops"] * 1.01:
        raise UsageError(f"{source}: fp8_peak_tflops {fp8:g} is "
                         + (f"more than twice peak_tflops {values['peak_tflops']:g}: the FP8 peak with 2:4 sparsity, "
                            f"which training does not run — use the dense FP8 peak (twice the BF16 one on Hopper)"
                            if fp8 > values["peak_tflops"] else
                            f"below peak_tflops {values['peak_tflops']:g}: FP8 matmuls run at up to twice the BF16 "
                            f"rate — check the two keys (peak_tflops is dense BF16, fp8_peak_tflops dense FP8)"))
    if values.get("mamf_tflops", 0) > values["peak_tflops"]:
        raise UsageError(f"{source}: mamf_tflops {values['mamf_tflops']:g} exceeds peak_tflops {values['peak_tflops']:g} — "
                         f"the achievable matmul rate is measured below the peak; fix one of them")
    _check_measured(data.get("measured", {}), source)
    matmul = (data.get("measured") or {}).get("matmul_tflops", 0)
    if isinstance(matmul, (int, float)) and matmul > values["peak_tflops"]:  # calibrate writes its matmul rate as both
        raise UsageError(f"{source}: [measured] matmul_tflops {matmul:g} exceeds peak_tflops {values['peak_tflops']:g} — "
                         f"`shardwise calibrate` writes its measured matmul rate as the peak; fix one of them, or "
                         f"rerun calibrate")
    arch = str(table.get("arch", ""))
    if arch and arch not in ARCHS:
        raise UsageError(f"{source}: unknown arch '{arch}' — use one of {', '.join(ARCHS)}, or leave it out")
    if not data.get("measured"):
        _refuse_datasheet_misreadings(values, source)
    inferred = "" if data.get("measured") else "; ".join(filter(None, (_datasheet_gpu(values, arch),
                                                                        _latency_note(table))))
    arch = values.pop("arch", arch)
    if "power_limit_w" in values:
        _check_power_limit(values["power_limit_w"], arch, bool(data.get("measured")), source)
    return ClusterSpec(
        name=str(table.get("name", name)),
        gpus_per_node=values["gpus_per_node"],
        gpu_memory_bytes=values["gpu_memory_gib"] * 2**30,
        peak_flops=values["peak_tflops"] * 1e12,
        hbm_bandwidth=values["hbm_bandwidth_gbs"] * 1e9,
        intra_node_bandwidth=values["intra_node_bandwidth_gbs"] * 1e9,
        inter_node_bandwidth=values["inter_node_bandwidth_gbs"] * 1e9,
        intra_node_latency=float(table.get("intra_node_latency_us", DEFAULT_LATENCY_US["intra_node_latency_us"])) * 1e-6,
        inter_node_latency=float(table.get("inter_node_latency_us", DEFAULT_LATENCY_US["inter_node_latency_us"])) * 1e-6,
        num_gpus=int(table.get("num_gpus", 0)),
        measured=dict(data.get("measured", {})),
        sm_count=values.get("sm_count", 0),
        mamf_tflops=values.get("mamf_tflops", 0.0),
        arch=arch,
        fp8_flops=values.get("fp8_peak_tflops", 0.0) * 1e12,
        power_limit_w=values.get("power_limit_w", 0.0),
        net_step_extra=float(table.get("net_step_extra_us", 0.0)) * 1e-6,
        network_fit=str(table.get("network_fit", "")),
        host_link_bandwidth=values.get("host_link_gbs", 0.0) * 1e9,
        host_memory_bandwidth=values.get("host_memory_bandwidth_gbs", 0.0) * 1e9,
        host_memory_bytes=values.get("host_memory_gib", 0.0) * 2**30,
        inferred=inferred,
    )


# The datasheet GPUs whose kernel-model keys (arch, sm_count, mamf_tflops, fp8_peak_tflops) a hand-written cluster file
# may leave out: a file without an arch whose peak_tflops is one of theirs gets them from the preset, so a DGX-like
# file is timed as the preset is (without them the kernel models fall back to plain rates; docs/planner.md).
# Each with the PCIe link through which it reaches its NIC, GB/s one way: Gen4 x16 (A100) and Gen5 x16 (H100, H200),
# 16 and 32 GT/s x 16 lanes x 128/130 / 8 (PCI-SIG). No network reaches such a GPU faster.
DATASHEET_GPUS = {"A100 SXM": ("dgx-a100-80gb", 31.5), "H100 / H200 SXM": ("dgx-h100-80gb", 63.0)}


@lru_cache(maxsize=1)
def _datasheet_tables() -> tuple[tuple[str, str, dict, float], ...]:
    """(GPU, preset, the preset's [cluster] table, PCIe GB/s) of each DATASHEET_GPUS entry, read once. The presets are
    read as their own TOML tables (a preset states every key it has; through load_cluster it would be checked again)."""
    # The shipped file itself: cluster_toml would take a file or folder of the preset's name in the working directory.
    return tuple((gpu, preset, tomllib.loads(preset_dir("clusters").joinpath(f"{preset}.toml").read_text())["cluster"],
                  pcie) for gpu, (preset, pcie) in DATASHEET_GPUS.items())


def _refuse_datasheet_misreadings(values: dict, source: str) -> None:
    """Datasheet figures a hand-written file copies that are not what its keys mean: a peak twice a datasheet GPU's
    dense BF16 one is that GPU's figure with 2:4 sparsity (NVIDIA's datasheets print it first, marked *), which training
    never runs; on that GPU, an NVLink rate twice the preset's is both directions added (A100 600, H100 900 GB/s), a
    network rate above the GPU's PCIe link is Gb/s or a whole node's (unless it repeats the NVLink rate: one machine),
    and an HBM rate a hundredth of the preset's is the datasheet's TB/s. Planned at any of them, steps (or their parts) would come out two to a thousand times off."""
    for gpu, preset, known, pcie in _datasheet_tables():
        if _near(values["peak_tflops"], 2 * known["peak_tflops"]):
            raise UsageError(f"{source}: peak_tflops {values['peak_tflops']:g} is the {gpu}'s BF16 peak with 2:4 "
                             f"sparsity, which training does not run — use its dense peak, peak_tflops = "
                             f"{known['peak_tflops']:g} (the key is BF16; an FP8 rate goes in fp8_peak_tflops)")
        if not _near(values["peak_tflops"], known["peak_tflops"]):
            continue
        if _near(values["intra_node_bandwidth_gbs"], 2 * known["intra_node_bandwidth_gbs"]):
            raise UsageError(f"{source}: intra_node_bandwidth_gbs {values['intra_node_bandwidth_gbs']:g} is the "
                             f"{gpu}'s NVLink in both directions; the key is one direction — use "
                             f"intra_node_bandwidth_gbs = {known['intra_node_bandwidth_gbs']:g}")
        if values["hbm_bandwidth_gbs"] < known["hbm_bandwidth_gbs"] / 100:  # 3.35 for 3,350: the datasheet's TB/s
            raise UsageError(f"{source}: hbm_bandwidth_gbs {values['hbm_bandwidth_gbs']:g} is an {gpu}'s memory "
                             f"bandwidth in TB/s; the key is GB/s — e.g. hbm_bandwidth_gbs = "
                             f"{known['hbm_bandwidth_gbs']:g} for the {preset} preset's GPU")
        if values["inter_node_bandwidth_gbs"] > pcie and _crosses_a_network(values):
            nic = known["inter_node_bandwidth_gbs"]
            raise UsageError(f"{source}: inter_node_bandwidth_gbs {values['inter_node_bandwidth_gbs']:g} is more than "
                             f"the {pcie:g} GB/s PCIe link through which an {gpu} reaches its NIC: the key is "
                             f"GB/s per GPU, one way (one {8 * nic:g} Gb/s NIC a GPU: {nic:g}, as the {preset} preset "
                             f"says) — not Gb/s, nor a node's. GPUs joined by an NVLink Switch across boxes (GH200 NVL32, "
                             f"DGX GH200) are one node: gpus_per_node counts them all, intra_node_bandwidth_gbs is their "
                             f"NVLink")


def datasheet_gpu(cluster: ClusterSpec) -> str:
    """The DATASHEET_GPUS entry a cluster is (its dense BF16 peak within 0.5 % of that GPU's and its arch the same), or
    "" (another GPU: an H100 PCIe at 756 TFLOP/s names arch hopper but is not the SXM part the presets describe)."""
    return next((gpu for gpu, _, known, _ in _datasheet_tables()
                 if _near(cluster.peak_flops / 1e12, known["peak_tflops"]) and cluster.arch == known["arch"]), "")


def _crosses_a_network(values: dict) -> bool:
    """Whether the file's inter_node rate is a network's: not where it repeats the NVLink rate, as `calibrate` writes
    for one machine (a num_gpus within a node would not do: --gpus may still span nodes at that rate)."""
    return values["inter_node_bandwidth_gbs"] != values["intra_node_bandwidth_gbs"]


def _near(value: float, datasheet: float) -> bool:
    return abs(value / datasheet - 1) <= 0.005


def _datasheet_gpu(values: dict, arch: str) -> str:
    """Fill `values`' missing kernel-model keys (and its "arch") from the datasheet GPU whose dense BF16 peak the file
    gives (within 0.5 %) and whose arch is the file's, if it names one; the phrase that says so, or "" where the peak
    is no datasheet GPU's, the file names another arch, or it leaves nothing out."""
    for gpu, preset, known, _ in _datasheet_tables():
        if not _near(values["peak_tflops"], known["peak_tflops"]) or arch not in ("", known["arch"]):
            continue
        taken = {k: known[k] for k in ("sm_count", "mamf_tflops", "fp8_peak_tflops")
                 if k in known and k not in values and not (k == "mamf_tflops" and known[k] > values["peak_tflops"])}
        values.update(taken, arch=known["arch"])
        said = [f"arch {known['arch']}"] * (not arch) + [f"{k} {v:g}" for k, v in taken.items()]
        return (f"an {gpu} (peak_tflops {values['peak_tflops']:g}): {', '.join(said)} taken from the {preset} preset, "
                f"as the cluster file leaves {'them' if len(said) > 1 else 'it'} out") if said else ""
    return ""


# The latencies a cluster file may leave out (microseconds): ClusterSpec's defaults.
DEFAULT_LATENCY_US = {"intra_node_latency_us": 5.0, "inter_node_latency_us": 10.0}


def _latency_note(table: dict) -> str:
    """On a datasheet cluster NCCL's own latencies price the collectives (planner/comm.py nccl_time); a file's
    intra/inter_node_latency_us reach only the experts' all-to-all (and a measured file's fallback). A file that
    changes them would otherwise see nothing move: one phrase saying so, and which key adds a network's latency."""
    given = [k for k, v in DEFAULT_LATENCY_US.items() if k in table and float(table[k]) != v]
    if not given:
        return ""
    return (f"{' and '.join(given)} {'price' if len(given) > 1 else 'prices'} only the experts' all-to-all here: "
            f"NCCL's own latencies price the other collectives; net_step_extra_us adds your network's own latency per "
            f"step (calibrate --nccl-tests fits it)")


def _check_power_limit(watts: float, arch: str, measured: bool, source: str) -> None:
    """power_limit_w: only where a sourced curve spans it (POWER_CURVES), and not on a measured cluster, whose rates
    were taken at its own limit."""
    if measured:
        raise UsageError(f"{source}: power_limit_w with [measured] rates — calibrate measured them at the GPUs' own "
                         f"limit; remove power_limit_w")
    if arch not in POWER_CURVES:
        raise UsageError(f"{source}: power_limit_w needs arch = "
                         f"{' or '.join(repr(a) for a in POWER_CURVES)} (no sourced power curve for "
                         f"{repr(arch) if arch else 'a cluster without arch'}); remove it or set arch")
    rated, low, _ = POWER_CURVES[arch]
    if not low <= watts <= rated:
        raise UsageError(f"{source}: power_limit_w is {watts:g} W, outside the {low:g} to {rated:g} W its {arch} power "
                         f"curve spans (NVIDIA's rated TDPs) — give the board's limit in watts")


# Every other [cluster] key the loader reads (a key it does not read is a typo: refused, not ignored).
_OTHER_KEYS = ("name", "arch", "num_gpus", "intra_node_latency_us", "inter_node_latency_us", "net_step_extra_us",
               "network_fit")


def _check_cluster_keys(table: dict, source: str) -> None:
    """A key nobody reads (intra_node_latency_ms for _us, a misspelt optional key) would silently leave the default
    in place: one line naming it, the closest known key and the list."""
    import difflib

    known = (*_CLUSTER_KEYS, *_OPTIONAL_KEYS, *_OTHER_KEYS)
    for key in table:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean '{close[0]}'? " if close else "remove it; "
            raise UsageError(f"{source}: unknown key '{key}' in [cluster] — {hint}known keys: {', '.join(known)}")


def _cluster_number(table: dict, key: str, kind, source: str):
    """A finite number (an integer where `kind` is int), or one UsageError line."""
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or (kind is int and value != int(value)):
        what = "a whole number" if kind is int else "a finite number"
        raise UsageError(f"{source}: key '{key}' must be {what}, got {value!r}")
    return kind(value)


# What `shardwise calibrate` writes under [measured] (calibrate/profile.py Profile.measured_table; the calibrate tests
# load every file it writes, so a key added there and not here fails them): labels, rates, per-call times, the
# collectives' [[bytes, seconds], ...] tables and the points validate compares its sweep with; copy_gbs, the copy rate
# calibrate's compute pass measures, which hand-made profiles carry.
MEASURED_LABELS = frozenset(("backend", "dtype", "model"))
MEASURED_KEYS = frozenset((
    "world_size", "backend", "dtype", "model", "tokens", "matmul_tflops", "gemms", "model_tflops", "layer_overhead_s",
    "embedding_overhead_s", "head_overhead_s", "edge_points", "step_overhead_s", "sync_overhead_s", "p2p_sync_s",
    "pipeline_exchange_s", "lockstep_spread", "wait_penalty_points", "handoff_points", "action_scatter", "sync_points",
    "checkpoint_overhead_s", "full_checkpoint_overhead_s", "fsdp_call_s", "fsdp_tensor_s", "ddp_microbatch_s",
    "zero1_call_s", "train_step_overhead_s", "loop_points", "fsdp_points", "split_backward_s", "split_points", "cp_ring_step_s",
    "cp_allgather_s", "cp_points", "tp_points", "concurrent_slowdown", "alone_points", "model_points",
    "one_sequence_points", "host_layer_s", "host_embedding_s", "host_head_s", "host_floor_points", "tp_call_s",
    "tp_sp_call_s", "other_cpu_cores", "gloo_loop_threads", "reference_rounds_s", "comm_overlap",
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv", "copy_gbs"))


# Per-call charges beyond a collective's table time (calibrate.profile.tp_call_in_step): below 0 where the tables ran
# slower than the same calls in the timed step (a small collective timed back to back on a shared machine is bimodal),
# never below minus the cheapest table (calibrate's floor; here the cheapest table's longest time): no call costs
# less than nothing.
SIGNED_MEASURED = frozenset(("tp_call_s", "tp_sp_call_s"))


def tp_call_credit(measured: dict) -> float:
    """The most a SIGNED_MEASURED charge may take off a call: the cheapest TP collective table's longest time (what
    calibrate.profile.tp_call_in_step caps its floor at, and the loader checks)."""
    longest = [max(row[1] for row in table) for table in (measured.get(k) for k in ("all_reduce", "all_gather",
               "reduce_scatter")) if isinstance(table, (list, tuple)) and table and all(
               isinstance(row, (list, tuple)) and len(row) == 2 and isinstance(row[1], (int, float)) for row in table)]
    return min(longest, default=0.0)


def _check_measured(measured, source: str) -> None:
    """[measured] (written by `shardwise calibrate`): numbers finite, collective tables [[bytes, seconds], ...]."""
    if not isinstance(measured, dict):
        raise UsageError(f"{source}: [measured] must be a table — rerun `shardwise calibrate` to write it again")
    # Any [measured] table makes the file a calibrated one, whose [cluster] figures go unchecked: only calibrate's.
    unknown = [k for k in measured if k not in MEASURED_KEYS]
    what = (f"'{unknown[0]}', which `shardwise calibrate` never writes" if unknown
            else "only labels, no measurement" if measured and set(measured) <= MEASURED_LABELS else "")
    if what:
        raise UsageError(f"{source}: [measured] has {what} — remove it (a hand-written cluster has no [measured] "
                         f"table), or rerun `shardwise calibrate --out`")

    def numbers(value, inside: bool = False):
        """Every number in a value; what a list or table holds that is no number counts as NaN (calibrate writes
        only numbers there)."""
        if isinstance(value, (list, tuple)):
            return [x for v in value for x in numbers(v, True)]
        if isinstance(value, dict):
            return [x for v in value.values() for x in numbers(v, True)]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return [value]
        return [math.nan] if inside else []

    # Finite, and no larger than a measurement can be (1e18: bytes, FLOPs); a time no longer than an hour.
    bad = [k for k, v in measured.items() if any(not math.isfinite(x) or abs(x) > 1e18 for x in numbers(v))]
    bad += [k for k, v in measured.items() if k.endswith("_s") and any(abs(x) > 3600 for x in numbers(v))]
    # Scalars the planner reads as numbers (every one but the labels calibrate writes).
    bad += [k for k, v in measured.items() if k not in MEASURED_LABELS
            and not isinstance(v, (list, tuple, dict)) and (isinstance(v, bool) or not isinstance(v, (int, float)))]
    # What calibrate measures is a rate (0: not measured, the datasheet's stands; else within the [cluster] keys' range:
    # the planner divides by it), a count of ranks (>= 1) or a time, a share or a ratio (>= 0): a negative one would
    # plan negative steps.
    scalars = {k: v for k, v in measured.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
               and math.isfinite(v)}
    bad += [k for k, v in scalars.items()
            if (v != 0 and not 1e-6 <= v <= 1e7 if k.endswith(("_tflops", "_gbs"))
                else v < 1 or v != int(v) if k in ("world_size", "tokens")  # counts
                else v < 1 if k == "concurrent_slowdown"  # all ranks at once / one alone
                else not 0 <= v <= 1 if k == "comm_overlap"  # a share
                else v < -tp_call_credit(measured) if k in SIGNED_MEASURED else v < 0)]
    # The tables, the model's points validate compares its sweep's speed with ([FLOPs, seconds], ...) and the
    # pipeline's wait penalty ([wait seconds, seconds], ...).
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv", "model_points",
                 "wait_penalty_points", "handoff_points"):
        table = measured.get(kind)
        if table is not None and not (isinstance(table, list) and all(
                isinstance(row, list) and len(row) == 2 and all(isinstance(x, (int, float)) and x >= 0 for x in row)
                and row[0] > 0  # bytes: a rate is read off them
                and row[1] <= 3600  # seconds
                for row in table)):
            bad.append(kind)
    for key in ("sync_points", "fsdp_points"):  # what validate compares its sweep's calls with: [seconds, ...]
        points = measured.get(key)
        if points is not None and not (isinstance(points, list) and all(isinstance(x, (int, float)) for x in points)):
            bad.append(key)
    if bad:
        raise UsageError(f"{source}: [measured] {', '.join(dict.fromkeys(bad))} must be finite numbers, rates 0 (not "
                         f"measured) or 1e-6 to 1e7, world_size and tokens whole and at least 1, concurrent_slowdown at least 1, comm_overlap 0 to 1, times 0 to 3600 s (tp_call_s, tp_sp_call_s: no less than minus the cheapest table's longest time; tables: [[bytes > 0, seconds 0 to 3600], ...]; lists of numbers only) — "
                         f"rerun `shardwise calibrate` to write it again")


def load_cluster(ref: str) -> ClusterSpec:
    """A preset name (see `cluster_presets()`) or a path to a cluster TOML file."""
    data, name, source = cluster_toml(ref)
    return cluster_from_toml(data, name=name, source=source)


def cluster_toml(ref: str) -> tuple[dict, str, str]:
    """(the TOML's tables, the cluster's default name, where it came from) of a preset name or a .toml path."""
    path = Path(ref)
    if not ref.strip():
        raise UsageError(f"--cluster is empty — give a preset ({', '.join(cluster_presets())}) or a cluster .toml file")
    if path.is_dir() and ref not in cluster_presets():  # a folder is never a cluster; a preset's name still is
        raise UsageError(f"--cluster {ref} is a folder — give a cluster .toml file (e.g. from `shardwise calibrate`) "
                         f"or a preset ({', '.join(cluster_presets())})")
    if ref not in cluster_presets():  # a named pipe, a symlink loop: said as such, never opened (a pipe would block)
        from shardwise.paths import refuse_special

        refuse_special(path, f"--cluster {ref}", f"; or give a preset ({', '.join(cluster_presets())})")
    if ref.endswith(".toml") or path.is_file():  # a file of a preset's name here is the user's own: it wins
        if not path.is_file():
            what = "is not a regular file" if path.exists() else "not found"  # a pipe, a device
            raise UsageError(f"cluster file '{ref}' {what} — give a preset ({', '.join(cluster_presets())}) or an existing .toml")
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark (Windows editors) is no TOML
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise UsageError(f"{ref}: malformed TOML ({exc}) — fix the file or use a preset") from None
        except OSError as exc:
            raise UsageError(f"{ref}: cannot read it ({exc.strerror}) — check the path and its permissions") from None
        return data, path.stem, ref
    preset = preset_dir("clusters").joinpath(f"{ref}.toml")
    if ref not in cluster_presets() or not preset.is_file():
        raise UsageError(f"unknown cluster '{ref}' — valid presets: {', '.join(cluster_presets())}; or pass a path to a .toml")
    return tomllib.loads(preset.read_text()), ref, f"preset {ref}"


# --------------------------------------------------------------------------- training job


@cached_hash
@dataclass(frozen=True)
class TrainSpec:
    """The job. Mixed-precision Adam bytes per parameter (see docs/planner.md for the why):

    weight_bytes 2 (bf16 weights used in forward/backward), grad_bytes 4 (fp32 gradient
    accumulation buffer, as Megatron and FSDP keep it), optimizer_bytes 12 (fp32 master copy +
    Adam m + v). 2 + 4 + 12 = 18 B/param, what real frameworks keep; the textbook 16 assumes
    bf16 gradients.
    """

    global_batch: int
    seq_len: int
    weight_bytes: int = 2
    grad_bytes: int = 4
    optimizer_bytes: int = 12
    activation_bytes: int = 2  # bf16 activations

    MAX = 2**32  # sequences per step, tokens per sequence: far beyond any run, and keeps every answer fast

    def __post_init__(self):
        for flag, value in (("--global-batch", self.global_batch), ("--seq-len", self.seq_len)):
            if not 1 <= value <= self.MAX:
                raise InputError(f"{flag} must be between 1 and {self.MAX:,}, got {value:,}")

    @property
    def bytes_per_param(self) -> int:
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes

    @property
    def master_bytes(self) -> int:
        """Bytes per parameter of the copy the optimizer updates: FP32 where the stack keeps an FP32 master beside
        16-bit weights (optimizer bytes beyond two BF16 moments' 4) or trains FP32 weights, which are their own
        master; else the weights themselves (BF16 Adam states and no master: NeMo AutoModel)."""
        return 4 if self.weight_bytes >= 4 or self.optimizer_bytes > 4 else self.weight_bytes


# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Layout:
    """One split of the job over dp * tp * pp * cp GPUs (rank order: pp outer, dp, cp, tp inner)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batch: int = 1
    vpp: int = 1
    zero: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    schedule: str = "1f1b"
    cp: int = 1  # context parallelism: each sequence split over cp ranks (zig-zag chunks)
    cp_mode: str = "ring"  # attention over the shards: "ring" (K/V passed around) or "allgather"
    ep: int = 1  # expert parallelism, folded over the same dp x tp ranks (Megatron's MoE parallel folding)
    etp: int = 1  # tensor parallelism inside each expert
    # With recompute "full": how many layers of each model chunk (a pipeline stage, or each virtual stage under
    # interleaving) are recomputed, the first ones; the others keep all their activations (Megatron's
    # --recompute-method block --recompute-num-layers N). None: every layer.
    recompute_layers: int | None = None
    # Hybrid sharding (HSDP: FSDP HYBRID_SHARD, torchtitan data_parallel_shard_degree): ZeRO-3 shards over groups of
    # this many consecutive dp ranks and replicates across the groups; 0 = one group of all dp ranks (plain ZeRO-3).
    # Under ZeRO-1 on a stack that has them (InternEvo's zero1 size): the optimizer's groups.
    dp_shard: int = 0

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def dp_shard_size(self) -> int:
        """dp ranks in one shard group: dp_shard, or every dp rank where it is 0 (not hybrid). What the JSON records
        (estimate, train, validate) report as dp_shard."""
        return self.dp_shard or self.dp

    @property
    def shard_group(self) -> int:
        """Ranks ZeRO shards the model states over: every dp x cp rank, or with HSDP one shard group's dp_shard x cp."""
        return self.dp_shard_size * self.cp

    @property
    def zero_in_effect(self) -> int:
        """The ZeRO stage as it acts: 0 where the shard group is one rank (no data or context parallelism to shard
        over), whatever stage the layout names."""
        return self.zero if self.shard_group > 1 else 0

    @property
    def replicas(self) -> int:
        """Shard groups holding the same shards (HSDP; 1 otherwise): a gradient shard is all-reduced across them."""
        return self.dp // self.dp_shard_size

    def num_microbatches(self, global_batch: int) -> int:
        return global_batch // (self.dp * self.micro_batch)

    def to_dict(self) -> dict:
        """Every field as it is (dp_shard 0 where not hybrid): what a checkpoint's manifest stores and reads back."""
        return asdict(self)

    def record(self) -> dict:
        """The fields as the JSON outputs report them: dp_shard resolved to the shard group's dp ranks (dp_shard_size),
        the value `estimate --json` reports, never the 0 that means "every dp rank"."""
        return {**asdict(self), "dp_shard": self.dp_shard_size}

    def with_(self, **changes) -> "Layout":
        return replaced(self, changes)  # dataclasses.replace, without the frozen __init__ (the search makes many)

    @property
    def split(self) -> tuple[int, int, int, int, int]:
        """The dp x tp x pp x cp x ep split: `plan` shows the best layout of each."""
        return (self.dp, self.tp, self.pp, self.cp, self.ep)

    def recompute_phrase(self) -> str:
        """The recompute policy in words ("no recompute", "full recompute", or "full recompute of 4 layers per stage")."""
        if self.recompute == "none":
            return "no recompute"
        if self.recompute_layers is None:
            return f"{self.recompute} recompute"
        n = self.recompute_layers
        return f"{self.recompute} recompute of {n} layer{'s' if n != 1 else ''} per {'chunk' if self.vpp > 1 else 'stage'}"

    def describe(self) -> str:
        parts = [f"dp{self.dp}"] + ([f"hsdp{self.dp_shard}"] if self.replicas > 1 else []) + [f"tp{self.tp}", f"pp{self.pp}"]
        parts += [f"cp{self.cp}"] if self.cp > 1 else []
        if self.ep > 1 or self.etp > 1:
            parts.append(f"ep{self.ep}" + (f"·etp{self.etp}" if self.etp > 1 else ""))
        if self.vpp > 1:
            parts.append(f"v{self.vpp}")
        parts.append(f"mb{self.micro_batch}")
        return "·".join(parts)


def check_pipeline_shape(pp: int, vpp: int, schedule: str) -> None:
    """UsageError (one line) for a schedule its pipeline cannot take: interleaving (a schedule or model chunks) over one
    rank, said first as no other flag fixes it, then model chunks outside interleaving (what validate_layout and the
    schedule generators, so simulate and train, all check)."""
    if pp == 1 and (vpp > 1 or schedule == "interleaved-1f1b"):
        asked = "interleaved-1f1b" if schedule == "interleaved-1f1b" else f"vpp={vpp}"
        raise UsageError(f"{asked} interleaves model chunks over pipeline ranks, and pp=1 has one — use pp>=2, or drop "
                         f"the interleaving (--schedule 1f1b, --vpp 1)")
    check_chunks_interleave(vpp, schedule)


def check_named_interleaving(pp: int, vpp: int, schedule: str) -> None:
    """UsageError for interleaved 1F1B named with one model chunk a rank: the runtime's schedules (train, simulate)
    interleave at least two (the planner prices Megatron's one-chunk warm-up instead, so validate_layout allows it)."""
    if pp > 1 and schedule == "interleaved-1f1b" and vpp == 1:
        raise UsageError("--schedule interleaved-1f1b with --vpp 1 interleaves nothing (one chunk per rank) — give "
                         "--vpp 2 or more, or --schedule 1f1b")


def check_chunks_interleave(vpp: int, schedule: str) -> None:
    """UsageError for model chunks under a schedule that does not interleave them (the schedule generators' rule too,
    which build an interleaved schedule on one rank as data)."""
    if vpp > 1 and schedule != "interleaved-1f1b":
        raise UsageError(f"--vpp {vpp} needs --schedule interleaved-1f1b (got {schedule}) — name that schedule, or drop "
                         f"--vpp (one model chunk a rank)")


def validate_layout(layout: Layout, model: ModelSpec, global_batch: int, num_gpus: int | None = None,
                    seq_len: int | None = None, edge_chunks: bool = False, split_rule: str = "balanced") -> None:
    """Raise UsageError naming the first thing that makes `layout` impossible for this job. `edge_chunks`: the
    stack may give a model chunk only the embedding or only the loss (Framework.edge_chunks; shardwise's runtime
    may not), so pp*vpp may reach the layers + 2; `split_rule`: how it cuts the layers (Framework.stage_split)."""
    for name in ("dp", "tp", "pp", "cp", "micro_batch", "vpp", "ep", "etp"):
        if getattr(layout, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(layout, name)}")
    if num_gpus is not None and layout.world_size != num_gpus:
        degrees = "dp*tp*pp" + ("*cp" if layout.cp > 1 else "")
        values = "*".join(str(v) for v in (layout.dp, layout.tp, layout.pp) + ((layout.cp,) if layout.cp > 1 else ()))
        raise UsageError(
            f"{degrees} = {values} = {layout.world_size} does not match {num_gpus} GPUs — "
            f"choose degrees whose product is {num_gpus}"
        )
    if seq_len is not None:
        check_sequence_split(layout, model, seq_len)
    if layout.schedule not in SCHEDULES:
        raise UsageError(f"unknown schedule '{layout.schedule}' — choose one of {', '.join(SCHEDULES)}")
    if layout.recompute not in RECOMPUTE:
        raise UsageError(f"unknown recompute '{layout.recompute}' — choose one of {', '.join(RECOMPUTE)}")
    if layout.zero not in ZERO_STAGES:
        raise UsageError(f"unknown ZeRO stage {layout.zero} — choose 0, 1, 2 or 3")
    check_recompute_layers(layout, model, seq_len, split_rule)
    check_hybrid_shard(layout)
    if model.num_heads % layout.tp:
        raise InputError(f"tp={layout.tp} does not divide the {model.num_heads} attention heads of {model.name} — pick a divisor")
    if model.num_kv_heads % layout.tp and layout.tp % model.num_kv_heads:  # fewer KV heads than tp: the stack's call
        raise InputError(f"tp={layout.tp} does not divide the {model.num_kv_heads} KV heads of {model.name}, nor a "
                         f"multiple of them (each rank a copy of its query heads' KV) — pick a divisor of {model.num_kv_heads}")
    if model.ffn_hidden % layout.tp and len(model.moe_layers) < model.num_layers:
        raise InputError(f"tp={layout.tp} does not divide the FFN size {model.ffn_hidden} of {model.name} — pick a divisor")
    validate_experts(layout, model)
    check_chunks(layout.pp, layout.vpp, model, edge_chunks)
    check_pipeline_shape(layout.pp, layout.vpp, layout.schedule)
    if global_batch % layout.dp:
        raise UsageError(f"--global-batch {global_batch} is not divisible by dp={layout.dp} — each dp rank takes an "
                         f"equal slice; pick a multiple of {layout.dp}")
    if global_batch % (layout.dp * layout.micro_batch):
        raise UsageError(
            f"global batch {global_batch} is not divisible by dp*micro_batch = {layout.dp}*{layout.micro_batch} — "
            f"pick a global batch that is a multiple of {layout.dp * layout.micro_batch}"
        )
    m = layout.num_microbatches(global_batch)
    if layout.schedule == "interleaved-1f1b" and m % layout.pp:
        step = layout.dp * layout.micro_batch * layout.pp
        raise UsageError(
            f"interleaved-1f1b needs the number of micro-batches ({m}) to be a multiple of pp={layout.pp} (Megatron's "
            f"rule with its default micro-batch group of pp) — use a global batch that is a multiple of dp*mb*pp = "
            f"{step} (e.g. {max(step, -(-global_batch // step) * step)}), or --schedule 1f1b without --vpp"
        )


def check_chunks(pp: int, vpp: int, model: ModelSpec, edge_chunks: bool) -> None:
    """UsageError when pp*vpp model chunks cannot be cut from the model's layers (stage_split.max_chunks): at most one
    chunk a layer, or the layers + 2 where the stack gives the embedding and the loss a chunk each (`edge_chunks`)."""
    if pp * vpp > max_chunks(model.num_layers, edge_chunks):
        also = " plus a chunk for the embedding and one for the loss" if edge_chunks else ""
        raise UsageError(f"pp*vpp = {pp * vpp} model chunks exceed the {model.num_layers} layers{also} of {model.name} — "
                         f"lower pp or vpp")


def check_recompute_layers(layout: Layout, model: ModelSpec, seq_len: int | None, split_rule: str = "balanced") -> None:
    """--recompute-layers N: whole layers recomputed (full recompute), at least one, at most a model chunk's layers
    (the chunks as the stack's `split_rule` cuts them)."""
    n = layout.recompute_layers
    if n is None:
        return
    if layout.recompute != "full":
        raise UsageError(f"--recompute-layers recomputes whole layers, but --recompute is {layout.recompute} — use "
                         f"--recompute full with it, or drop --recompute-layers")
    if n < 1:
        raise InputError(f"--recompute-layers must be at least 1, got {n} (for no recompute use --recompute none)")
    chunks = layout.pp * layout.vpp
    most = (max_chunk_layers(model, layout.pp, layout.vpp, seq_len, split_rule) if seq_len is not None and chunks <= max_chunks(model.num_layers, True)
            else -(-model.num_layers // chunks))
    if n > most:
        where = "each virtual stage" if layout.vpp > 1 else "each pipeline stage"
        raise UsageError(f"--recompute-layers {n} exceeds the {most} layers {where} holds at most — use at most {most} "
                         f"(or --recompute full without it: every layer)")


def check_hybrid_shard(layout: Layout) -> None:
    """HSDP's shard groups split dp evenly, and only ZeRO-3 (FSDP's FULL_SHARD) has them."""
    if layout.dp_shard < 0:
        raise InputError(f"--dp-shard must be at least 1, got {layout.dp_shard}")
    # a shard group is dp_shard x cp ranks: one rank alone (no cp) shards nothing, every state replicated
    if layout.dp_shard == 1 and layout.cp == 1 and layout.dp > 1:
        raise UsageError("--dp-shard 1 shards nothing (a group of one rank holds every state): that is DDP — use "
                         "--zero 0, or --dp-shard 2 or more")
    if layout.dp_shard and layout.dp % layout.dp_shard:
        raise InputError(f"--dp-shard {layout.dp_shard} does not divide dp={layout.dp} — each shard group takes an "
                         f"equal slice of the data-parallel ranks; pick a divisor of {layout.dp}")
    if layout.replicas > 1 and layout.zero not in (1, 3):
        raise UsageError(f"--dp-shard {layout.dp_shard} needs --zero 3 (hybrid sharding replicates ZeRO-3's shard "
                         f"groups) or --zero 1 on a stack that shards its optimizer within groups (internevo's zero1 "
                         f"size); got ZeRO-{layout.zero}")


def splits_over_tp(seq_len: int, tp: int, cp: int = 1) -> bool:
    """Whether sequence parallelism can split each cp rank's tokens evenly over tp."""
    return (seq_len // cp) % tp == 0


def check_sequence_split(layout: Layout, model: ModelSpec, seq_len: int) -> None:
    """Can each sequence be split over cp (and, with sequence parallelism, each shard over tp)?

    Context parallelism cuts the sequence into 2*cp equal chunks (rank i holds chunks i and 2cp-1-i, which
    balances the causal mask's work). Every position scheme of the supported families is a function of the
    token's global index (RoPE rotates by it, GPT-2 looks it up), so positions split with the tokens: cp neither
    lengthens nor shortens the sequence a model accepts, and that is not a layout's question (the runtime's
    limit: preflight.check_runtime_model; a stack sizes a learned table to the sequence, as Megatron-LM's
    --max-position-embeddings does, a few rows of hidden each that the planner leaves to the config's count)."""
    if layout.cp_mode not in CP_MODES:
        raise UsageError(f"unknown --cp-mode '{layout.cp_mode}' — choose {' or '.join(CP_MODES)}")
    if layout.cp > 1 and seq_len % (2 * layout.cp):
        raise UsageError(
            f"cp={layout.cp} cuts each sequence into 2*cp = {2 * layout.cp} equal chunks (zig-zag causal balance), but "
            f"--seq-len {seq_len} is not divisible by {2 * layout.cp} — use a multiple of {2 * layout.cp}")
    local = seq_len // layout.cp
    if layout.cp == 1 and layout.sequence_parallel and layout.tp > 1 and seq_len % layout.tp:
        raise UsageError(f"sequence parallelism splits the sequence over tp={layout.tp}, but --seq-len {seq_len} is not "
                         f"divisible — use a multiple of {layout.tp}")
    if layout.cp > 1 and layout.sequence_parallel and layout.tp > 1 and local % layout.tp:
        raise UsageError(
            f"sequence parallelism splits each rank's {local} tokens (seq-len {seq_len} / cp {layout.cp}) over tp={layout.tp}, "
            f"which does not divide them — use a sequence length that is a multiple of {layout.cp * layout.tp}")


def runtime_refusal(layout: Layout) -> str | None:
    """What shardwise's runtime cannot run although validate_layout accepts it (one clause), or None.
    launch.check raises it before a job starts; the planner's `shardwise` framework profile skips it. (More model
    chunks than layers, which some stacks cut with a chunk holding only the embedding or only the loss, validate_layout
    refuses unless told the stack runs them — launch.check never tells it so: the runtime builds a layer in every chunk.)"""
    if layout.pp > 1 and layout.schedule == "zb-h1" and layout.zero >= 2:
        return ("zb-h1 splits each backward into input and weight passes, which FSDP (ZeRO 2/3) cannot follow — "
                "use --zero 1 with zb-h1, or another schedule")
    return None


def validate_experts(layout: Layout, model: ModelSpec) -> None:
    """Expert parallelism: ep experts groups x etp expert shards fold over the dp x tp (x cp) ranks of a stage."""
    if not model.is_moe:
        if layout.ep > 1 or layout.etp > 1:
            named = "/".join(f for f, v in (("--ep", layout.ep), ("--etp", layout.etp)) if v > 1)
            raise UsageError(f"{named} split{'s' if '/' not in named else ''} experts, but {model.name} has no experts — "
                             f"drop {'it' if '/' not in named else 'them'} or use a MoE model")
        return
    if model.num_experts % layout.ep:
        raise InputError(f"ep={layout.ep} does not divide the {model.num_experts} experts of {model.name} — pick a divisor "
                         f"of {model.num_experts}")
    if model.moe_ffn_hidden % layout.etp:
        raise InputError(f"etp={layout.etp} does not divide the expert FFN size {model.moe_ffn_hidden} of {model.name} — "
                         f"pick a divisor")
    if model.shared_ffn_hidden % layout.tp:
        raise InputError(f"tp={layout.tp} does not divide the shared-expert FFN size {model.shared_ffn_hidden} of "
                         f"{model.name} — pick a divisor")
    ranks = layout.dp * layout.tp * layout.cp
    if ranks % (layout.ep * layout.etp):
        raise InputError(f"ep*etp = {layout.ep}*{layout.etp} = {layout.ep * layout.etp} does not divide dp*tp*cp = {ranks}: "
                         f"the experts fold over the same ranks as the dense layers — pick ep*etp dividing {ranks}")


@lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    out, rest, p = [1], n, 2
    while p * p <= rest:  # factorise: about sqrt of the largest prime factor steps, not sqrt(n) divisions
        k = 0
        while rest % p == 0:
            rest //= p
            k += 1
        if k:
            out = [d * p**e for d in out for e in range(k + 1)]
        p += 1 if p == 2 else 2
    if rest > 1:
        out += [d * rest for d in out]
    return tuple(sorted(out))


def divisors(n: int) -> list[int]:
    """Every positive divisor of n >= 1, ascending."""
    return list(_divisors(n))
