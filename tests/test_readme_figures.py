"""Every figure the README shows from the code is what the code computes now (benchmarks/readme_figures.py)."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "readme_figures.py"


def test_readme_figures_match_the_code():
    spec = importlib.util.spec_from_file_location("readme_figures", SCRIPT)
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    _, changed = figures.regenerate(figures.README.read_text(encoding="utf-8"))
    assert not changed, (f"README.md figures differ from the code: {', '.join(changed)} — run "
                         f"`python benchmarks/readme_figures.py` and commit README.md")
