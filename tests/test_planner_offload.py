"""CPU offload (`--offload optimizer|params`, planner/offload.py): what moves to the host leaves the GPU's breakdown, the
copies and the CPU step are priced at the cluster's host rates, the host's memory bounds what fits, and a stack, ZeRO
stage or cluster that cannot offload is refused in one line. Each expected number is worked out here from the cluster
file's rates and the model's parameter count, not read back from the planner."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from shardwise.cli import main
from shardwise.specs import load_cluster, load_model

JOB = ["--model", "llama2-70b", "--gpus", "8", "--global-batch", "16", "--seq-len", "4096", "--tp", "1", "--pp", "1",
       "--micro-batch", "1", "--recompute", "full", "--json"]


def run(*argv) -> tuple[int, dict | str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, (json.loads(out.getvalue()) if code == 0 else err.getvalue())


def estimate(cluster: str, framework: str, *extra: str) -> dict:
    code, out = run("estimate", *JOB, "--cluster", cluster, "--framework", framework, *extra)
    assert code == 0, out
    return out


def test_optimizer_offload_empties_the_gpus_optimizer_and_gradient_partitions_and_fits_a_70b_on_one_node():
    """DeepSpeed ZeRO-3 of a 70B model over 8 A100-80GB: 96 GiB of optimizer shards alone do not fit; offloaded, the
    GPU keeps its weights and activations only, and the node's host holds 16 bytes of each of its parameters."""
    before = estimate("dgx-a100-80gb", "deepspeed-2024", "--zero", "3")
    after = estimate("dgx-a100-80gb", "deepspeed-2024", "--zero", "3", "--offload", "optimizer")
    assert not before["fits"] and after["fits"]
    assert before["memory_breakdown_gib"]["optimizer"] > 90 and after["memory_breakdown_gib"]["optimizer"] == 0
    assert after["memory_breakdown_gib"]["gradients"] == 0  # DeepSpeed's gradient partitions go to the host
    assert after["memory_breakdown_gib"]["weights"] == before["memory_breakdown_gib"]["weights"]
    params = load_model("llama2-70b").num_params()
    # 12 B of Adam states and master + 4 B of FP32 gradient for every parameter, the node's 8 shards being the model
    assert after["host_memory_gib_per_node"] == pytest.approx(16 * params / 2**30, rel=1e-3)
    assert after["offload"] == "optimizer" and before["offload"] == "none"


def test_the_host_side_of_the_step_is_the_copies_over_the_host_link_and_the_cpu_step_over_host_memory():
    c = load_cluster("dgx-a100-80gb")
    shard = load_model("llama2-70b").num_params() / 8
    out = estimate("dgx-a100-80gb", "deepspeed-2024", "--zero", "3", "--offload", "optimizer")
    copies = (4 + 2) * shard / c.host_link_bandwidth  # FP32 gradients out, FP16 weights back
    cpu = 34 * shard * 8 / c.host_memory_bandwidth  # one fused Adam pass (34 B a parameter) over the node's shards
    assert out["time_breakdown_s"]["offload"] == pytest.approx(copies + cpu, rel=1e-3)
    assert out["time_breakdown_s"]["optimizer"] == 0  # the GPU does not step
    plain = estimate("dgx-a100-80gb", "deepspeed-2024", "--zero", "3", "--no-flash-attention")
    assert "offload" not in plain["time_breakdown_s"]


def test_param_offload_also_moves_the_weight_shards_and_copies_each_gather_in():
    opt = estimate("dgx-a100-80gb", "deepspeed-2024", "--zero", "3", "--offload", "optimizer")
    par = estimate("dgx-a100-80gb", "deepspeed-2024", "--zero", "3", "--offload", "params")
    shard = load_model("llama2-70b").num_params() / 8
    # the 2-byte weight shard leaves the GPU, the gathered layers stay
    assert opt["memory_breakdown_gib"]["weights"] - par["memory_breakdown_gib"]["weights"] == pytest.approx(
        2 * shard / 2**30, rel=1e-3)
    assert par["host_memory_gib_per_node"] - opt["host_memory_gib_per_node"] == pytest.approx(2 * shard * 8 / 2**30,
                                                                                              rel=1e-3)
    assert par["time_breakdown_s"]["dp_comm"] > opt["time_breakdown_s"]["dp_comm"]  # the shard copied in per gather
    assert par["time_breakdown_s"]["offload"] < opt["time_breakdown_s"]["offload"]  # no weights copied back


def test_the_hosts_memory_bounds_what_fits():
    """The same job on DGX A100 40GB nodes (1 TB of host memory each) with every parameter's 16 offloaded bytes (1.1
    TB a node): the GPUs would hold it, the host cannot."""
    out = estimate("dgx-a100-80gb", "deepspeed-2024", "--zero", "3", "--offload", "optimizer")
    assert out["fits"] and out["host_memory_gib_per_node"] > load_cluster("dgx-a100-40gb").host_memory_bytes / 2**30
    small = estimate("dgx-a100-40gb", "deepspeed-2024", "--zero", "3", "--offload", "params")
    assert small["memory_gib_per_gpu"] < 40 and small["host_memory_gib_per_node"] > 1024 and not small["fits"]


def test_fsdp_offloads_the_parameter_shards_and_megatron_core_the_optimizer():
    fsdp = estimate("dgx-h100-80gb", "torchtitan", "--offload", "params")
    assert fsdp["fits"] and fsdp["memory_breakdown_gib"]["optimizer"] == 0 == fsdp["memory_breakdown_gib"]["gradients"]
    mc = estimate("dgx-h100-80gb", "megatron-core", "--zero", "1", "--offload", "optimizer")
    assert mc["memory_breakdown_gib"]["optimizer"] == 0 and mc["memory_breakdown_gib"]["gradients"] > 0  # its buffer


@pytest.mark.parametrize("argv, words", [
    (["--framework", "torchtitan", "--offload", "optimizer"], "torchtitan offloads only params — use --offload params"),
    (["--framework", "megatron-2021", "--offload", "optimizer"], "megatron-2021 has no CPU offload"),
    (["--framework", "deepspeed", "--zero", "1", "--offload", "optimizer"], "from ZeRO-2 up"),
    (["--framework", "deepspeed-2024", "--zero", "2", "--offload", "params"], "from ZeRO-3 up"),
    (["--framework", "deepspeed-2024", "--offload", "sideways"], "invalid choice"),
    (["--framework", "deepspeed-2024", "--tp", "8", "--zero", "3", "--offload", "params"], "dp x cp = 1"),
])
def test_what_cannot_offload_is_refused_in_one_line(argv, words):
    code, err = run("estimate", *JOB, "--cluster", "dgx-a100-80gb", *argv)
    assert code == 2 and words in err and err.count("\n") == 1, err


def test_a_cluster_without_host_keys_is_told_which_to_add(tmp_path):
    code, err = run("estimate", *JOB, "--cluster", "h100-96gb-500w", "--framework", "deepspeed-2024", "--zero", "3",
                    "--offload", "optimizer")
    assert code == 2 and "host_link_gbs" in err and err.count("\n") == 1, err


def test_plan_with_offload_ranks_only_stages_that_offload():
    code, out = run("plan", "--model", "llama2-70b", "--cluster", "dgx-a100-80gb", "--gpus", "8", "--global-batch", "16",
                    "--seq-len", "4096", "--framework", "deepspeed", "--offload", "params", "--json", "--top", "5")
    assert code == 0, out
    assert out["candidates"] and all(c["zero"] == 3 and c["offload"] == "params" for c in out["candidates"])
    assert out["best"]["fits"]
