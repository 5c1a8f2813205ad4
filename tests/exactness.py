"""The single-process reference and the comparison every exactness test makes with it.

Per step: the loss and the global gradient norm within rtol 1e-5 (Adam is blind to a gradient off by a
constant factor; the norm is not). After the run: every parameter, full shape, within atol 1e-5.
"""

from __future__ import annotations

import torch

from shardwise.train import train

RTOL = ATOL = 1e-5


def reference_runs(models, make_cfg) -> dict:
    """{model name: (per-step records, final parameters)} of single-process runs, no torch.distributed."""
    out = {}
    for name in models:
        result = train(make_cfg(name))
        out[name] = (result.records, {k: v.detach().clone() for k, v in result.runtime.models[0].named_parameters()})
    return out


def differences(key: str, records: list[dict], params: dict, reference, steps: int) -> list[str]:
    """What differs from the single-process run (empty when the layout reproduces it)."""
    ref_records, ref_params = reference
    found = []
    for field in ("loss", "grad_norm"):
        ours, ref = [r[field] for r in records], [r[field] for r in ref_records]
        if len(ours) != steps or not torch.allclose(torch.tensor(ours), torch.tensor(ref), rtol=RTOL, atol=0):
            found.append(f"{key}: {field} {ours} vs single process {ref}")
    if params.keys() != ref_params.keys():
        return found + [f"{key}: parameters {sorted(params.keys() ^ ref_params.keys())} missing or extra"]
    worst = max(((params[n] - p).abs().max().item(), n) for n, p in ref_params.items())
    if worst[0] > ATOL:
        found.append(f"{key}: parameter {worst[1]} differs by {worst[0]:.2e}")
    return found
