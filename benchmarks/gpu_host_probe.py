"""How a GPU host's time for gpt2 reads three ways in one process (run on a CUDA GPU, under a minute):

    python benchmarks/gpu_host_probe.py OUT.json

1. gpu_step_profile.host_floor: 0, 1, 4 and 12 layers at 16, 1,024 and 2,048 tokens, back to back in a plain loop,
   with the GPU's busy time;
2. the 1, 4 and 12-layer models at 16 and 1,024 tokens in calibrate's interleaved rounds (Timer.interleaved: every
   variant in each repeat, a new order each time), as `calibrate` times its host floor;
3. the same, each timed alone back to back (Timer.times).
The three differ by how far the host's speed moves within a minute (docs/accuracy.md, "The H200 again")."""

import json
import statistics
import sys

import torch

sys.path.insert(0, "benchmarks")
import gpu_step_profile as g  # noqa: E402

from shardwise import precision  # noqa: E402
from shardwise.calibrate.config import CalibrateConfig  # noqa: E402
from shardwise.calibrate.timer import Timer  # noqa: E402
from shardwise.model import Transformer  # noqa: E402
from shardwise.specs import load_model  # noqa: E402


def main(path: str) -> int:
    if not torch.cuda.is_available():
        print("gpu_host_probe: no CUDA GPU on this machine — skipped")
        return 0
    out = {"plain": g.host_floor(torch, tokens=(16, 1024, 2048), layers=(0, 1, 4, 12))}
    spec = load_model("gpt2")
    cfg = CalibrateConfig(model=spec, world=1, backend="nccl", repeats=10, warmup=2, seq_len=1024, dtype="bfloat16")
    t = Timer(cfg, 0, 1)
    fns = {}
    for n in (1, 4, 12):
        m = Transformer(spec, seed=0, layer_ids=range(n), device=t.device)
        for tok in (16, 1024):
            x = torch.randint(0, spec.vocab_size, (1, tok), device=t.device)

            def run(m=m, x=x):
                with precision.autocast("cuda"):
                    loss = m(x, x)
                loss.backward()
            fns[f"{n} layers {tok}"] = run
    out["interleaved"] = {k: statistics.median(v) for k, v in t.interleaved(fns, 10).items()}
    out["times"] = {k: statistics.median(t.times(f)) for k, f in fns.items()}
    for k in fns:
        print(f"{k:20s} interleaved {out['interleaved'][k] * 1e3:7.2f} ms  times {out['times'][k] * 1e3:7.2f} ms",
              flush=True)
    json.dump(out, open(path, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
