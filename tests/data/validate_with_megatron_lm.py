"""Check a `shardwise plan --emit megatron` script with Megatron-LM's own parse_args + validate_args.

    PYTHONPATH=/path/to/Megatron-LM python tests/data/validate_with_megatron_lm.py megatron.sh

Megatron-LM is not on PyPI, so the test suite checks the emitted arguments against its option table
(megatron_lm_arguments.json) and megatron-core's config classes; this script is the stronger check for a
machine with a Megatron-LM checkout (torch and Megatron-LM's Python dependencies; triton importable; no
GPU: the GPU architecture validate_args asks for is answered as Hopper). It runs the script with a
stand-in torchrun, then Megatron-LM's parser and validator on the arguments, and prints the parallel
layout Megatron-LM derives. Exit 0 when Megatron-LM accepts them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

typing.override = getattr(typing, "override", lambda f: f)  # Python < 3.12

# the stand-in torchrun records its arguments and the CUDA_DEVICE_MAX_CONNECTIONS the script exported
STUB = ("#!{python}\nimport json, os, sys\njson.dump([os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS'), sys.argv[1:]], "
        "open(os.environ['ARGV_OUT'], 'w'))\n")
SHOWN = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
         "data_parallel_size", "micro_batch_size", "global_batch_size", "sequence_parallel", "use_distributed_optimizer",
         "use_megatron_fsdp", "recompute_granularity", "recompute_method", "recompute_num_layers",
         "pipeline_model_parallel_layout", "num_experts", "expert_model_parallel_size", "expert_tensor_parallel_size")


def launched(script: Path) -> tuple[int, list[str], str | None]:
    """(world size, arguments of pretrain_gpt.py, its CUDA_DEVICE_MAX_CONNECTIONS) of the emitted script, run with a
    stand-in torchrun."""
    with tempfile.TemporaryDirectory() as tmp:
        stub, record = Path(tmp) / "torchrun", Path(tmp) / "argv.json"
        stub.write_text(STUB.format(python=sys.executable))
        stub.chmod(0o755)
        env = dict(os.environ, PATH=f"{tmp}{os.pathsep}{os.environ['PATH']}", ARGV_OUT=str(record))
        subprocess.run(["bash", str(script)], env=env, check=True)
        connections, argv = json.loads(record.read_text())
    at = next(i for i, a in enumerate(argv) if a.endswith("pretrain_gpt.py"))
    launcher = dict(zip(argv[:at:2], argv[1:at:2]))
    return int(launcher["--nnodes"]) * int(launcher["--nproc-per-node"]), argv[at + 1:], connections


def main() -> int:
    world, argv, connections = launched(Path(sys.argv[1]))
    import torch

    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    from megatron.training import arguments

    arguments.get_device_arch_version = lambda: 9
    os.environ.update(WORLD_SIZE=str(world), RANK="0", LOCAL_RANK="0")
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    if connections is not None:  # what the script exported, as validate_args reads it
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = connections
    sys.argv = ["pretrain_gpt.py", *argv, "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "32000",
                "--train-iters", "10", "--lr", "1e-4"]
    args = arguments.parse_args()
    arguments.validate_args(args)
    print(json.dumps({k: getattr(args, k, None) for k in SHOWN}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
