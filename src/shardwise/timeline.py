"""Per-rank timelines of a pipeline step, simulated or measured: Chrome-trace JSON and pictures.

An event is what one rank did from `start` to `end` (seconds, clocks aligned across ranks):
kind "F" forward, "B" full backward, "I" backward for inputs, "W" backward for weights, or
"send" / "recv" (communication) and "idle" (waiting) for measured runs. Anything with those
attributes (or a dict with those keys) works, so the simulator and the executor share this module.

    write_chrome_trace(events, "trace.json")        # open in https://ui.perfetto.dev
    draw_timeline(events, "timeline.png", title)    # one row per rank (.png or .svg)
    draw_timelines([(title, events), ...], path)    # stacked panels on one time axis
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

COMPUTE = ("F", "B", "I", "W")
COMM = ("send", "recv")

# Colour-blind-safe (Okabe-Ito) fills; idle is the light background with hatching.
COLORS = {"F": "#56B4E9", "B": "#E69F00", "I": "#009E73", "W": "#CC79A7",
          "send": "#555555", "recv": "#999999", "idle": "#F2F2F2"}
LABELS = {"F": "forward", "B": "backward", "I": "backward (inputs)", "W": "backward (weights)",
          "send": "send", "recv": "recv", "idle": "idle"}


@dataclass(frozen=True)
class Event:
    rank: int
    kind: str
    microbatch: int
    chunk: int
    start: float
    end: float
    detail: str = ""  # a transfer's what and where ("activation mb3 to rank 1"): its name in a trace


def as_event(e) -> Event:
    if isinstance(e, Event):
        return e
    if isinstance(e, Mapping):
        return Event(int(e["rank"]), str(e["kind"]), int(e.get("microbatch", -1)), int(e.get("chunk", 0)),
                     float(e["start"]), float(e["end"]), str(e.get("detail", "")))
    return Event(int(e.rank), str(e.kind), int(e.microbatch), int(e.chunk), float(e.start), float(e.end),
                 str(getattr(e, "detail", "")))


def bubble_fraction(events: Iterable) -> float:
    """Share of rank-time not spent computing (F/B/I/W) between the first start and the last end."""
    evs = [as_event(e) for e in events]
    if not evs:
        return 0.0
    t0, t1 = min(e.start for e in evs), max(e.end for e in evs)
    ranks = {e.rank for e in evs}
    busy = sum(e.end - e.start for e in evs if e.kind in COMPUTE)
    span = (t1 - t0) * len(ranks)
    return 1.0 - busy / span if span > 0 else 0.0


def _name(e: Event) -> str:
    if e.kind in COMPUTE:
        return f"{e.kind}{e.microbatch}" + (f" c{e.chunk}" if e.chunk else "")
    if e.detail:  # what moved and where: a rank's two sends of one micro-batch (activation on, gradient back) differ
        return f"{e.kind} {e.detail}"
    return e.kind if e.microbatch < 0 else f"{e.kind} mb{e.microbatch}"


def chrome_trace(events: Iterable, names: Mapping[int, str] | None = None, marks: Iterable = ()) -> dict:
    """Chrome-trace dict: one process per rank, compute on thread 0, communication on thread 1 — and on threads 2, 3,
    ... where transfers overlap (a simulated send longer than the actions between them): complete ("X") events on
    one thread must nest (the Trace Event Format), so each overlapping one takes the first lane free at its start.
    Times in microseconds, rounded to the nanosecond (float noise would make touching events overlap).

    `names` overrides the process name of some ranks (default "rank N"). Rank N is pid N + 1: Perfetto handles pid 0
    as the kernel's idle task (google/perfetto#394: "Please start from pid = 1"). `marks`: (name, time) pairs drawn
    as global instant events across every track (a measured run's step boundaries)."""
    evs = [as_event(e) for e in events]
    t0 = min((e.start for e in evs), default=0.0)
    lanes, counts = _comm_lanes(evs)
    out = []
    for rank in sorted({e.rank for e in evs}):
        pid = rank + 1
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": (names or {}).get(rank, f"rank {rank}")}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": rank}})
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "compute"}})
        for lane in range(max(counts.get(rank, 0), 1)):
            label = "communication" if lane == 0 else f"communication {lane + 1}"
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 1 + lane, "args": {"name": label}})
    for i, e in enumerate(evs):
        start, end = round((e.start - t0) * 1e6, 3), round((e.end - t0) * 1e6, 3)
        out.append({"name": _name(e), "cat": e.kind, "ph": "X", "pid": e.rank + 1,
                    "tid": 1 + lanes[i] if e.kind in COMM else 0, "ts": start, "dur": round(end - start, 3),
                    "args": {"microbatch": e.microbatch, "chunk": e.chunk} | ({"detail": e.detail} if e.detail else {})})
    for name, at in marks:
        out.append({"name": name, "ph": "i", "s": "g", "pid": 1, "tid": 0, "ts": round((at - t0) * 1e6, 3)})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def _comm_lanes(evs: list) -> tuple[dict, dict]:
    """(index in evs -> lane of each communication event, rank -> its lanes): the first lane of its rank whose last
    event has ended by its start (greedy by start time: as few lanes as the most transfers in flight at once)."""
    lanes, ends = {}, {}
    for i in sorted((i for i, e in enumerate(evs) if e.kind in COMM), key=lambda i: (evs[i].start, evs[i].end)):
        e, free = evs[i], ends.setdefault(evs[i].rank, [])
        lane = next((k for k, end in enumerate(free) if end <= e.start + 1e-12), len(free))
        free[lane:lane + 1] = [e.end]
        lanes[i] = lane
    return lanes, {rank: len(free) for rank, free in ends.items()}


def write_chrome_trace(events: Iterable, path: str | Path, names: Mapping[int, str] | None = None,
                       marks: Iterable = ()) -> Path:
    path = Path(path)
    path.write_text(json.dumps(chrome_trace(events, names, marks)))
    return path


# --------------------------------------------------------------------------- pictures


def _shade(color: str, chunk: int, chunks: int) -> tuple[float, float, float]:
    """Later model chunks get lighter shades of the same colour (as in Megatron's figures)."""
    from matplotlib.colors import to_rgb

    mix = 0.5 * chunk / max(chunks - 1, 1)
    return tuple(c + (1 - c) * mix for c in to_rgb(color))


def _time_unit(span: float) -> tuple[str, float]:
    for name, scale in (("s", 1.0), ("ms", 1e3), ("µs", 1e6)):
        if span * scale >= 1:
            return name, scale
    return "µs", 1e6


def _draw_panel(ax, evs: list[Event], title: str, t0: float, scale: float, px_per_unit: float) -> set[str]:
    """One row per rank (rank 0 on top); returns the kinds drawn, for the legend."""
    ranks = sorted({e.rank for e in evs}) or [0]
    row = {r: i for i, r in enumerate(ranks)}
    chunks = max((e.chunk for e in evs), default=0) + 1
    t_end = max((e.end for e in evs), default=t0)
    kinds = {"idle"}

    bars: dict[tuple, list[tuple[float, float, float]]] = {}  # style -> (y, left, width): one barh call per style

    def bar(style: tuple, y: float, x: float, width: float) -> None:
        bars.setdefault(style, []).append((y, x, width))

    idle = ("idle", 0.8, COLORS["idle"], "#D0D0D0", 0, "////")
    for r in ranks:  # idle is the hatched background; everything else is drawn over it
        bar(idle, row[r], 0.0, (t_end - t0) * scale)
    for e in evs:
        x, width = (e.start - t0) * scale, (e.end - e.start) * scale
        if e.kind == "idle":  # measured waiting: already the background, drawn again so nothing hides it
            bar(idle, row[e.rank], x, width)
        elif e.kind in COMM:  # a thin strip at the bottom of the row, so it never hides compute
            bar(("comm", 0.2, COLORS[e.kind], "none", 0, None), row[e.rank] + 0.3, x, width)
        else:
            color = _shade(COLORS.get(e.kind, "#BBBBBB"), e.chunk, chunks) if e.kind in COMPUTE else "#BBBBBB"
            wide = width * px_per_unit >= 4  # white separators only where they do not swallow the box
            bar(("compute", 0.8, color, "white" if wide else "none", 0.6 if wide else 0, None), row[e.rank], x, width)
            label = str(e.microbatch) if e.kind in COMPUTE and e.microbatch >= 0 else ""
            if label and width * px_per_unit >= 7 * len(label) + 2:  # only where the number fits
                ax.text(x + width / 2, row[e.rank], label, ha="center", va="center", fontsize=7.5, color="black")
        kinds.add(e.kind)
    order = {"idle": 0, "compute": 1, "comm": 2}  # background first, strips last
    from matplotlib.collections import PolyCollection

    for style, items in sorted(bars.items(), key=lambda kv: order[kv[0][0]]):
        _, height, color, edge, lw, hatch = style  # one collection per style: thousands of boxes draw in a blink
        h = height / 2
        boxes = [((x, y - h), (x + w, y - h), (x + w, y + h), (x, y + h)) for y, x, w in items]
        ax.add_collection(PolyCollection(boxes, facecolors=[color], edgecolors=[edge], linewidths=lw, hatch=hatch))
    ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.set_ylim(len(ranks) - 0.5, -0.5)
    ax.set_title(f"{title} — bubble {100 * bubble_fraction(evs):.1f}%" if title else
                 f"bubble {100 * bubble_fraction(evs):.1f}%", loc="left", fontsize=10)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return kinds


def draw_timelines(panels: list[tuple[str, Iterable]], path: str | Path, suptitle: str | None = None) -> Path:
    """Stacked panels, one per (title, events), sharing one time axis; .png or .svg by the suffix."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    panels = [(title, [as_event(e) for e in evs]) for title, evs in panels]
    starts = [e.start for _, evs in panels for e in evs]
    t0 = min(starts, default=0.0)
    span = max((e.end for _, evs in panels for e in evs), default=1.0) - t0
    unit, scale = _time_unit(span)
    heights = [max(len({e.rank for e in evs}), 1) * 0.42 + 0.7 for _, evs in panels]
    width_in = 13.0
    fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False, figsize=(width_in, sum(heights) + 1.0),
                             gridspec_kw={"height_ratios": heights})
    px_per_unit = width_in * 0.8 * 100 / max(span * scale, 1e-12)  # about 80 % of the width is the plot, at dpi 100
    kinds: set[str] = set()
    for ax, (title, evs) in zip(axes[:, 0], panels):
        kinds |= _draw_panel(ax, evs, title, t0, scale, px_per_unit)
    axes[-1, 0].set_xlabel(f"time ({unit})")
    axes[-1, 0].set_xlim(0, span * scale)
    order = [k for k in (*COMPUTE, *COMM, "idle") if k in kinds]
    handles = [Patch(facecolor=COLORS[k], hatch="////" if k == "idle" else None, edgecolor="#D0D0D0" if k == "idle" else COLORS[k],
                     label=LABELS[k]) for k in order]
    if any(e.chunk > 0 for _, evs in panels for e in evs):
        handles.append(Patch(facecolor=_shade(COLORS["F"], 1, 2), label="lighter: later model chunk"))
    total = sum(heights) + 1.0
    top = 1.0 - 0.3 / total
    if suptitle:
        fig.suptitle(suptitle, y=top, va="top", fontsize=11)
        top -= 0.3 / total
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), frameon=False, fontsize=9,
               bbox_to_anchor=(0.5, top))
    fig.tight_layout(rect=(0, 0, 1, top - 0.2 / total))
    path = Path(path)
    fig.savefig(path, dpi=110 if path.suffix == ".png" else None)
    plt.close(fig)
    return path


def draw_timeline(events: Iterable, path: str | Path, title: str = "") -> Path:
    """One panel: one row per rank, compute coloured by kind, micro-batch numbers in the boxes."""
    return draw_timelines([(title, events)], path)
