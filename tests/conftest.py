"""Settings for the whole test session."""

# transformers' progress bars (tqdm) start a monitor thread that outlives them. With a second Python thread alive,
# shardwise.forked.worker_count keeps work in one process (a fork would copy that thread mid-step), so every test
# after the first transformers load would take the one-process path of the search and of the published-run
# benchmarks instead of the forked one a user's `shardwise plan` takes. Bars still draw without the monitor.
try:
    import tqdm
except ImportError:  # no transformers, no bars
    pass
else:
    tqdm.tqdm.monitor_interval = 0

# Property tests (hypothesis) draw new examples on every run: a developer's runs keep exploring (that is how a loose
# bound was found, tests/test_simulate.py's ZB-H1 closed form), while CI (.ci/run sets HYPOTHESIS_PROFILE=ci) draws the
# same examples every time, so a landing is judged on the code, not on the draw.
import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

# The package's bytecode, written once for the session: where PYTHONDONTWRITEBYTECODE is set (as on some CI images),
# every `python -m shardwise` a test starts, and every fork server a launch starts, would otherwise compile the whole
# package again (0.2-0.5 s each); an installed package has its bytecode from pip. Already-current files are skipped.
import compileall
import pathlib

compileall.compile_dir(pathlib.Path(__file__).resolve().parents[1] / "src" / "shardwise", quiet=2)
