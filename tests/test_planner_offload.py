"""CPU offload (`--offload optimizer|params`, planner/offload.py): what moves to the host leaves the GPU's breakdown, the
copies and the CPU step are priced at the cluster's host rates, the host's memory bounds what fits, and a stack, ZeRO
stage or cluster that cannot offload is refused in one line. Each expected number is worked out here from the cluster
file's rates and the model's parameter count, not read back from the planner."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

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
    cpu = 34 * shard * 8 / c.host_memory_bandwidth  # one fused Adam pass (34 B a parameter) over the node's shards
    # ZeRO-2 reduces every micro-batch (2 here) into host memory, FP32; the FP16 weights come back once
    out = estimate("dgx-a100-80gb", "deepspeed-2024", "--zero", "2", "--offload", "optimizer")
    assert out["num_microbatches"] == 2
    assert out["time_breakdown_s"]["offload"] == pytest.approx((2 * 4 + 2) * shard / c.host_link_bandwidth + cpu, rel=1e-3)
    assert out["time_breakdown_s"]["optimizer"] == 0  # the GPU does not step
    # ZeRO-3 copies each layer's gradient shard out after its reduce-scatter (in dp_comm): the weights back, the step
    three = estimate("dgx-a100-80gb", "deepspeed-2024", "--zero", "3", "--offload", "optimizer")
    assert three["time_breakdown_s"]["offload"] == pytest.approx(2 * shard / c.host_link_bandwidth + cpu, rel=1e-3)
    plain3 = estimate("dgx-a100-80gb", "deepspeed-2024", "--zero", "3")
    assert three["time_breakdown_s"]["dp_comm"] > plain3["time_breakdown_s"]["dp_comm"]
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


def test_a_mixture_of_experts_offloads_its_experts_states_too():
    """Mixtral on 16 H100 (ep 8, ZeRO-1): 31.5 GiB of the experts' optimizer states are most of the optimizer; they move
    to the host with the dense ones, and the host holds them (the experts unsharded across replicas here: edp 1)."""
    argv = ["estimate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100-80gb", "--gpus", 16, "--global-batch", 64,
            "--seq-len", 4096, "--tp", 2, "--pp", 1, "--ep", 8, "--micro-batch", 1, "--zero", 1, "--recompute", "full",
            "--framework", "megatron-core", "--json"]
    code, before = run(*argv)
    code2, after = run(*argv, "--offload", "optimizer")
    assert code == code2 == 0
    assert before["memory_breakdown_gib"]["optimizer"] > 30 and after["memory_breakdown_gib"]["optimizer"] == 0
    # 12 B a parameter of each GPU's states, 8 GPUs a node: the experts' unsharded shards dominate
    assert after["host_memory_gib_per_node"] == pytest.approx(8 * 12 * before["memory_breakdown_gib"]["optimizer"] / 12,
                                                              rel=0.02)


def test_the_cpu_step_is_the_nodes_whatever_the_gpu_count_within_it():
    """The host steps the GPUs' shards of one node at once: 1, 2, 4 or 8 GPUs of one node step the whole model, so the
    CPU's part of the step is the same; only the copies per GPU shrink with the shard."""
    c, params = load_cluster("dgx-a100-80gb"), load_model("llama2-7b").num_params()
    for gpus in (1, 2, 4, 8):
        code, out = run("estimate", "--model", "llama2-7b", "--cluster", "dgx-a100-80gb", "--gpus", gpus,
                        "--global-batch", 16, "--seq-len", 2048, "--tp", 1, "--pp", 1, "--micro-batch", 1, "--zero", 2,
                        "--recompute", "full", "--framework", "deepspeed", "--offload", "optimizer", "--json")
        assert code == 0, out
        shard, m = params / gpus, out["num_microbatches"]
        copies = ((m * 4 if gpus > 1 else 4) + 2) * shard / c.host_link_bandwidth
        assert out["time_breakdown_s"]["offload"] == pytest.approx(copies + 34 * params / c.host_memory_bandwidth,
                                                                   rel=1e-3), gpus


def test_gradients_a_gpu_keeps_are_not_also_counted_on_the_host():
    """One GPU (no ranks to shard over): its gradients stay in the GPU's breakdown, so the host holds only the
    optimizer states and master, 12 B a parameter."""
    code, out = run("estimate", "--model", "llama2-13b", "--cluster", "dgx-a100-80gb", "--gpus", 1, "--global-batch", 8,
                    "--seq-len", 2048, "--tp", 1, "--pp", 1, "--micro-batch", 1, "--recompute", "full",
                    "--framework", "deepspeed", "--offload", "optimizer", "--json")
    assert code == 0, out
    assert out["memory_breakdown_gib"]["gradients"] > 0
    assert out["host_memory_gib_per_node"] == pytest.approx(12 * load_model("llama2-13b").num_params() / 2**30, rel=1e-3)


def test_a_host_too_small_is_named_as_the_limit(tmp_path):
    small = tmp_path / "small-host.toml"
    text = (Path(__file__).parents[1] / "src/shardwise/presets/clusters/dgx-a100-80gb.toml").read_text()
    small.write_text(text.replace("host_memory_gib = 2048", "host_memory_gib = 50"))
    common = ["--model", "llama2-7b", "--cluster", small, "--gpus", 8, "--global-batch", 16, "--seq-len", 2048,
              "--framework", "deepspeed", "--offload", "optimizer"]
    code, err = run("plan", *common)
    assert code == 2 and "fits the GPUs but its offloaded states need" in err and "host_memory_gib" in err, err
    out, errs = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(errs):
        assert main([str(a) for a in ["estimate", *common, "--tp", 1, "--pp", 1, "--zero", 2]]) == 0
    assert "does not fit the host" in " ".join(out.getvalue().split())


def test_what_the_command_filled_in_names_the_stacks_own_default_stage():
    code, out = run("estimate", *JOB, "--cluster", "dgx-a100-80gb", "--framework", "deepspeed", "--offload", "optimizer")
    assert code == 0, out
    assert any(i.startswith(f"ZeRO-{out['zero']} (") and "from deepspeed's default ZeRO-0 up" in i
               for i in out["assumptions"]["implied"]), out["assumptions"]["implied"]


def test_a_stack_that_offloads_only_without_a_pipeline_says_so():
    code, err = run("estimate", *JOB, "--cluster", "dgx-a100-80gb", "--framework", "deepspeed", "--pp", 2, "--zero", 1,
                    "--offload", "optimizer")
    assert code == 2 and "cannot combine with a pipeline" in err and err.count("\n") == 1, err


def test_the_text_outputs_say_what_the_host_holds():
    common = ["--model", "llama3-8b", "--global-batch", 256, "--seq-len", 4096, "--cluster", "dgx-a100-80gb", "--gpus",
              16, "--framework", "deepspeed", "--offload", "optimizer"]
    for argv, words in ((["plan", *common, "--top", 1], "the offloaded optimizer on the host"),
                        (["estimate", *common, "--tp", 1, "--pp", 1], "host: "),
                        (["explain", *common], "Offloaded (--offload optimizer): ")):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            assert main([str(a) for a in argv]) == 0, err.getvalue()
        text = " ".join(out.getvalue().split())
        assert words in text and "GiB of CPU memory a node" in text, (argv[0], text[-600:])


def test_a_refusal_suggests_only_what_the_stack_runs():
    # one GPU: nothing to shard over (with TP or PP and no dp, torchtitan's own refusal, FP32 training, comes first)
    code, err = run("estimate", "--model", "llama3-8b", "--cluster", "dgx-a100-80gb", "--gpus", 1, "--global-batch", 256,
                    "--seq-len", 4096, "--framework", "torchtitan", "--offload", "params")
    assert code == 2 and "use a layout with dp > 1" in err and "--offload optimizer" not in err, err


def test_explain_weighs_the_host_rates_when_the_step_offloads():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        assert main(["explain", "--model", "llama3-8b", "--global-batch", "256", "--seq-len", "4096", "--cluster",
                     "aws-p4d", "--gpus", "16", "--framework", "deepspeed", "--offload", "optimizer", "--json"]) == 0
    sensitivity = next(p for p in json.loads(out.getvalue())["explanation"] if p.startswith("Sensitivity: "))
    assert "if the host's PCIe link and memory ran at half their rates" in sensitivity
