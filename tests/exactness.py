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


def train_layouts(rank: int, world: int, jobs, out_dir: str) -> None:
    """Spawned-rank body: train every (key, cfg) in turn on its own mesh; the rank at dp = cp = tp = 0 of each
    pipeline stage saves the records and the stage's full parameters as out_dir/{key}-pp{stage}.pt."""
    import os

    import torch.distributed as dist

    from shardwise.parallel import build_mesh, coordinates, full_state_dict

    for key, cfg in jobs:
        lay = cfg.layout
        mesh = build_mesh(lay.pp, lay.dp, lay.tp, cp=lay.cp, backend="gloo", timeout_s=60)
        result = train(cfg, mesh)
        params = {}
        for chunk in result.runtime.chunks:
            params.update(full_state_dict(chunk))
        c = coordinates(mesh)
        every_rank = [None] * world  # each rank's measured memory (routed experts load ranks unevenly)
        if cfg.measure_memory:
            dist.all_gather_object(every_rank, result.memory)
        if c["dp"] == c["cp"] == c["tp"] == 0:
            torch.save({"records": result.records, "params": params, "memory": result.memory, "memory_all": every_rank},
                       os.path.join(out_dir, f"{key}-pp{c['pp']}.pt"))
        dist.barrier()


def collected(out_dir, key: str, pp: int) -> tuple[list[dict], dict]:
    """(records, every parameter) of a run saved by `train_layouts`, its pipeline stages put together."""
    parts = saved_runs(out_dir, key, pp)
    return parts[0]["records"], {k: v for part in parts for k, v in part["params"].items()}


def saved_runs(out_dir, key: str, pp: int) -> list[dict]:
    """What `train_layouts` saved for each pipeline stage: records, params, memory (with cfg.measure_memory)."""
    from pathlib import Path

    return [torch.load(Path(out_dir) / f"{key}-pp{r}.pt", weights_only=True) for r in range(pp)]
