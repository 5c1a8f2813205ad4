"""`shardwise demo`, the README's first command: plans the article's example, then calibrates, plans and
really trains the tiny model, reporting predicted vs measured step time."""

import json
import subprocess
import sys


def _demo(*flags):
    out = subprocess.run([sys.executable, "-m", "shardwise", "demo", *flags, "--json"], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_demo_end_to_end_on_two_processes():
    data = _demo("--world", "2", "--steps", "4")
    best = data["article"]["best"]
    assert best["dp"] * best["tp"] * best["pp"] == 64 and best["fits"]
    local = data["local"]
    assert local["layout"]["dp"] * local["layout"]["tp"] * local["layout"]["pp"] == 2
    assert local["predicted_step_time_s"] > 0 and local["measured_step_time_s"] > 0


def test_demo_bad_flags_exit_2():
    out = subprocess.run([sys.executable, "-m", "shardwise", "demo", "--steps", "1"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
