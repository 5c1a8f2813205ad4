"""The import graph of src/shardwise has no cycle, counting imports inside functions too.

Built from the source with ast (nothing is imported): an edge a -> b for every `import b` or
`from b import x` in module a, at module level or inside a function; `from package import module`
points at the module. A lazy import inside a function still ties the two modules together, so it counts.
"""

from __future__ import annotations

import ast
import functools
import graphlib
from pathlib import Path

import shardwise

ROOT = Path(shardwise.__file__).parent


def _modules() -> dict[str, Path]:
    mods = {}
    for f in ROOT.rglob("*.py"):
        parts = f.relative_to(ROOT.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return mods


@functools.cache
def import_graph() -> dict[str, set[str]]:
    mods = _modules()

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, f in mods.items():
        package = name if f.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                targets |= {known(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package, level - 1 packages up
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets |= {known(f"{base}.{a.name}") if f"{base}.{a.name}" in mods else known(base)
                            for a in node.names}
        graph[name] = {t for t in targets if t and t != name}
    return graph


def test_the_import_graph_sees_lazy_imports():
    graph = import_graph()
    assert "shardwise.planner.frameworks" in graph["shardwise.planner.memory"]  # module level
    assert "shardwise.launch" in graph["shardwise.calibrate"]  # inside a function


def test_no_import_cycles():
    try:
        tuple(graphlib.TopologicalSorter(import_graph()).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None


def test_checkpoints_and_the_training_loop_do_not_import_each_other():
    graph = import_graph()
    checkpoint = [m for m in graph if m == "shardwise.checkpoint" or m.startswith("shardwise.checkpoint.")]
    assert checkpoint and not any("shardwise.train" in graph[m] for m in checkpoint)


def test_training_loads_no_validate_package():
    # train's memory counters live in validate/memory.py; imported at train's module level they pulled in the whole
    # validate package (its sweep, its plot) into every training run, a package whose measure.py imports train back
    import subprocess
    import sys

    code = "import sys, shardwise.train; print(sorted(m for m in sys.modules if m.startswith('shardwise.validate')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
