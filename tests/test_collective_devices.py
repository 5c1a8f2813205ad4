"""NCCL moves CUDA tensors only; gloo takes CPU ones too. A tensor made on the CPU and handed to a collective passes
every test on this machine and fails on GPUs (validate's timing reduction, train --json's memory reduction and the MoE
aux loss's token count did). Every tensor a module makes beside its collectives names its device, read from the
source with ast; a model's parameters (built on the CPU, then moved) and scalars a collective never sees are named."""

from __future__ import annotations

import ast
from pathlib import Path

import shardwise

ROOT = Path(shardwise.__file__).parent
COLLECTIVES = {"all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "all_to_all_single", "all_to_all", "send", "recv", "isend", "irecv", "reduce",
               "gather", "scatter", "batch_isend_irecv", "P2POp"}
MAKERS = {"tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange"}


def _undeviced(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    if not any(c.func.attr in COLLECTIVES and isinstance(c.func.value, ast.Name) and c.func.value.id == "dist"
               for c in calls):
        return []
    params = {id(a) for n in calls if n.func.attr == "Parameter" for a in n.args}  # built on the CPU, then moved
    return [f"{path.name}:{c.lineno}: {ast.unparse(c)}" for c in calls
            if c.func.attr in MAKERS and isinstance(c.func.value, ast.Name) and c.func.value.id == "torch"
            and id(c) not in params and not any(k.arg == "device" for k in c.keywords)]


def test_tensors_beside_collectives_name_their_device():
    found = [line for f in sorted(ROOT.rglob("*.py")) for line in _undeviced(f)]
    assert not found, "tensors made without a device in modules that run collectives:\n" + "\n".join(found)


def test_the_check_sees_a_cpu_tensor_handed_to_a_collective(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nimport torch.distributed as dist\n\ndef f():\n"
                   "    t = torch.tensor([1.0], dtype=torch.float64)\n    dist.all_reduce(t)\n")
    assert len(_undeviced(bad)) == 1
    bad.write_text(bad.read_text().replace("dtype=torch.float64", "dtype=torch.float64, device=d"))
    assert _undeviced(bad) == []

