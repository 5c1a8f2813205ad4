"""CPU offload (`--offload`): states a stack keeps in the host's memory instead of the GPU's, and what moving them costs.

Two kinds, as the stacks name them:
  * "optimizer": the optimizer states and FP32 master weights of this GPU's shard live in CPU memory and the optimizer
    steps there (DeepSpeed's ZeRO-Offload, `offload_optimizer: cpu`, whose gradient partitions go to the CPU too;
    Megatron-Core's --optimizer-cpu-offload, whose FP32 gradients stay in the GPU's buffer and are copied for the step).
    Each step copies the shard's gradients to the host, steps on the CPU and copies the updated weights back.
  * "params": the parameter shards too, with their gradients (DeepSpeed's ZeRO-3 `offload_param: cpu`, PyTorch FSDP's
    CPU offload): every gather of a unit first copies this GPU's shard to it, every reduce-scatter copies its output
    shard back, and the optimizer steps on the host in place.
What each stack can offload is its profile's (Framework.offload). The rates are the cluster file's host keys
(host_link_gbs per GPU, host_memory_bandwidth_gbs and host_memory_gib per node); the CPU step moves the same bytes
per parameter as the stack's GPU step (Framework.optimizer_traffic), through the node's memory, all its GPUs' shards at
once. Not modelled: offloading activations (DeepSpeed's cpu_checkpointing, Megatron-Core's --cpu-offloading), NVMe.
"""

from __future__ import annotations

from shardwise.errors import UsageError
from shardwise.planner.framework import Framework

OFFLOADS = ("optimizer", "params")
# Bytes per parameter of the FP32 gradient copied to the host for the CPU step (DeepSpeed casts each partition to FP32
# on the GPU before the copy, Megatron copies its FP32 main gradients) and of the updated weights copied back: the
# stack's weight dtype (Megatron's precision-aware path copies the FP32 master back: Framework.offload_update_bytes).
GRAD_COPY_BYTES = 4


def check_offload(fw: Framework, cluster, offload: str) -> None:
    """One line, exit 2, when the stack cannot offload `offload` or the cluster file does not say what its host is."""
    if not offload:
        return
    if offload not in OFFLOADS:
        raise UsageError(f"unknown --offload '{offload}' — choose one of {', '.join(OFFLOADS)}")
    if offload not in fw.offload:
        does = f"offloads only {' and '.join(fw.offload)}" if fw.offload else "has no CPU offload"
        raise UsageError(f"--offload {offload}: {fw.name} {does} — " + (f"use --offload {fw.offload[0]}" if fw.offload
                                                                         else "drop --offload, or pick a stack that offloads"))
    if not host_stated(cluster):
        raise UsageError(f"--offload {offload}: the cluster {cluster.name} does not say what its host is — add "
                         f"host_link_gbs (GPU to CPU memory, per GPU, one way) and host_memory_bandwidth_gbs (per node) "
                         f"to its [cluster] table (the dgx-* presets have them)")


def host_stated(cluster) -> bool:
    """Whether the cluster file gives the host rates an offload is priced at (its link and its memory's bandwidth)."""
    return bool(cluster.host_link_bandwidth and cluster.host_memory_bandwidth)


def offload_refusal(fw: Framework, offload: str, layout) -> str | None:
    """Why the stack cannot offload on this layout (one clause naming the fix), or None: the states it offloads are
    its shards, at the stage it offloads from, which its pipeline must allow; parameter shards need ranks to shard
    over (dp x cp)."""
    if not offload:
        return None
    sharded_over = layout.dp * layout.cp
    if offload == "params" and sharded_over <= 1:
        other = "use --offload optimizer, or " if "optimizer" in fw.offload else "use "
        return ("--offload params moves the parameter shards ZeRO-3 / FSDP cut over data-parallel ranks, and this "
                f"layout has none (dp x cp = 1): {other}a layout with dp > 1")
    need = fw.offload_params_zero if offload == "params" else fw.offload_zero
    if layout.pp > 1 and need > fw.max_zero_with_pp and fw.schedules:
        return (f"{fw.name} offloads {offload} from ZeRO-{need} up, which it cannot combine with a pipeline (at most "
                f"ZeRO-{fw.max_zero_with_pp}): use --pp 1, or drop --offload")
    if layout.zero < need and sharded_over > 1:
        return f"{fw.name} offloads {offload} from ZeRO-{need} up, and this layout runs ZeRO-{layout.zero} (use --zero {need})"
    return None


def gradients_on_host(fw: Framework, offload: str, zero: int) -> bool:
    """Whether the gradient shard lives on the host (and leaves the GPU's breakdown): DeepSpeed's ZeRO-Offload
    partitions and FSDP's offloaded shards, where the stage `zero` (as it acts) shards the gradients."""
    return bool(offload) and (fw.offload_grads or offload == "params") and zero >= 2


def copies_per_unit(fw: Framework, offload: str, zero: int) -> tuple[bool, bool]:
    """(this GPU's shard copied in before each gather, its gradient shard copied out after each reduce-scatter): where
    the stack gathers and reduce-scatters unit by unit (FSDP's ZeRO-2/3, DeepSpeed's ZeRO-3; overlap.fsdp_exposed)."""
    unit_by_unit = zero >= 3 or (zero == 2 and not fw.zero2_reduce_every_microbatch)
    if not (offload and unit_by_unit):
        return False, False
    return offload == "params", gradients_on_host(fw, offload, zero)


def host_bytes(fw: Framework, offload: str, zero: int, shard: float, weight_bytes: int, optimizer_bytes: int) -> float:
    """Bytes one GPU keeps in CPU memory for its `shard` parameters: the optimizer states and master, the FP32 gradient
    partition where the stack keeps one there (DeepSpeed's from ZeRO-1, whose GPU keeps its whole gradients below
    ZeRO-2 too; FSDP's offloaded shards), with "params" the parameter shard (unless it is the master, counted with
    the optimizer)."""
    if not offload:
        return 0.0
    held = optimizer_bytes * shard
    if gradients_on_host(fw, offload, zero) or (fw.offload_grads and zero >= 1):
        held += GRAD_COPY_BYTES * shard
    if offload == "params" and not fw.weight_shard_is_master:
        held += weight_bytes * shard
    return held


def step_time(fw: Framework, cluster, offload: str, zero: int, shard: float, weight_bytes: int,
              optimizer_traffic: float, node_gpus: int, microbatches: int) -> float:
    """Seconds one step spends on the host side of the optimizer, exposed after the last reduction: the gradient
    shard copied to the host (already there where it went unit by unit, copies_per_unit; once per micro-batch where
    DeepSpeed's ZeRO-2 reduces every micro-batch into host memory), the CPU step over the `node_gpus` shards a node
    holds (they step at once, through its memory), and the updated weights copied back (none with "params": the next
    gathers copy them in)."""
    if not offload:
        return 0.0
    link = cluster.host_link_bandwidth
    cpu = optimizer_traffic * shard * node_gpus / cluster.host_memory_bandwidth
    if copies_per_unit(fw, offload, zero)[1]:
        grads = 0
    elif gradients_on_host(fw, offload, zero) and fw.zero2_reduce_every_microbatch:
        grads = microbatches
    else:
        grads = 1
    back = 0 if offload == "params" else (fw.offload_update_bytes or weight_bytes)
    return (grads * GRAD_COPY_BYTES + back) * shard / link + cpu


def unit_copy_time(cluster, nbytes: float, copied: bool) -> float:
    """The seconds of one shard's copy between host and GPU beside a unit's gather or reduce-scatter (`nbytes`), which
    it precedes or follows on the same stream; 0 where it is not copied (copies_per_unit)."""
    return nbytes / cluster.host_link_bandwidth if copied else 0.0
