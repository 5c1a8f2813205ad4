"""The `shardwise` profile states what this project's runtime does (the contract: "exactly what this project's runtime
does"). Each case reads the behaviour off the runtime, on gloo ranks, and checks the planner prices that, not another
stack's: a pipeline's data-parallel reduction after the schedule, split experts' after the backward, whole experts'
gradients summed over tp."""

from __future__ import annotations

import dataclasses
import json
import os

from torch.nn.parallel import DistributedDataParallel

from shardwise.launch import spawn_ranks
from shardwise.planner.job import make_job
from shardwise.planner.layer_time import layer_cost, tp_element_bytes, tp_layer_comm
from shardwise.planner.step_time import tp_edge_time
from shardwise.planner.overlap import grad_reduce_behind
from shardwise.planner import estimate
from shardwise.planner.step_time import whole_experts_time
from shardwise.specs import Layout, load_cluster, load_model


def _runtime_facts(rank, world, out_dir):
    from shardwise.parallel import build_mesh
    from shardwise.train import TrainConfig, build_runtime, launch_step

    facts = {}
    for name, model, lay in (("pp2-dp2", "tiny", Layout(dp=2, pp=2, micro_batch=2)),
                             ("tp2-ep1", "tiny-moe", Layout(dp=2, tp=2, micro_batch=2)),
                             ("dp4-ep2", "tiny-moe", Layout(dp=4, ep=2, micro_batch=1)),
                             ("dp4-zero3", "tiny", Layout(dp=4, zero=3, micro_batch=1)),
                             ("pp2-tp2", "tiny", Layout(pp=2, tp=2, micro_batch=2)),
                             ("tp2-ep1-zero3", "tiny-moe", Layout(dp=2, tp=2, zero=3, micro_batch=2)),
                             ("dp4-zero1", "tiny", Layout(dp=4, zero=1, micro_batch=1))):
        if lay.world_size != world:
            continue
        cfg = TrainConfig(load_model(model), lay, steps=1, global_batch=8, seq_len=16, progress=False)
        rt = build_runtime(cfg, build_mesh(lay.pp, lay.dp, lay.tp, backend="gloo", timeout_s=60))
        executor = getattr(rt.forward_backward, "executor", None)
        facts[name] = {"sent": [list(executor.activation_shape), str(executor.dtype)] if executor else None,
                       "ddp": any(isinstance(c.module, DistributedDataParallel) for c in rt.chunks),
                       "tp_summed_experts": [n for c in rt.chunks for n in c.sp_partial_grads if ".experts." in n],
                       "split_experts": any(c.experts is not None for c in rt.chunks),
                       "sharded_experts": any(type(p).__name__ == "DTensor" for c in rt.chunks
                                              for n, p in c.model.named_parameters() if ".experts." in n),
                       "fsdp2": any(type(m).__name__.startswith("FSDP") for c in rt.chunks for m in c.module.modules()),
                       "fused_adamw": [type(getattr(o, "optim", o)).__name__ + str(getattr(o, "optim", o).defaults["fused"])
                                       for o in getattr(rt.optimizer, "parts", [rt.optimizer])],
                       "clipped": len(rt.grad_norm.scaled),
                       "params": sum(1 for c in rt.chunks for _ in c.module.parameters())}
        if name == "dp4-zero1":  # after a step, a ZeroRedundancyOptimizer holds its shard's states
            launch_step(rt).read()
            facts[name]["stepped"] = len(rt.optimizer.optim.state)
    if rank == 0:
        with open(os.path.join(out_dir, f"facts-{world}.json"), "w") as f:
            json.dump(facts, f)


def test_the_profile_reduces_where_the_runtime_does(tmp_path):
    spawn_ranks(_runtime_facts, 4, str(tmp_path), timeout_s=120)
    facts = json.loads((tmp_path / "facts-4.json").read_text())
    h100 = load_cluster("dgx-h100-80gb")
    dense, moe = load_model("llama3-8b"), load_model("mixtral-8x7b")

    # A pipeline's chunks are not DDP modules: no hook reduces behind their backward; PipelineStep all-reduces after
    # the schedule. The profile says so (megatron-core's overlaps it).
    assert not facts["pp2-dp2"]["ddp"]
    pp = Layout(dp=2, pp=2, micro_batch=1, zero=1)
    assert grad_reduce_behind(make_job(dense, h100, 64, 4096, "shardwise"), pp) is False
    assert grad_reduce_behind(make_job(dense, h100, 64, 4096, "shardwise"), pp.with_(pp=1, dp=4)) is True
    assert grad_reduce_behind(make_job(dense, h100, 64, 4096, "megatron-core"), pp) is True

    # Whole experts under tp (ep = etp = 1): their gradients are in the list summed over tp once a step; priced.
    assert facts["tp2-ep1"]["tp_summed_experts"] and not facts["tp2-ep1"]["split_experts"]
    job = make_job(moe, h100, 256, 4096, "shardwise")
    whole = Layout(dp=16, tp=2, pp=2, micro_batch=1, zero=1)
    assert whole_experts_time(job, whole) > 0 and whole_experts_time(job, whole.with_(ep=2)) == 0
    assert whole_experts_time(make_job(moe, h100, 256, 4096, "megatron-core"), whole) == 0
    assert estimate(job, whole).time_s["step_comm"] > estimate(job, whole.with_(ep=2)).time_s["step_comm"]
    # under ZeRO-3 FSDP shards them with their blocks: each tp rank sums its 1/dp shard, a smaller all-reduce
    assert facts["tp2-ep1-zero3"]["tp_summed_experts"] and facts["tp2-ep1-zero3"]["sharded_experts"]
    assert whole_experts_time(job, whole.with_(zero=3)) < whole_experts_time(job, whole) / 4

    # ZeRO-3 is FSDP2's fully_shard: its copies into and out of the collectives' buffers are priced on a datasheet
    # cluster (a calibration measured them with the calls).
    from shardwise.planner.frameworks import get
    from shardwise.planner.overlap import fsdp_copy_time

    assert facts["dp4-zero3"]["fsdp2"] and get("shardwise").torch_fsdp == 2
    assert fsdp_copy_time(make_job(dense, h100, 64, 4096, "shardwise"), get("shardwise"), 1e9, 1e9, 1e9, 8) > 0

    # The optimizer: torch's fused AdamW on the FP32 parameters (no master copy: optimizer_traffic 28), the clip over
    # every gradient the rank holds — under ZeRO-1 all of them, while AdamW steps its shard — so the step's HBM
    # traffic is not 1/dp of ZeRO-0's.
    zero1 = facts["dp4-zero1"]
    assert zero1["fused_adamw"] == ["AdamWTrue"] and facts["pp2-dp2"]["fused_adamw"] == ["AdamWTrue"]
    assert zero1["clipped"] == zero1["params"] and 0 < zero1["stepped"] < zero1["params"]
    job = make_job(dense, h100, 64, 4096, "shardwise")
    step = lambda lay: estimate(job, lay).time_s["optimizer"]
    assert step(Layout(dp=8, micro_batch=1, zero=1)) > step(Layout(dp=8, micro_batch=1, zero=0)) / 8 * 1.5

    # A stage sends the next its whole FP32 activation from every TP rank without SP (no scatter-gather): the pipeline
    # term's transfer is that message (hidden 64 of tiny, micro-batch 2 x 16 tokens).
    from shardwise.planner.step_time import pipeline_costs

    assert facts["pp2-tp2"]["sent"] == [[2, 16, load_model("tiny").hidden], "torch.float32"]
    lay = Layout(pp=2, tp=2, dp=2, micro_batch=1)
    ours = pipeline_costs(make_job(dense, h100, 64, 4096, "shardwise"), lay)[1]
    split = pipeline_costs(make_job(dense, h100, 64, 4096, "megatron-core"), lay)[1]  # 1/tp, in BF16
    assert ours > 2 * split

    # Split experts: reduced over their replicas by sync_expert_grads after the backward, not by DDP's hooks.
    assert facts["dp4-ep2"]["split_experts"] and not facts["dp4-ep2"]["tp_summed_experts"]
    split = Layout(dp=32, pp=1, ep=8, micro_batch=1, zero=1)
    assert grad_reduce_behind(job, split, experts=True) is False and grad_reduce_behind(job, split) is True


def _ddp_grads_across_microbatches(rank, world, out_dir):
    from shardwise.parallel import build_mesh
    from shardwise.train import TrainConfig, build_runtime, launch_step

    lay = Layout(dp=2, micro_batch=1)  # 4 micro-batches a step: three under no_sync, then the synchronising one
    rt = build_runtime(TrainConfig(load_model("tiny"), lay, steps=3, global_batch=8, seq_len=16, progress=False),
                       build_mesh(1, 2, 1, backend="gloo", timeout_s=60))
    ddp = next(c.module for c in rt.chunks)
    seen = []  # before each micro-batch's forward: where the gradients the earlier ones made live
    ddp.module.register_forward_pre_hook(lambda m, a: seen.append(
        sorted({p.grad.untyped_storage().data_ptr() for p in m.parameters() if p.grad is not None})))
    for _ in range(2):  # DDP points the gradients at its buckets from its first synchronised backward on
        launch_step(rt).read()
    seen.clear()
    launch_step(rt).read()
    if rank == 0:
        with open(os.path.join(out_dir, "ddp.json"), "w") as f:
            json.dump({"seen": seen}, f)


def test_ddp_gradients_stay_in_its_buckets_through_accumulation(tmp_path):
    """The planner counts one FP32 gradient per parameter under DDP: the runtime's gradients are views into DDP's
    buckets (gradient_as_bucket_view), zeroed in place each step so the no_sync micro-batches accumulate into the
    buckets too (set to None, they had made fresh gradients beside the buckets: every gradient held twice)."""
    spawn_ranks(_ddp_grads_across_microbatches, 2, str(tmp_path), timeout_s=120)
    seen = json.loads((tmp_path / "ddp.json").read_text())["seen"]
    assert len(seen) == 4 and seen[0], seen  # the step starts with the gradients in place, zeroed
    assert all(s == seen[0] for s in seen), seen  # and every micro-batch accumulates into the same storage


def _tp_collective_dtypes(rank, world, out_dir):
    """Every tensor-parallel collective of one forward and backward under the GPU's precision (FP32 weights under BF16
    autocast, here CPU autocast): (phase, kind, dtype) in call order."""
    import importlib

    import torch
    import torch.distributed as dist

    from shardwise.parallel import build_mesh

    tensor_parallel = importlib.import_module("shardwise.parallel.tensor_parallel")  # the package exports a function
    from shardwise.train import TrainConfig, build_runtime, forward_backward

    calls, phase = [], ["forward"]
    record = lambda kind, t: calls.append([phase[0], kind, str(t.dtype).removeprefix("torch."), t.numel()])
    all_reduce, gather, scatter = dist.all_reduce, tensor_parallel._all_gather_single, tensor_parallel._reduce_scatter_single
    backward = torch.Tensor.backward

    def run_backward(self, *a, **k):
        phase[0] = "backward"
        return backward(self, *a, **k)

    dist.all_reduce = lambda t, *a, **k: (record("all_reduce", t), all_reduce(t, *a, **k))[1]
    tensor_parallel._all_gather_single = lambda out, t, *a, **k: (record("all_gather", t), gather(out, t, *a, **k))[1]
    tensor_parallel._reduce_scatter_single = lambda out, t, *a, **k: (record("reduce_scatter", t), scatter(out, t, *a, **k))[1]
    torch.Tensor.backward = run_backward
    facts = {}
    for name, model, sp in (("tp", "tiny", False), ("sp", "tiny", True), ("gpt2-sp", "tiny-gpt2", True),
                            ("moe-tp", "tiny-moe", False)):
        lay = Layout(tp=2, micro_batch=2, sequence_parallel=sp)
        cfg = TrainConfig(load_model(model), lay, steps=1, global_batch=2, seq_len=16, progress=False,
                          autocast="bfloat16")
        rt = build_runtime(cfg, build_mesh(1, 1, 2, backend="gloo", timeout_s=60))
        tokens = torch.randint(0, cfg.spec.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
        calls.clear()
        phase[0] = "forward"
        forward_backward(rt.chunks, [(tokens[:, :-1], tokens[:, 1:])], amp=cfg.autocast)
        facts[name] = list(calls)
    if rank == 0:
        with open(os.path.join(out_dir, "tp-dtypes.json"), "w") as f:
            json.dump(facts, f)


def test_tp_collectives_are_priced_in_the_dtypes_the_runtime_sends(tmp_path):
    """Under autocast the runtime's residual stream is FP32: the embedding's output and each column-parallel group's
    input (a norm's FP32 output, whose gradient f all-reduces backward) move 4 bytes an element, the row-parallel
    outputs and everything sequence parallelism gathers (cast first) 2. The profile prices what the runtime sends."""
    spawn_ranks(_tp_collective_dtypes, 2, str(tmp_path), timeout_s=120)
    facts = json.loads((tmp_path / "tp-dtypes.json").read_text())
    size = {"float32": 4, "bfloat16": 2}
    layers = load_model("tiny").num_layers
    job = make_job(load_model("llama3-8b"), load_cluster("dgx-h100-80gb"), 64, 4096, "shardwise")
    priced = tp_element_bytes(job)
    assert priced == (2, 4)
    for name in facts:
        facts[name] = [c[:3] + [c[3] // (2 * 16)] for c in facts[name]]  # elements per token of the micro-batch
    stats = ["forward", "all_gather", "float32", 2]  # the loss's two statistics a token (step_time.tp_edge_time)
    plain = facts["tp"]
    assert plain.pop(1 + 2 * layers) == stats
    # forward: the embedding's sum, two row-parallel outputs a layer; backward: f's sum for each column group, and
    # for the head's input
    assert [(p, size[d]) for p, k, d, _ in plain] == ([("forward", priced.residual)] + [("forward", priced.outputs)] * 2 * layers
                                                   + [("backward", priced.residual)] * (2 * layers + 1)), plain
    assert {k for _, k, _, _ in plain} == {"all_reduce"}
    sp = facts["sp"]
    assert sp.pop(2 + 4 * layers) == stats
    # the embedding's reduce-scatter and its gradient's gather move the stream; everything else SP moves is cast first
    assert sp[0][:3] == ["forward", "reduce_scatter", "float32"] and sp[-1][:3] == ["backward", "all_gather", "float32"]
    assert size[sp[0][2]] == priced.residual and {size[d] for _, _, d, _ in sp[1:-1]} == {priced.outputs}, sp
    # GPT-2's learned positions enter the sequence split by their own scatter: its backward gathers one sequence's
    # position gradient (no batch dimension) in FP32 — priced (sp_scatters_positions)
    hidden = load_model("tiny-gpt2").hidden
    assert ["backward", "all_gather", "float32", (16 // 2) * hidden // (2 * 16)] in facts["gpt2-sp"], facts["gpt2-sp"]
    gpt2 = load_model("gpt2")
    edge = lambda m: tp_edge_time(make_job(m, load_cluster("dgx-h100-80gb"), 64, 1024, "shardwise"),  # noqa: E731
                                  Layout(dp=8, tp=8, micro_batch=1, sequence_parallel=True), 0, 1024)[1]
    assert edge(gpt2) > edge(dataclasses.replace(gpt2, positions="rotary"))
    # a MoE layer's routed output leaves the experts FP32 (weighted by FP32 routing probabilities) and is gathered
    # over tp so: the dispatch path is priced at the stream's bytes (moe.dispatch_time `stream`)
    moe_h = load_model("tiny-moe").hidden
    moe_layers = len(load_model("tiny-moe").moe_layers)
    gathers = [c for c in facts["moe-tp"] if c[:2] == ["forward", "all_gather"] and c[3] == moe_h // 2]  # 1/tp
    assert len(gathers) == moe_layers and {size[c[2]] for c in gathers} == {priced.residual}, facts["moe-tp"]
    moe_job = make_job(load_model("mixtral-8x7b"), load_cluster("dgx-h100-80gb"), 64, 4096, "shardwise")
    bf16_stream = dataclasses.replace(moe_job, saved=dataclasses.replace(moe_job.saved, autocast_casts=False))
    routed = lambda job: layer_cost(job, Layout(dp=2, tp=4, ep=2, micro_batch=1), moe_layer=True).ep_fwd  # noqa: E731
    assert routed(moe_job) > routed(bf16_stream)
    # and the planner charges them: without SP the backward's FP32 sums take longer than the forward's BF16 ones
    f, b, _ = tp_layer_comm(job, Layout(dp=8, tp=8, micro_batch=1), 4096, [(0.0, 0.0)] * 4)
    assert b > 1.5 * f
