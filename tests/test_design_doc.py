"""docs/design.md's module table names every module of src/shardwise, and every module it names exists."""

import re
from pathlib import Path

import shardwise

ROOT = Path(shardwise.__file__).parent
DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"


def _table() -> list[tuple[list[str], str]]:
    """(the first cell's `names`, the whole row) of each row of the Modules table."""
    text = DESIGN.read_text(encoding="utf-8").split("## Modules", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    return [(re.findall(r"`([^`]+)`", row.split("|")[1]), row) for row in rows]


def _modules() -> list[str]:
    """Every module file, relative to the package (`planner/memory.py`); a package's __init__ counts as `planner/`."""
    mods = []
    for f in sorted(ROOT.rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        mods.append(rel[: -len("__init__.py")] if f.name == "__init__.py" else rel)
    return [m for m in mods if m]  # shardwise/__init__.py itself: the version


def test_every_module_is_in_the_design_table():
    table = _table()
    missing = []
    for mod in _modules():
        package, _, name = mod.rstrip("/").rpartition("/")
        named = any(mod in names for names, _ in table)
        in_its_package = package and any(f"{package}/" in names and re.search(rf"`{re.escape(name)}(\.py)?`", row)
                                         for names, row in table)
        if not (named or in_its_package):
            missing.append(mod)
    assert not missing, f"docs/design.md's Modules table does not name: {', '.join(missing)}"


def test_every_module_the_design_names_exists():
    gone = []
    for names, row in _table():
        packages = [n for n in names if n.endswith("/")]
        for n in names:
            if not (ROOT / n).exists():
                gone.append(n)
        for package in packages:  # files named in a package's row: `mapping.py` under `hf/`
            for f in re.findall(r"`(\w+\.py)`", row):
                if not any((ROOT / p / f).exists() for p in packages) and not (ROOT / f).exists():
                    gone.append(f"{package}{f}")
    assert not gone, f"docs/design.md names modules that do not exist: {', '.join(sorted(set(gone)))}"
