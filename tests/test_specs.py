"""Model and cluster specs: presets load, parameter counts equal the real models, bad input is one clear line."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from shardwise.errors import UsageError
from shardwise.specs import Layout, load_cluster, load_model, model_presets, validate_layout

REQUIRED_MODELS = ["gpt2", "gpt3-175b", "llama-65b", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b",
                   "llama3-70b", "llama3.1-405b"]

# Published totals (the model cards), as a second check beside transformers.
KNOWN = {"gpt2": 124_439_808, "llama2-7b": 6_738_415_616, "llama3-8b": 8_030_261_248,
         "llama3.1-405b": 405_853_388_800, "llama2-70b": 68_976_648_192, "llama-65b": 65_285_660_672}


def _hf_count(spec) -> int:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = spec.to_hf_config()
    if spec.family == "gpt2":
        config = transformers.GPT2Config(**{k: v for k, v in cfg.items() if k != "model_type"})
        cls = transformers.GPT2LMHeadModel
    else:
        config = transformers.LlamaConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
        cls = transformers.LlamaForCausalLM
    with torch.device("meta"):
        model = cls(config)
    return sum(p.numel() for p in model.parameters())  # parameters() de-duplicates tied weights


@pytest.mark.parametrize("name", REQUIRED_MODELS + ["tiny", "tiny-gpt2"])
def test_param_count_equals_transformers(name):
    spec = load_model(name)
    assert spec.num_params() == _hf_count(spec)
    if name in KNOWN:
        assert spec.num_params() == KNOWN[name]


def test_required_presets_present():
    assert set(REQUIRED_MODELS) <= set(model_presets())
    for c in ["dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100-80gb", "dgx-h200"]:
        assert load_cluster(c).gpus_per_node == 8


def test_hf_config_file_round_trip(tmp_path):
    spec = load_model("llama3-8b")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(spec.to_hf_config()))
    assert load_model(str(path)).num_params() == spec.num_params()


def test_nemotron_config_is_a_non_gated_llama_block(tmp_path):
    # Hugging Face's Nemotron (model_type nemotron, hidden_act relu2): Llama-style blocks, a two-matrix MLP, no dropout;
    # the planner counts it, the runtime names it as not trained.
    from shardwise.model import unsupported
    cfg = {"model_type": "nemotron", "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "hidden_act": "relu2",
           "attention_dropout": 0.0, "hidden_dropout": 0.0}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = load_model(str(path))
    assert spec.mlp == "squared-relu" and not spec.gated_mlp and not spec.trains_with_dropout
    assert spec.dense_ffn_params() == 2 * 64 * 256 and spec.norm_kind == "layernorm"  # LayerNorm1P has a bias
    assert "nemotron's blocks" in unsupported(spec)
    path.write_text(json.dumps(spec.to_hf_config()))
    assert load_model(str(path)) == spec
    gpt = load_model("gpt2")
    assert gpt.trains_with_dropout
    path.write_text(json.dumps(dict(gpt.to_hf_config(), resid_pdrop=0.0, attn_pdrop=0.0, embd_pdrop=0.0)))
    assert not load_model(str(path)).trains_with_dropout


@pytest.mark.parametrize("content, fragment", [
    ("{not json", "malformed JSON"),
    ('{"hidden_size": 64, "num_attention_heads": 4}', "missing key 'intermediate_size'"),
    ('{"n_embd": 64, "n_layer": 2, "n_head": 4}', "missing key 'vocab_size'"),
    ('[1, 2]', "expected a JSON object with model keys, got a list"),
    ('null', "got null"),
    ('{"hidden_size": ' + "9" * 5000 + '}', "malformed JSON"),  # past Python's int digit limit: ValueError
])
def test_malformed_config_names_the_problem(tmp_path, content, fragment):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(UsageError, match=fragment):
        load_model(str(path))


def test_unknown_presets_list_valid_ones():
    with pytest.raises(UsageError, match="valid presets: .*llama3-8b"):
        load_model("llama-9000")
    with pytest.raises(UsageError, match="valid presets: .*dgx-h100-80gb"):
        load_cluster("tpu-pod")


def test_malformed_cluster_toml(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[cluster]\ngpus_per_node = 8\n")
    # every missing key named at once, and the keys a file gives
    with pytest.raises(UsageError, match="missing 'gpu_memory_gib', 'peak_tflops', 'hbm_bandwidth_gbs', "
                                         "'intra_node_bandwidth_gbs', 'inter_node_bandwidth_gbs' in \\[cluster\\] .* gives "
                                         "gpus_per_node, gpu_memory_gib"):
        load_cluster(str(path))
    path.write_text("[cluster\n")
    with pytest.raises(UsageError, match="malformed TOML"):
        load_cluster(str(path))


@pytest.mark.parametrize("layout, fragment", [
    (Layout(dp=2, tp=3, pp=1), "does not divide the 32 attention heads"),
    (Layout(dp=3, tp=1, pp=1), "does not match 4 GPUs"),
    (Layout(dp=8, tp=1, pp=1, micro_batch=3), "not divisible by dp\\*micro_batch"),
    (Layout(dp=1, tp=1, pp=8, vpp=2, schedule="1f1b"), "needs --schedule interleaved-1f1b"),
])
def test_invalid_layouts(layout, fragment):
    with pytest.raises(UsageError, match=fragment):
        validate_layout(layout, load_model("llama3-8b"), global_batch=64,
                        num_gpus=4 if layout.world_size == 3 else layout.world_size)



def test_kv_heads_split_over_tp_or_are_copied_to_a_multiple_of_them():
    """llama3-8b has 8 KV heads: tp 16 gives each pair of ranks one, which only some stacks do (Framework.kv_refusal):
    not a layout error. A model with 3 KV heads cannot split them over tp 2, nor copy them evenly: a layout error."""
    from dataclasses import replace

    validate_layout(Layout(dp=1, tp=16, pp=1), load_model("llama3-8b"), global_batch=64, num_gpus=16)
    odd = replace(load_model("llama3-8b"), num_heads=24, num_kv_heads=3, head_dim=128, ffn_hidden=14400)
    validate_layout(Layout(dp=1, tp=6, pp=1), odd, global_batch=64, num_gpus=6)
    with pytest.raises(UsageError, match="does not divide the 3 KV heads"):
        validate_layout(Layout(dp=1, tp=2, pp=1), odd, global_batch=64, num_gpus=2)


def test_gpt2_config_with_untied_head(tmp_path):
    # Every Hugging Face config carries tie_word_embeddings (PretrainedConfig: default true); GPT2LMHeadModel ties its
    # lm_head to wte only when it is true (PreTrainedModel.tie_weights). Untied (Megatron's
    # --untie-embeddings-and-output-weights), GPT-2 small gains the head's own 50257 x 768 matrix:
    # 124,439,808 + 38,597,376 = 163,037,184 parameters.
    cfg = dict(load_model("gpt2").to_hf_config(), tie_word_embeddings=False)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = load_model(str(path))
    assert not spec.tie_embeddings
    assert spec.num_params() == 124_439_808 + 50257 * 768 == 163_037_184
    assert spec.num_params() == _hf_count(spec)
    path.write_text(json.dumps(spec.to_hf_config()))
    assert load_model(str(path)) == spec


def test_a_multi_query_gpt2_spec_writes_a_config_that_reads_back(tmp_path):
    """GPT-2's keys cannot say one K/V head; the written config.json says it as GPT-BigCode's (StarCoder's) do."""
    from dataclasses import replace

    spec = replace(load_model("gpt2"), num_kv_heads=1)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(spec.to_hf_config()))
    back = load_model(str(path))
    assert back.num_kv_heads == 1 and back.num_params() == spec.num_params() < load_model("gpt2").num_params()


def _read_as_gpt2config_reads(path, cfg: dict):
    """The spec load_model reads from `cfg` at `path`, checked against transformers' GPT2Config of the same dict."""
    transformers = pytest.importorskip("transformers")
    path.write_text(json.dumps(cfg))
    spec = load_model(str(path))
    hf = transformers.GPT2Config.from_dict({k: v for k, v in cfg.items() if k != "model_type"})
    assert (spec.hidden, spec.num_layers, spec.num_heads, spec.max_positions) == (hf.n_embd, hf.n_layer, hf.n_head,
                                                                                   hf.n_positions)
    return spec


def test_gpt2_config_reads_transformers_generic_key_names(tmp_path):
    # GPT2Config maps hidden_size / num_hidden_layers / num_attention_heads / max_position_embeddings onto n_embd /
    # n_layer / n_head / n_positions (its attribute_map), and a config naming no context gets its 1,024.
    generic = {"model_type": "gpt2", "hidden_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
               "vocab_size": 100}
    path = tmp_path / "config.json"
    spec = _read_as_gpt2config_reads(path, generic)
    assert spec.family == "gpt2" and spec.ffn_hidden == 4 * 96 and not spec.gated_mlp
    assert _hf_count(spec) == spec.num_params()
    path.write_text(json.dumps(dict(generic, max_position_embeddings=512)))
    assert load_model(str(path)).max_positions == 512


@pytest.mark.parametrize("act, gated", [(None, True), ("silu", True), ("swish", True), ("gelu", False),
                                        ("gelu_new", False), ("quick_gelu", False), ("relu", False), ("relu2", False)])
def test_a_config_without_model_type_takes_its_mlp_from_hidden_act(tmp_path, act, gated):
    # A hand-written config (no model_type, Llama's key names) that names a GELU or ReLU activation describes a
    # GPT-style two-matrix MLP; none, or SiLU, is Llama's SwiGLU. With a model_type, the architecture decides.
    cfg = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256,
           "vocab_size": 100} | ({"hidden_act": act} if act else {})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = load_model(str(path))
    assert spec.gated_mlp is gated
    assert spec.dense_ffn_params() == (3 if gated else 2) * 64 * 256
    path.write_text(json.dumps(spec.to_hf_config()))  # a two-matrix MLP: written back without a model_type it never had
    assert load_model(str(path)) == (replace(spec, model_type="llama") if gated else spec)
    path.write_text(json.dumps(dict(cfg, model_type="llama")))
    if act in ("relu", "relu2"):  # LlamaMLP gates with any activation: a ReLU gate has no name here, refused
        with pytest.raises(UsageError, match="counts only as SiLU"):
            load_model(str(path))
        return
    llama = load_model(str(path))
    assert llama.gated_mlp and llama.mlp == ("" if gated else "geglu")  # a GELU gate is GeGLU, not SwiGLU


@pytest.mark.parametrize("act", ["tanh", "GELU", 1, ["gelu"], {"name": "gelu"}, False, 0, [], {}, ""])
def test_an_activation_shardwise_cannot_count_is_one_line(tmp_path, act):
    cfg = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256,
           "vocab_size": 100, "hidden_act": act}
    path = tmp_path / "config.json"
    for extra in ({}, {"model_type": "nemotron"}):
        path.write_text(json.dumps(cfg | extra))
        with pytest.raises(UsageError, match="hidden_act .* is not an activation shardwise counts"):
            load_model(str(path))


@pytest.mark.parametrize("bad, said", [({"hidden_size": "96"}, "key 'hidden_size' must be a positive integer"),
                                       ({"num_hidden_layers": 0}, "key 'num_hidden_layers' must be a positive integer"),
                                       ({"hidden_size": None}, "missing key 'hidden_size' \\(or 'n_embd'\\)")])
def test_a_bad_gpt2_key_is_named_as_the_config_spells_it(tmp_path, bad, said):
    cfg = {"model_type": "gpt2", "hidden_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
           "vocab_size": 100} | bad
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match=said):
        load_model(str(path))


def test_a_gpt2_config_giving_both_spellings_reads_as_transformers_does(tmp_path):
    cfg = {"model_type": "gpt2", "vocab_size": 100, "n_embd": 96, "hidden_size": 128, "n_layer": 2,
           "num_hidden_layers": 3, "n_head": 4, "num_attention_heads": 8, "n_positions": 512,
           "max_position_embeddings": 256}
    assert _read_as_gpt2config_reads(tmp_path / "config.json", cfg).hidden == 128


DGX_KEYS = {"name": "mine", "gpus_per_node": 8, "gpu_memory_gib": 80, "hbm_bandwidth_gbs": 3350,
            "intra_node_bandwidth_gbs": 450, "inter_node_bandwidth_gbs": 50}


def _toml(tmp_path, **keys) -> str:
    path = tmp_path / "mine.toml"
    path.write_text("[cluster]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items()))
    return str(path)


def test_a_cluster_file_without_arch_takes_the_datasheet_gpu_its_peak_names(tmp_path):
    # A hand-written DGX H100 file with only the required keys: the H100's kernel-model keys come from the preset,
    # so it is timed as the preset is, and the cluster says what it took.
    from shardwise.planner import estimate
    from shardwise.planner.job import make_job

    preset = load_cluster("dgx-h100-80gb")
    mine = load_cluster(_toml(tmp_path, **DGX_KEYS, peak_tflops=989))
    assert (mine.arch, mine.sm_count, mine.mamf_tflops, mine.fp8_flops) == (preset.arch, preset.sm_count,
                                                                           preset.mamf_tflops, preset.fp8_flops)
    assert "H100 / H200 SXM" in mine.inferred and "dgx-h100-80gb" in mine.inferred
    layout = Layout(tp=4, pp=4, dp=32, micro_batch=1, sequence_parallel=True)
    times = [estimate(make_job(load_model("llama3-70b"), c, 512, 8192, "megatron-core"), layout).step_time
             for c in (preset, mine)]
    assert times[1] == pytest.approx(times[0], rel=1e-9)
    # What the file states wins, its arch included: naming the matching arch still takes the rest; a peak no
    # datasheet GPU has, or another arch, infers nothing; a file that leaves nothing out says nothing.
    assert load_cluster(_toml(tmp_path, **DGX_KEYS, peak_tflops=989, sm_count=114)).sm_count == 114
    named = load_cluster(_toml(tmp_path, **DGX_KEYS, peak_tflops=989, arch="hopper"))
    assert named.sm_count == preset.sm_count and "arch" not in named.inferred
    for keys in ({"peak_tflops": 700}, {"peak_tflops": 989, "arch": "ampere"}):
        spec = load_cluster(_toml(tmp_path, **DGX_KEYS, **keys))
        assert spec.inferred == "" and spec.sm_count == 0
    full = dict(peak_tflops=989, arch="hopper", sm_count=132, mamf_tflops=792.1, fp8_peak_tflops=1979)
    assert load_cluster(_toml(tmp_path, **DGX_KEYS, **full)).inferred == ""


def test_estimate_names_what_it_took_for_a_cluster_file_without_arch(tmp_path, capsys):
    from shardwise.cli import main

    path = _toml(tmp_path, **(DGX_KEYS | {"inter_node_bandwidth_gbs": 25}), peak_tflops=312)
    assert main(["estimate", "--model", "llama3-8b", "--cluster", path, "--gpus", "8", "--global-batch", "8",
                 "--seq-len", "2048", "--tp", "1", "--pp", "1", "--micro-batch", "1", "--json"]) == 0
    implied = json.loads(capsys.readouterr().out)["assumptions"]["implied"]
    assert any("A100 SXM" in note and "arch ampere" in note for note in implied)


def test_a_datasheet_cluster_file_says_its_latencies_price_only_the_all_to_all(tmp_path, capsys):
    # NCCL's own latencies price a datasheet cluster's collectives (comm.nccl_time): a file that changes
    # inter_node_latency_us sees the dense step unchanged, so the command says where the key does act.
    from shardwise.cli import main

    keys = dict(DGX_KEYS, peak_tflops=989, arch="hopper", sm_count=132, mamf_tflops=792.1, fp8_peak_tflops=1979)
    argv = ["estimate", "--model", "llama3-8b", "--gpus", "16", "--global-batch", "16", "--seq-len", "2048",
            "--tp", "1", "--pp", "1", "--micro-batch", "1", "--json", "--cluster"]
    for latency, said in ((10, False), (1000, True)):
        assert main([*argv, _toml(tmp_path, **keys, inter_node_latency_us=latency)]) == 0
        out = json.loads(capsys.readouterr().out)
        notes = out["assumptions"].get("implied", [])
        assert any("inter_node_latency_us prices only the experts' all-to-all" in n for n in notes) == said, notes
        assert "net_step_extra_us" in " ".join(notes) or not said
    assert load_cluster(_toml(tmp_path, **keys, intra_node_latency_us=5, inter_node_latency_us=10)).inferred == ""


def test_a_hub_id_whose_config_a_preset_is_reads_the_preset_and_another_says_how_to_get_it():
    assert load_model("meta-llama/Llama-2-70b-hf") == load_model("llama2-70b")
    assert load_model("Mistralai/Mixtral-8x7B-v0.1").num_params() == load_model("mixtral-8x7b").num_params()
    with pytest.raises(UsageError, match="reads no network — download its config .*hf download "
                                         "tiiuae/falcon-180B config.json"):
        load_model("tiiuae/falcon-180B")
    # a file the user meant to give is not taken for a hub id (a .json path is answered before any hub id is tried)
    for missing in ("models/my.json", "models/my.safetensors", "models/my.toml"):
        with pytest.raises(UsageError, match="not found") as refused:
            load_model(missing)
        assert "hf download" not in str(refused.value)
    # Meta's original-format repo of a preset's model has no config.json to download: the preset is named instead
    with pytest.raises(UsageError, match="no config.json .* pass --model llama2-7b") as refused:
        load_model("meta-llama/Llama-2-7b")
    assert "hf download" not in str(refused.value)


@pytest.mark.parametrize("peak, dense", [(1979, 989), (624, 312)])
def test_a_sparse_datasheet_peak_is_refused_with_the_dense_one(tmp_path, peak, dense):
    with pytest.raises(UsageError, match=f"peak_tflops {peak} is the .* with 2:4 sparsity.* peak_tflops = {dense}"):
        load_cluster(_toml(tmp_path, **DGX_KEYS, peak_tflops=peak))
    assert load_cluster(_toml(tmp_path, **DGX_KEYS, peak_tflops=2250)).peak_flops == 2250e12  # B200's dense BF16


@pytest.mark.parametrize("peak, network", [(989, 400), (989, 3200), (312, 200), (312, 50)])
def test_a_network_faster_than_the_gpus_pcie_link_is_refused_as_a_unit_slip(tmp_path, peak, network):
    # 400 (Gb/s of one NIC), 3,200 (Gb/s of a node), 200 / 50 GB/s per A100: none reaches an A100 (PCIe Gen4 x16,
    # 31.5 GB/s) or an H100 (Gen5 x16, 63) through its NIC
    with pytest.raises(UsageError, match=f"inter_node_bandwidth_gbs {network} is more than the .* PCIe link"):
        load_cluster(_toml(tmp_path, **(DGX_KEYS | {"inter_node_bandwidth_gbs": network}), peak_tflops=peak))
    assert load_cluster(_toml(tmp_path, **(DGX_KEYS | {"inter_node_bandwidth_gbs": network}),
                              peak_tflops=2250)).inter_node_bandwidth == network * 1e9  # no PCIe fact for this GPU


def test_a_one_machine_file_may_repeat_nvlink_as_its_network(tmp_path):
    # calibrate's convention for one box: the network keys repeat NVLink's
    keys = {"intra_node_bandwidth_gbs": 300, "inter_node_bandwidth_gbs": 300}
    cluster = load_cluster(_toml(tmp_path, **(DGX_KEYS | keys), peak_tflops=312))
    assert cluster.arch == "ampere" and cluster.inter_node_bandwidth == 300e9
    # a num_gpus within a node exempts nothing: --gpus may still span nodes at the rate the file gives
    with pytest.raises(UsageError, match="inter_node_bandwidth_gbs 100 is more than the 31.5 GB/s PCIe link"):
        load_cluster(_toml(tmp_path, **(DGX_KEYS | {"num_gpus": 8, "inter_node_bandwidth_gbs": 100}), peak_tflops=312))


@pytest.mark.parametrize("peak, example", [(312, "one 200 Gb/s NIC a GPU: 25"), (989, "one 400 Gb/s NIC a GPU: 50")])
def test_the_network_refusal_suggests_a_rate_that_gpu_takes(tmp_path, peak, example):
    with pytest.raises(UsageError, match=example) as refused:
        load_cluster(_toml(tmp_path, **(DGX_KEYS | {"inter_node_bandwidth_gbs": 400}), peak_tflops=peak))
    suggested = float(str(refused.value).split(example.split(":")[0] + ": ")[1].split(",")[0])
    load_cluster(_toml(tmp_path, **(DGX_KEYS | {"inter_node_bandwidth_gbs": suggested}), peak_tflops=peak))


def test_a_file_named_as_a_preset_in_the_working_directory_changes_no_cluster(tmp_path, monkeypatch):
    # the datasheet presets are read from the package, not from whatever the working directory holds under their names
    from shardwise import specs

    h100, a100 = load_cluster("dgx-h100-80gb"), load_cluster("dgx-a100-80gb")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dgx-h100-80gb").mkdir()
    (tmp_path / "dgx-a100-80gb").write_text("[cluster]\npeak_tflops = 1000\n")
    specs._datasheet_tables.cache_clear()
    try:
        assert load_cluster(_toml(tmp_path, **DGX_KEYS, peak_tflops=989)).sm_count == h100.sm_count
        mine = _toml(tmp_path, **(DGX_KEYS | {"inter_node_bandwidth_gbs": 25}), peak_tflops=312)
        assert load_cluster(mine).mamf_tflops == a100.mamf_tflops
        assert load_cluster("dgx-h100-80gb") == h100  # --cluster naming the preset: a folder of that name is no cluster
    finally:
        specs._datasheet_tables.cache_clear()


def test_gpu_memory_in_mib_is_refused(tmp_path):
    # nvidia-smi's 81,559 MiB of an H100 80GB, typed as GiB, would fit a 405B model on 8 GPUs
    with pytest.raises(UsageError, match="gpu_memory_gib 81559 is more than any GPU holds .* = 79.6 GiB"):
        load_cluster(_toml(tmp_path, **(DGX_KEYS | {"gpu_memory_gib": 81559}), peak_tflops=989))
    assert load_cluster(_toml(tmp_path, **(DGX_KEYS | {"gpu_memory_gib": 288}), peak_tflops=2250)).gpu_memory_gib == 288
    # a calibrated file's figure is measured (on CPU, the host's memory over the ranks): never refused as MiB
    path = tmp_path / "measured.toml"
    path.write_text(Path(_toml(tmp_path, **(DGX_KEYS | {"gpu_memory_gib": 1536}), peak_tflops=2250)).read_text()
                    + "[measured]\nmatmul_tflops = 1.0\n")
    assert load_cluster(str(path)).gpu_memory_gib == 1536


def test_hbm_in_tb_per_s_is_refused_on_a_datasheet_gpu(tmp_path):
    with pytest.raises(UsageError, match="hbm_bandwidth_gbs 3.35 is an H100 .* in TB/s; the key is GB/s"):
        load_cluster(_toml(tmp_path, **(DGX_KEYS | {"hbm_bandwidth_gbs": 3.35}), peak_tflops=989))


@pytest.mark.parametrize("peak, both, one", [(989, 900, 450), (312, 600, 300)])
def test_nvlink_in_both_directions_is_refused_on_the_gpu_it_is(tmp_path, peak, both, one):
    with pytest.raises(UsageError, match=f"intra_node_bandwidth_gbs {both} is the .*both directions.* = {one}"):
        load_cluster(_toml(tmp_path, **(DGX_KEYS | {"intra_node_bandwidth_gbs": both}), peak_tflops=peak))
    # the same rate on a GPU whose one direction it is (B200's NVLink 5: 1,800 GB/s both ways) is read as given
    keys = DGX_KEYS | {"intra_node_bandwidth_gbs": 900}
    assert load_cluster(_toml(tmp_path, **keys, peak_tflops=2250)).intra_node_bandwidth == 900e9


def test_a_llama_config_whose_heads_do_not_divide_its_hidden_size_is_one_line(tmp_path):
    path = tmp_path / "config.json"
    keys = {"model_type": "llama", "intermediate_size": 512, "num_hidden_layers": 2, "vocab_size": 320}
    path.write_text(json.dumps(keys | {"hidden_size": 255, "num_attention_heads": 2}))
    with pytest.raises(UsageError, match="hidden size 255 .* not divisible by the 2 heads"):
        load_model(str(path))
    path.write_text(json.dumps(keys | {"hidden_size": 3072, "num_attention_heads": 16, "head_dim": 256}))
    assert load_model(str(path)).head_dim == 256  # Gemma's shape: head_dim given, hidden not heads x head_dim


def test_the_runtime_refuses_an_odd_rotary_head_in_one_line(tmp_path, capsys):
    # train built such a model and crashed in apply_rope; the planner prices it (a GPT-J rotates only rotary_dim)
    from shardwise.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama", "intermediate_size": 512, "num_hidden_layers": 2,
                                "vocab_size": 320, "hidden_size": 254, "num_attention_heads": 2}))
    assert load_model(str(path)).head_dim == 127
    assert main(["train", "--model", str(path), "--steps", "1", "--global-batch", "2", "--seq-len", "32"]) == 2
    err = capsys.readouterr().err
    assert "head dimension 127 is odd" in err and err.count("\n") == 1


def test_a_config_json_named_without_its_folder_takes_the_folders_name(tmp_path, monkeypatch):
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(load_model("llama3-8b").to_hf_config()))
    monkeypatch.chdir(folder)
    assert load_model("config.json").name == load_model("./config.json").name == "my-llama"
    # a Hugging Face cache: snapshots/<revision>/config.json links into blobs/, and the revision names it
    blob = tmp_path / "blobs" / "0123abcd"
    blob.parent.mkdir()
    blob.write_text((folder / "config.json").read_text())
    snapshot = tmp_path / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(blob)
    assert load_model(str(snapshot / "config.json")).name == "abc123"


@pytest.mark.parametrize("text, said", [
    # a sparse or impossible FP8 peak: an MFU of 93 % planned where the preset gives 69 %
    ("[cluster]\n{keys}fp8_peak_tflops = 3958\n", "fp8_peak_tflops 3958 is more than twice peak_tflops 989: the FP8 "
                                                   "peak with 2:4 sparsity"),
    ("[cluster]\n{keys}fp8_peak_tflops = 500\n", "fp8_peak_tflops 500 is below peak_tflops 989"),
    # a key above the [cluster] header, a table nobody reads: dropped before, the numbers the preset's
    ("power_limit_w = 500\n[cluster]\n{keys}", "'power_limit_w' is outside [cluster]"),
    ("[cluster]\n{keys}[measure]\nmatmul_tflops = 700\n", "'measure' is outside [cluster]"),
    ("[clusterx]\n{keys}", "[clusterx] is not a table a cluster file has — name it [cluster]"),  # a misspelt header
    # any [measured] table made the file a calibrated one and switched its unit checks off
    ("[cluster]\n{keys}[measured]\nfoo = 3\n", "[measured] has 'foo', which `shardwise calibrate` never writes"),
    ("[cluster]\n{keys}[measured]\nbackend = \"nccl\"\n", "[measured] has only labels, no measurement"),
])
def test_a_cluster_file_says_what_it_would_otherwise_lose_or_misread(tmp_path, text, said):
    keys = "".join(f"{k} = {json.dumps(v)}\n" for k, v in (DGX_KEYS | {"peak_tflops": 989, "arch": "hopper"}).items())
    path = tmp_path / "mine.toml"
    path.write_text(text.format(keys=keys))
    with pytest.raises(UsageError) as refused:
        load_cluster(str(path))
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_a_cluster_file_saved_with_a_byte_order_mark_reads_and_a_count_out_of_range_says_count(tmp_path):
    # Windows editors save UTF-8 with a BOM, which tomllib calls an invalid statement at line 1; a count out of range
    # was told to check its unit (GiB, TFLOP/s, GB/s)
    keys = DGX_KEYS | {"peak_tflops": 989, "arch": "hopper"}
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + ("[cluster]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())).encode())
    assert load_cluster(str(path)).peak_flops == load_cluster("dgx-h100-80gb").peak_flops
    with pytest.raises(UsageError, match="key 'gpus_per_node' is 100000000, outside .* — check the count$"):
        load_cluster(_toml(tmp_path, **(keys | {"gpus_per_node": 100000000})))
