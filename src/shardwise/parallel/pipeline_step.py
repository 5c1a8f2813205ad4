"""Pipeline parallelism in the training loop: build this rank's stage chunks, run the schedule over
them each step, then the once-per-step work around it (dp gradient averaging, tied embeddings).

    chunks, step = build_pipeline(cfg, mesh, device)   # chunks: `Sharded`, one per virtual stage of this rank
    loss = step(chunks, microbatches)                  # train.py's forward_backward seam

The executor (the schedule's actions and their point-to-point traffic) is parallel/pipeline.py; which
layers each stage holds is shardwise.stage_split, the same cut the planner scores.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from shardwise import precision
from shardwise.parallel.expert_parallel import expert_names
from shardwise.parallel.mesh import coordinates, data_dim, edge_group, group
from shardwise.parallel.pipeline import PipelineExecutor
from shardwise.schedules import build, validate, virtual_stage
from shardwise.specs import ModelSpec
from shardwise.stage_split import split_layers
from shardwise.trace import aligned_epoch


def build_stage_chunks(spec: ModelSpec, pp: int, vpp: int, pp_rank: int, *, seed: int, seq_len: int,
                       recompute: str = "none", recompute_layers: int | None = None, device="cpu") -> list[nn.Module]:
    """The model chunks rank `pp_rank` holds, in chunk order: chunk c is virtual stage c*pp + pp_rank."""
    from shardwise.model import Transformer

    stages = split_layers(spec, pp * vpp, seq_len)
    chunks = []
    for c in range(vpp):
        s = virtual_stage(pp_rank, c, pp)
        chunks.append(Transformer(spec, seed=seed, layer_ids=stages[s], first=s == 0, last=s == pp * vpp - 1,
                                  device=device, recompute=recompute, recompute_layers=recompute_layers))
    return chunks


class PipelineStep:
    """The training loop's `forward_backward` under pipeline parallelism.

    Runs this rank's schedule over the step's micro-batches; then, once per step, averages the
    gradients over dp x cp (ZeRO 0/1: one flat all-reduce per chunk — DDP's per-micro-batch hooks would
    fire on the wrong backward in an interleaved schedule) and sums tied embedding gradients between
    the first and the last stage. FSDP (ZeRO 2/3) reduces its own gradients with the chunk's last
    weight backward (`grad_sync`)."""

    def __init__(self, executor: PipelineExecutor, dp_group, zero: int, tied=None, keep_records: bool = False):
        self.executor, self.dp_group, self.zero, self.tied = executor, dp_group, zero, tied
        self.keep_records = keep_records  # every step's records (for --trace), else only the last step's
        self.epoch = aligned_epoch(executor.device)

    def __call__(self, chunks, microbatches):
        if not self.keep_records:
            self.executor.records.clear()
        loss = self.executor.step([x for x, _ in microbatches], [y for _, y in microbatches], self.epoch)
        if self.dp_group is not None and self.zero < 2:
            for chunk in chunks:
                average_gradients(chunk.module, self.dp_group, skip=expert_names(chunk))
        if self.tied is not None:
            self.tied.sync()
        return loss

    def forward_only(self, chunks, microbatches):
        """Validation: the mean micro-batch loss on the last stage's ranks, no gradients."""
        return self.executor.forward_only([x for x, _ in microbatches], [y for _, y in microbatches])


def average_gradients(module: nn.Module, group, skip=frozenset()) -> None:
    """One flat all-reduce of the gradients over dp, averaged; `skip`: experts split over ep (sync_expert_grads)."""
    grads = [p.grad for n, p in module.named_parameters() if p.grad is not None and n not in skip]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    for g, new in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(new.view_as(g))


class TiedEmbeddings:
    """GPT-2 ties the LM head to the embedding; with pp > 1 they live on the first and the last stage,
    so their gradients are summed between those two ranks each step (Megatron's embedding group,
    `mesh.edge_group`). The last stage's copy is then a replica (`Sharded.replicas`): checkpoints load
    it from the embedding's key and the gradient norm counts it once."""

    def __init__(self, mesh, chunks, timeout_s: float):
        self.group = edge_group(mesh, timeout_s)
        self.weight = None
        for chunk in chunks:
            if chunk.model.tok_embeddings is not None:
                self.weight = chunk.model.tok_embeddings.weight
            if chunk.model.output is not None:
                self.weight = chunk.model.output.weight

    def sync(self):
        if self.group is not None and self.weight is not None and self.weight.grad is not None:
            # Under FSDP both copies are sharded alike over dp (same rows, same dp rank): sum the shards.
            grad = self.weight.grad
            dist.all_reduce(grad.to_local() if isinstance(grad, DTensor) else grad, group=self.group)


def build_pipeline(cfg, mesh, device) -> tuple[list, PipelineStep]:
    """This rank's model chunks (tensor- and data-parallel `Sharded`) and the step that runs the schedule on them."""
    from shardwise.hf.load import loader
    from shardwise.parallel import grad_sync, parallelize

    lay, spec = cfg.layout, cfg.spec
    pp_rank = coordinates(mesh)["pp"]
    models = build_stage_chunks(spec, lay.pp, lay.vpp, pp_rank, seed=cfg.seed, seq_len=cfg.seq_len,
                                recompute=lay.recompute, recompute_layers=lay.recompute_layers,
                                device="meta" if cfg.weights else "cpu")
    chunks = [parallelize(model, mesh, lay, device, replicate=False, seq_len=cfg.seq_len, weights=loader(cfg.weights))
              for model in models]
    tied = None
    if spec.tie_embeddings:
        # The last stage's LM head is a copy of the first stage's embedding.
        chunks = [replace(c, replicas=frozenset({"output.weight"})) if c.model.output is not None else c for c in chunks]
        tied = TiedEmbeddings(mesh, chunks, cfg.timeout_s)
    schedule = validate(build(lay.schedule, lay.pp, lay.num_microbatches(cfg.global_batch), lay.vpp))
    seq = cfg.seq_len // lay.cp  # this cp rank's tokens
    seq = seq // lay.tp if lay.sequence_parallel and lay.tp > 1 else seq
    amp = partial(precision.autocast, torch.device(device).type, cfg.autocast)
    executor = PipelineExecutor(schedule, pp_rank, [c.module for c in chunks], group(mesh, "pp"),
                                (lay.micro_batch, seq, spec.hidden), device=device, amp=amp,
                                grad_sync=lambda c, last: grad_sync(chunks[c], enabled=last),
                                synchronize=bool(cfg.trace_dir) and torch.device(device).type == "cuda")
    return chunks, PipelineStep(executor, group(mesh, data_dim(mesh)), lay.zero, tied, keep_records=bool(cfg.trace_dir))
