"""Every figure the README shows from the code is what the code computes now (benchmarks/readme_figures.py)."""

import importlib.util
import re
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "readme_figures.py"


def test_readme_figures_match_the_code():
    spec = importlib.util.spec_from_file_location("readme_figures", SCRIPT)
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    _, changed = figures.regenerate(figures.README.read_text(encoding="utf-8"))
    assert not changed, (f"README.md figures differ from the code: {', '.join(changed)} — run "
                         f"`python benchmarks/readme_figures.py` and commit README.md")


def _readme_match(pattern: str, what: str) -> "re.Match":
    """The README's text (line breaks as spaces) matched against `pattern`; a failure naming `what` if absent."""
    text = " ".join((SCRIPT.parents[1] / "README.md").read_text(encoding="utf-8").split())
    found = re.search(pattern, text)
    assert found, f"README.md: no {what}"
    return found


def test_readme_lists_every_framework_profile():
    """The README's `--framework {...}` names exactly the profiles `plan` accepts."""
    from shardwise.planner.frameworks import FRAMEWORKS

    listed = _readme_match(r"`--framework \{([^}]*)\}`", "`--framework {...}` list")
    assert sorted(n.strip() for n in listed.group(1).split(",")) == sorted(FRAMEWORKS)


def test_readme_names_the_default_framework():
    """The README's `--framework {...}` list is followed by the default `plan` uses, and the one it falls back to."""
    from shardwise.planner.frameworks import DEFAULT_FRAMEWORK, FALLBACK_FRAMEWORK

    said = _readme_match(r"`--framework \{[^}]*\}` \(default ([\w-]+)([^)]*)", "default after the `--framework` list")
    assert said.group(1) == DEFAULT_FRAMEWORK and FALLBACK_FRAMEWORK in said.group(2)


def test_readme_lists_every_cluster_preset():
    """The README's `- Clusters:` line names exactly the shipped cluster presets."""
    from shardwise.specs import cluster_presets

    line = _readme_match(r"- Clusters: (.*?), a TOML file", "'- Clusters: ...' line")
    assert sorted(re.findall(r"`([\w.-]+)`", line.group(1))) == cluster_presets()
