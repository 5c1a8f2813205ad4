"""Reading one key of a Hugging Face config.json: each check raises UsageError with one line that names the key,
what it must be and the fix. Shared by model_spec (Llama, GPT-2 and MoE keys) and hf_architectures (the others)."""

from __future__ import annotations

import json
import math

from shardwise.errors import UsageError

MAX_LAYERS = 10_000  # far beyond any model built; bounds the planner's work (pipeline splits, virtual stages)
MAX_DIM = 2**31  # any width, head count or vocabulary


def _shown(value) -> str:
    """A config value as the user wrote it in JSON (null, "4096", true)."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def require(cfg: dict, key: str, source: str, limit: int = MAX_DIM):
    if key not in cfg:
        raise UsageError(f"{source}: missing key '{key}' — add it to the config (see the Hugging Face config of the model)")
    value = cfg[key]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise UsageError(f"{source}: key '{key}' must be a positive integer, got {_shown(value)} — fix it in the config")
    if value > limit:
        raise UsageError(f"{source}: key '{key}' is {value:,}, above the {limit:,} shardwise accepts — check the config")
    return value


def require_any(cfg: dict, keys: tuple[str, ...], source: str, limit: int = MAX_DIM):
    """The first of `keys` the config has (an architecture's old and new spellings of one key)."""
    key = next((k for k in keys if cfg.get(k) is not None), None)
    if key is None:
        raise UsageError(f"{source}: missing key '{keys[0]}' (or {', '.join(repr(k) for k in keys[1:])}) — add it to "
                         "the config (see the Hugging Face config of the model)")
    return require(cfg, key, source, limit)


def optional(cfg: dict, key: str, default, source: str):
    """An optional key: absent or null gives `default`; else an integer (int default) or a number (float
    default) that is positive and finite."""
    value = cfg.get(key)
    if value is None:
        return default
    kind = type(default)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if not ok or (kind is int and value != int(value)) or value > MAX_DIM:
        what = "a positive integer" if kind is int else "a positive number"
        raise UsageError(f"{source}: key '{key}' must be {what}, got {value!r} — fix it or leave it out")
    return kind(value)


def flag(cfg: dict, key: str, source: str, default: bool = False) -> bool:
    value = cfg.get(key, default)
    if not isinstance(value, bool) and value is not None:
        raise UsageError(f"{source}: key '{key}' must be true or false, got {_shown(value)} — fix it or leave it out")
    return default if value is None else value


def dropout_on(cfg: dict, defaults: dict[str, float], source: str) -> bool:
    """Whether the config trains with dropout: any of the keys above 0 (an absent key counts as its Hugging Face
    default, `defaults[key]`)."""
    values = []
    for key, default in defaults.items():
        value = cfg.get(key, default)
        if value is None:
            value = 0.0
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise UsageError(f"{source}: key '{key}' must be a probability in [0, 1), got {value!r}")
        values.append(value)
    return any(v > 0 for v in values)


def dropout(cfg: dict, keys: tuple[str, ...], source: str, default: float) -> bool | None:
    """dropout_on, or None when the answer is the family's own (GPT-2 with dropout, Llama without): `default` is
    Hugging Face's for every key and says the family's answer."""
    on = dropout_on(cfg, dict.fromkeys(keys, default), source)
    return None if on == (default > 0) else on


def count(cfg: dict, key: str, source: str) -> int:
    """A non-negative integer key (absent or null: 0)."""
    value = cfg.get(key) or 0
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_DIM:
        raise UsageError(f"{source}: key '{key}' must be a non-negative integer, got {value!r}")
    return value


# Hugging Face activation names of a non-gated MLP -> ModelSpec.mlp (Nemotron's "relu2" is squared ReLU; BLOOM's
# "bloom_gelu" and the tanh approximations are GELU: the same two matrices, the same element-wise pass).
MLP_OF_ACT = {"relu2": "squared-relu", "relu": "relu", "relu6": "relu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu",
              "gelu_new": "gelu", "gelu_fast": "gelu", "gelu_python": "gelu", "gelu_accurate": "gelu",
              "gelu_10": "gelu", "quick_gelu": "gelu"}
# transformers' names of the SiLU that a Llama-style gated MLP (SwiGLU) runs
SWIGLU_ACTS = ("silu", "swish")


def mlp_of_act(cfg: dict, key: str, default: str, source: str, gated: tuple[str, ...] = ()) -> str:
    """ModelSpec.mlp of the MLP whose activation the config names in `key`: a non-gated one (MLP_OF_ACT), or '' (the
    family's gated MLP) for a name in `gated`; any other value is refused in one line."""
    act = cfg.get(key)
    act = default if act is None else act  # only absent or null means the default: "", false or 0 is refused
    if isinstance(act, str) and act in gated:
        return ""
    if not isinstance(act, str) or act not in MLP_OF_ACT:
        raise UsageError(f"{source}: {key} {act!r} is not an activation shardwise counts for this MLP — "
                         f"use one of {', '.join((*gated, *MLP_OF_ACT))}")
    return MLP_OF_ACT[act]
