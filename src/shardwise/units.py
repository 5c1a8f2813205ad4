"""Numbers for people: a duration in the unit that fits it (s, ms, µs), so a 0.4 ms step never reads "0.00 s";
memory in GiB (GIB bytes each); a count with its noun in the plural it takes."""

from __future__ import annotations

GIB = 2**30


def seconds(t: float) -> str:
    """2 decimals in seconds from 1 s up (the planner's steps of real jobs); 3 significant digits in ms or µs below."""
    if t != t or t in (float("inf"), float("-inf")):
        return f"{t} s"
    size = abs(t)
    if size == 0:
        return "0 s"
    if size >= 1:
        return f"{t:,.2f} s"
    if size >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    return f"{t * 1e6:.3g} µs"


def params(n: float) -> str:
    """A parameter count in billions from 0.1 B up, else in millions: a tiny model never reads "0.0 B"."""
    return f"{n / 1e9:.1f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def gib(b: float) -> str:
    """Bytes in GiB from 0.1 GiB up, else in MiB: a tiny model's states never read "0.0 GiB"."""
    return f"{b / GIB:.1f} GiB" if b >= 0.1 * GIB else f"{b / 2**20:.1f} MiB"


def count(n: int, noun: str) -> str:
    """'1 tensor', '1,024 tensors', '2 batches': thousands separated, the plural by the noun's ending."""
    plural = "es" if noun.endswith(("ch", "sh", "s", "x")) else "s"
    return f"{n:,} {noun}{'' if n == 1 else plural}"


def need_of(need: float, have: float) -> tuple[str, str]:
    """A need beside a capacity in GiB (bytes in), 1 decimal, or as many more (up to 3) as it takes for a need above
    the capacity not to read as equal to it ("63.2 of 63.2")."""
    for digits in (1, 2, 3):
        a, b = f"{need / GIB:.{digits}f}", f"{have / GIB:.{digits}f}"
        if (a != b) == (need != have) or digits == 3:
            return a, b
