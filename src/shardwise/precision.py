"""The runtime's mixed precision, in one place: FP32 weights, gradients and AdamW states, every forward under BF16
autocast on a GPU (torch AMP). A CPU runs FP32, unless a job asks for "bfloat16": then its forwards run under the CPU's
BF16 autocast, the GPU's dtype flow (which tensors are BF16, which stay FP32) on gloo ranks — what the tests check the
planner's GPU memory and the GPU code paths against where no GPU is."""

from __future__ import annotations

from contextlib import nullcontext

import torch

# TrainConfig.autocast / CalibrateConfig.dtype: "" is the device's own (BF16 on a GPU, FP32 on a CPU).
CHOICES = ("", "bfloat16", "float32")


def _bf16(device_type: str, dtype: str) -> bool:
    if dtype not in CHOICES:
        raise ValueError(f"precision {dtype!r}: one of {CHOICES}")
    return dtype == "bfloat16" or (not dtype and device_type == "cuda")


def autocast(device_type: str, dtype: str = ""):
    """The context every forward of the runtime runs in, on `device_type` ("cuda" or "cpu")."""
    return torch.autocast(device_type, dtype=torch.bfloat16) if _bf16(device_type, dtype) else nullcontext()


def compute_dtype(device_type: str, dtype: str = "") -> torch.dtype:
    """The dtype of the activations the runtime's linears produce: BF16 under autocast, else FP32."""
    return torch.bfloat16 if _bf16(device_type, dtype) else torch.float32
