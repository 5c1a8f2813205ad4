"""A cluster's network from its own nccl-tests logs: read them, fit the two numbers the NCCL model lacks, score it.

`shardwise calibrate --nccl-tests LOG ... --cluster BASE` reads the logs NVIDIA's nccl-tests print
(all_reduce_perf, all_gather_perf, reduce_scatter_perf, broadcast_perf, sendrecv_perf) and writes BASE's cluster
file with its network fitted to them, so that `plan` / `estimate` time every collective, at every group size and
placement, with the NCCL tuner model of planner/comm.py on this cluster's measured network instead of a datasheet's:

  logs on one node    intra_node_bandwidth_gbs (NVLink as the rings reach it);
  logs across nodes   inter_node_bandwidth_gbs (per GPU, the node's NICs over its GPUs) and net_step_extra_us,
                      the time each network crossing of a chunk takes beyond the tuner's own hop latency
                      (congestion, adaptive routing, rail misalignment: what the datasheet does not say).

The fit minimises a soft-L1 loss of the log ratio of the model's time to each logged time (the faster of
out-of-place and in-place), over every size of 64 KiB and up of every log of that kind of placement; the report gives
each log's error before (the base cluster's datasheet numbers) and after. A log keeps its own rank count, ranks per
node and kind, so a fit on one node count can be checked on another (tests/test_nccl_tests.py and
benchmarks/nccl_fit.py do, on published logs). Logs faster than any ring (NVLink SHARP, a two-node tree) are
reported, never fitted.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from shardwise.errors import UsageError
from shardwise.specs import ClusterSpec

KIND_BY_TEST = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather",
                "reduce_scatter_perf": "reduce_scatter", "broadcast_perf": "broadcast", "sendrecv_perf": "send_recv"}
# How a file name may spell each kind (all_gather_perf.log, allgather-16n.txt, ag_2x8.txt is not enough).
_NAME_PATTERNS = {"all_reduce": r"all_?reduce", "all_gather": r"all_?gather", "reduce_scatter": r"reduce_?scatter",
                  "broadcast": r"broadcast|bcast", "send_recv": r"send_?recv"}
# `#  Rank  0 Group  0 Pid  123 on HOST device  0 [0x1b] GPU` (2022 on); before, no Group; in 2017, no Pid either.
_RANK_LINE = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?(?:Pid\s+\d+\s+)?on\s+(\S+)\s+device\s+\d+"
                        r"\s+\[[^\]]*\]\s*(.*)$")
# What launchers put before every line: mpirun --tag-output's `[1,0]<stdout>:`, srun --label's ` 0: `, Intel MPI's `[0] `.
_LAUNCHER_PREFIX = re.compile(r"^(\[\d+,\d+\]<std\w+>:|\s*\d+:\s|\[\d+\]\s)")
_TEST_LINE = re.compile(r"^#?\s*Collective test starting:\s*(\w+)")
# Lines that open a test's output: a log holding several tests is refused, not merged.
_SECTION_START = re.compile(r"^#?\s*(Collective test starting:|nThread\s|Using devices)")
# Sizes below this carry the launch and the protocol's base latency, not the network: reported, not fitted.
MIN_FIT_BYTES = 1 << 16
MAX_BYTES = 1 << 50
MAX_EXTRA_US = 1000.0  # the extra latency per crossing the fit may reach


@dataclass(frozen=True)
class NcclLog:
    """One nccl-tests run: what ran where, and (bytes, seconds) per size."""

    source: str
    kind: str
    ranks: int
    nodes: int
    gpu: str
    points: tuple[tuple[float, float], ...]

    @property
    def per_node(self) -> int:
        return self.ranks // self.nodes


def parse_arg(arg: str) -> tuple[str, str | None, tuple[int, int] | None]:
    """`[KIND[@NODESxGPUS]=]PATH` -> (path, kind or None, (nodes, gpus per node) or None)."""
    head, sep, path = arg.partition("=")
    if not sep or "/" in head or "." in head:
        return arg, None, None
    kind, _, shape = head.partition("@")
    if kind not in KIND_BY_TEST.values():
        raise UsageError(f"--nccl-tests {arg}: unknown collective '{kind}' — use one of "
                         f"{', '.join(KIND_BY_TEST.values())} before '=', or give just the log's path")
    if not shape:
        return path, kind, None
    m = re.fullmatch(r"(\d+)x(\d+)", shape)
    if not m or int(m[1]) < 1 or int(m[2]) < 1:
        raise UsageError(f"--nccl-tests {arg}: '{shape}' is not NODESxGPUS (e.g. {kind}@4x8=log.txt)")
    return path, kind, (int(m[1]), int(m[2]))


def read_log(arg: str) -> NcclLog:
    path, kind, shape = parse_arg(arg)
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        raise UsageError(f"--nccl-tests {path}: cannot read it ({exc.strerror}) — check the path") from None
    return parse(text, path, kind, shape)


@dataclass
class _Section:
    test: str | None = None
    hosts: dict = field(default_factory=dict)  # rank -> host
    groups: set = field(default_factory=set)
    gpus: set = field(default_factory=set)
    header: list = field(default_factory=list)  # the table's column names, `#` stripped
    unit: float = 0.0  # seconds per printed time unit, from the header's `(us)` / `(ms)` line; 0: not printed
    rows: list = field(default_factory=list)  # each table row's tokens

    @property
    def points(self) -> list[tuple[float, float]]:
        return _points(self)


def _sections(text: str) -> list[_Section]:
    """The log's tests, in order: a header line after a test's rank lines or rows opens the next (a run that died
    after its header, then its retry, are two tests, not one with both's ranks)."""
    sections = [_Section()]
    for line in text.splitlines():
        line = _LAUNCHER_PREFIX.sub("", line).strip()
        if _SECTION_START.match(line) and (sections[-1].rows or sections[-1].hosts):
            sections.append(_Section())
        sec = sections[-1]
        if m := _RANK_LINE.match(line):
            sec.hosts[int(m[1])] = m[3]
            sec.groups.add(int(m[2] or 0))
            sec.gpus.add(m[4].strip())
        elif m := _TEST_LINE.match(line):  # a build's suffix aside (all_reduce_perf_mpi, ..._nccl)
            sec.test = next((name for name in KIND_BY_TEST if m[1].startswith(name)), m[1])
        elif line.startswith("#"):
            names = line.lstrip("#").split()
            if "time" in names and "algbw" in names:
                sec.header = names
            elif "(us)" in names or "(ms)" in names:
                sec.unit = 1e-6 if "(us)" in names else 1e-3
        elif len(tok := line.split()) >= 6 and tok[0].isdigit() and tok[1].isdigit() and 0 < int(tok[0]) <= MAX_BYTES:
            sec.rows.append(tok)
    return sections


def parse(text: str, source: str, kind: str | None = None, shape: tuple[int, int] | None = None) -> NcclLog:
    """One log's kind, ranks, nodes and timings, or one UsageError line saying what it lacks."""
    sections = _sections(text)
    found = [s for s in sections if s.rows]
    if len(found) > 1:
        tests = ", ".join(s.test or "?" for s in found)
        raise UsageError(f"--nccl-tests {source}: holds {len(found)} tests ({tests}) — give each its own file")
    sec = found[0] if found else sections[-1]
    points = sec.points
    fit = [b for b, _ in points if b >= MIN_FIT_BYTES]
    if len(fit) < 2:
        raise UsageError(f"--nccl-tests {source}: {len(fit)} sizes of {MIN_FIT_BYTES // 1024} KiB or more with a "
                         f"time its table gives (size / time = algbw, #wrong 0) — run the test over a range of sizes "
                         f"(e.g. -b 8 -e 8G -f 2) without -C, and keep its table as printed")
    sizes = [b for b, _ in points]
    if len(set(sizes)) < len(sizes):
        raise UsageError(f"--nccl-tests {source}: repeats sizes (-d all, -o all or several runs in one table) — "
                         f"give one data type and operation per log")
    if sec.test and sec.test not in KIND_BY_TEST:
        raise UsageError(f"--nccl-tests {source}: {sec.test} is not a collective the planner times — give "
                         f"{', '.join(KIND_BY_TEST)} logs")
    logged = KIND_BY_TEST.get(sec.test or "")
    if kind and logged and kind != logged:
        raise UsageError(f"--nccl-tests {kind}={source}: the log ran {sec.test} — name it {logged}={source}, or give "
                         f"the file alone (its test line names it)")
    kind = kind or logged or _kind_from_name(source)
    if kind is None:
        raise UsageError(f"--nccl-tests {source}: cannot tell which collective it measured — name it, e.g. "
                         f"all_gather={source}")
    nodes, ranks = _shape(sec, source, kind, shape)
    if kind == "send_recv" and ranks != 2:
        raise UsageError(f"--nccl-tests {source}: sendrecv over {ranks} ranks is a ring of pairs the model does not "
                         f"time — give a 2-rank sendrecv_perf log")
    _check_large_enough(text, source, max(fit))  # (what the log is, said first)
    _check_bus_factor(sec, source, kind, ranks)
    return NcclLog(source, kind, ranks, nodes, " / ".join(sorted(sec.gpus)), tuple(sorted(points)))


def _shape(sec: _Section, source: str, kind: str, shape: tuple[int, int] | None) -> tuple[int, int]:
    """(nodes, ranks): given, or counted from the rank lines (one communicator, as many ranks on every node). A shape
    given overrides the count of nodes (containers may all print one host name) but not of ranks: a rank total the
    rank lines contradict is refused."""
    if shape:
        nodes, ranks = shape[0], shape[0] * shape[1]
        if sec.hosts and len(sec.groups) <= 1 and len(sec.hosts) != ranks:
            raise UsageError(f"--nccl-tests {source}: its rank lines count {len(sec.hosts)} ranks, and "
                             f"@{shape[0]}x{shape[1]} says {ranks} — give the shape it ran (NODESxGPUS multiplying to "
                             f"{len(sec.hosts)}), or drop @NODESxGPUS to count them from the log")
    elif sec.hosts:
        if len(sec.groups) > 1:
            raise UsageError(f"--nccl-tests {source}: its ranks form {len(sec.groups)} communicators "
                             f"(NCCL_TESTS_SPLIT) — give a log of one communicator, or its shape: "
                             f"{kind}@NODESxGPUS={source}")
        per_host = Counter(sec.hosts.values())
        if len(set(per_host.values())) > 1:
            raise UsageError(f"--nccl-tests {source}: {', '.join(f'{n} ranks on {h}' for h, n in per_host.items())} — "
                             f"the model assumes as many ranks on every node")
        nodes, ranks = len(per_host), len(sec.hosts)
    else:
        raise UsageError(f"--nccl-tests {source}: no '#  Rank N Group 0 Pid P on HOST device ...' lines to count ranks "
                         f"and nodes — keep nccl-tests' header, or give the shape: {kind}@NODESxGPUS={source}")
    if ranks < 2:
        raise UsageError(f"--nccl-tests {source}: one rank moves nothing — run the test over 2 or more GPUs")
    return nodes, ranks


def _kind_from_name(source: str) -> str | None:
    name = Path(source).name.lower()
    found = [k for k, pattern in _NAME_PATTERNS.items() if re.search(pattern, name)]
    return found[0] if len(found) == 1 else None


# nccl-tests' busbw over algbw for each collective on n ranks (its doc/PERFORMANCE.md): what a log's own columns say it
# ran, whatever it is named.
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0, "send_recv": lambda n: 1.0}


def _check_bus_factor(sec: _Section, source: str, kind: str, ranks: int) -> None:
    """UsageError where the log's busbw / algbw (its largest row's) is another collective's factor than the one it is
    read as (named on the command line, or taken from the file's name): an all_gather log read as an all_reduce
    would fit a bandwidth twice off. A factor no collective has (or too few ranks to tell them apart) says nothing."""
    cols = _time_columns(sec)
    row = max(sec.rows, key=lambda t: int(t[0])) if sec.rows and cols else None
    if row is None or cols[0] + 2 >= len(row) or ranks < 3:
        return
    algbw, busbw = _float(row[cols[0] + 1]), _float(row[cols[0] + 2])
    if not algbw or not busbw or algbw < 1:
        return
    ratio = busbw / algbw
    near = [k for k, f in BUS_FACTOR.items() if abs(ratio / f(ranks) - 1) <= 0.02]
    if near and kind not in near:
        raise UsageError(f"--nccl-tests {source}: its busbw is {ratio:.3g}x its algbw, as {' or '.join(near)} over "
                         f"{ranks} ranks has it, not {kind} — name it {near[0]}={source}")


# Below this size a collective's time is mostly its latency: a log whose usable rows stop there cannot fit a bandwidth.
MIN_LARGEST_BYTES = 1 << 24


def _check_large_enough(text: str, source: str, largest: float) -> None:
    """UsageError where the rows with a usable time stop short: below MIN_LARGEST_BYTES, or well below the maxBytes
    the header says the test ran to (a log cut short, or its large rows timed 0 or flagged wrong)."""
    import re

    ran = re.search(r"maxBytes\s+(\d+)", text)
    short = largest < MIN_LARGEST_BYTES or (ran is not None and largest < int(ran.group(1)) / 4)
    if short:
        upto = f", though its header says it ran to {int(ran.group(1)) / 2**20:,.0f} MiB" if ran else ""
        raise UsageError(f"--nccl-tests {source}: its rows with a usable time stop at {largest / 2**20:,.3g} MiB{upto} "
                         f"— a log cut short, or large rows timed 0 or flagged wrong; below "
                         f"{MIN_LARGEST_BYTES >> 20} MiB a collective's time is mostly latency, which fits no bandwidth: "
                         f"give the whole log of a run up to 1 GiB or more (-e 8G)")


def _float(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _time_columns(sec: _Section) -> list[int]:
    """Where the out-of-place and in-place times are: the header's `time` columns; without a header (a page that
    dropped it), the columns of the largest row whose next column is its algbw (size / time, in us or ms), where
    algbw is large enough that no other pair of columns passes for it."""
    if sec.header:
        return [i for i, name in enumerate(sec.header) if name == "time"][:2]
    tok = max(sec.rows, key=lambda t: int(t[0]))
    size, cols, i = int(tok[0]), [], 3
    while i < len(tok) - 1 and len(cols) < 2:
        t, algbw = _float(tok[i]), _float(tok[i + 1])
        if t and t > 0 and algbw and any(abs(size / (t * u) / 1e9 / algbw - 1) < 0.05 for u in (1e-6, 1e-3)):
            cols.append(i)
            i += 4  # its algbw, busbw and #wrong
        else:
            i += 1
    return cols


def _unit(sec: _Section, cols: list[int]) -> float:
    """Seconds per printed time unit: the header's `(us)` / `(ms)`, else the one under which size / time matches the
    printed algbw on most rows large enough to tell (the 2017-18 releases printed milliseconds)."""
    if sec.unit:
        return sec.unit
    votes = {1e-6: 0, 1e-3: 0}
    for tok in sec.rows:
        if not cols or cols[0] + 1 >= len(tok):
            continue
        t, algbw = _float(tok[cols[0]]), _float(tok[cols[0] + 1])
        if t and t > 0 and algbw and algbw >= 1:
            best = min(votes, key=lambda u: abs(math.log(int(tok[0]) / (t * u) / 1e9 / algbw)))
            votes[best] += 1
    return max(votes, key=lambda u: (votes[u], u == 1e-6))


def _points(sec: _Section) -> list[tuple[float, float]]:
    """(bytes, seconds) per row: the faster of out-of-place and in-place. Left out: a row nccl-tests flagged wrong
    (#wrong > 0: corrupted results), a time that is not positive, and a time its own algbw contradicts (size / time off
    the printed algbw by more than 5 % where algbw is large enough to tell: not the collective's time, e.g. -C's CPU
    time)."""
    if not sec.rows:
        return []
    cols = _time_columns(sec)
    unit, out = _unit(sec, cols), []
    wrong = [c + 3 for c in cols if len(sec.header) > c + 3 and sec.header[c + 3] == "#wrong"]
    for tok in sec.rows:
        if any(c < len(tok) and tok[c].isdigit() and int(tok[c]) > 0 for c in wrong):
            continue
        times = [t * unit for c in cols if c < len(tok) and (t := _float(tok[c])) and t > 0
                 and _agrees(int(tok[0]), t * unit, _float(tok[c + 1]) if c + 1 < len(tok) else None)]
        if times:
            out.append((float(tok[0]), min(times)))
    return out


def _agrees(size: int, seconds: float, algbw: float | None) -> bool:
    """size / time matches the printed algbw (GB/s), or algbw is too small (two decimals) to tell. A row without its
    algbw (a log cut inside that row: "1073741824 268435456 float sum -1 52", the first digits of a time) is not one."""
    return algbw is not None and (algbw < 1 or abs(size / seconds / 1e9 / algbw - 1) <= 0.05)


# ----------------------------------------------------------------------------------------------------- the fit


def model_time(cluster: ClusterSpec, log: NcclLog, nbytes: float) -> float:
    """The planner's time for this log's collective, ranks and placement on `cluster`."""
    from shardwise.planner.comm import nccl_time

    stride = max(1, cluster.gpus_per_node // log.per_node)
    return nccl_time(cluster, log.kind, nbytes, log.ranks, stride)


def errors(cluster: ClusterSpec, log: NcclLog, min_bytes: float = MIN_FIT_BYTES) -> list[float]:
    """Predicted / logged time - 1 at every size of at least `min_bytes` (+: the model is too slow)."""
    return [model_time(cluster, log, b) / t - 1 for b, t in log.points if b >= min_bytes]


# The loss's scale: a log ratio beyond it counts linearly, not squared (soft L1), so one bad row (a glitch, a
# contended run) moves the fit little.
ROBUST_SCALE = 0.1


def _loss(cluster: ClusterSpec, logs: list[NcclLog]) -> float:
    d = ROBUST_SCALE
    return sum(math.sqrt(1 + (math.log1p(e) / d) ** 2) - 1 for log in logs for e in errors(cluster, log))


def _minimise(loss, start: list[float], bounds: list[tuple[float, float]]) -> list[float]:
    """Pattern search on each coordinate, steps halving (a handful of parameters, a smooth loss: enough)."""
    x, best = list(start), loss(start)
    steps = [(hi - lo) / 4 for lo, hi in bounds]
    while max(s / (hi - lo) for s, (lo, hi) in zip(steps, bounds)) > 1e-4:
        moved = False
        for i, (lo, hi) in enumerate(bounds):
            for sign in (1, -1):
                trial = list(x)
                trial[i] = min(hi, max(lo, x[i] + sign * steps[i]))
                value = loss(trial)
                if value < best:
                    x, best, moved = trial, value, True
                    break
        if not moved:
            steps = [s / 2 for s in steps]
    return x


def _check_base(base: ClusterSpec, logs: list[NcclLog]) -> None:
    if base.measured:
        raise UsageError("--nccl-tests fits a datasheet cluster's network: give --cluster a preset or a cluster file "
                         "without [measured] tables")
    if base.network_fit or base.net_step_extra:  # its line rate is a fit, no longer the NICs' bound
        raise UsageError("--cluster is already fitted to nccl-tests logs (network_fit, net_step_extra_us) — give the "
                         "preset or datasheet file it came from, with all the logs at once")
    for log in logs:
        if log.per_node > base.gpus_per_node or base.gpus_per_node % log.per_node:
            raise UsageError(f"--nccl-tests {log.source}: {log.per_node} ranks per node on a cluster of "
                             f"{base.gpus_per_node} GPUs per node — give the --cluster it ran on (gpus_per_node)")


_GPU_MODEL = re.compile(r"\b(GB200|B200|H200|H100|H800|A100|A800|V100)\b")


def check_gpus(base: ClusterSpec, logs: list[NcclLog], cluster_ref: str) -> None:
    """UsageError (one line) where a log names its GPUs (nccl-tests' rank lines) and they are another model than the
    cluster's: the fit would move the cluster's network to explain another machine's links."""
    want = _GPU_MODEL.search(base.name.upper())
    for log in logs:
        got = _GPU_MODEL.search(log.gpu.upper())
        if want and got and got.group(1) != want.group(1):
            raise UsageError(f"--nccl-tests {log.source} ran on {log.gpu}, and --cluster {cluster_ref} is {base.name} "
                             f"— give the cluster the logs ran on (a preset, or a cluster .toml of yours)")


def beyond_ring(base: ClusterSpec, log: NcclLog) -> bool:
    """A log whose largest sizes moved more bus bandwidth than a ring can: more than its ranks' NICs carry (across
    nodes) or than NVLink's datasheet rate (one node). Such an all-reduce reduced inside the switches (NVLink SHARP,
    SHARP) or ran a tree over two nodes, which halves what crosses the network; the model times neither, so the log
    says nothing about the numbers fitted here. Judged on the median of the largest three sizes (one glitch aside)."""
    limit = log.per_node * base.inter_node_bandwidth if log.nodes > 1 else base.intra_node_bandwidth
    return _busbw(log) * 1e9 > limit


@dataclass(frozen=True)
class Fit:
    cluster: ClusterSpec
    fitted: dict  # [cluster] key -> value, the keys the logs determined
    logs: tuple[NcclLog, ...]
    base: ClusterSpec
    left_out: tuple[str, ...] = ()  # sources of the logs beyond_ring: reported, not fitted

    def at_bound(self) -> list[str]:
        """Fitted keys that ended on a nonzero bound of their search (`_bounds`: the line rate's cap, 1 % of it,
        MAX_EXTRA_US): the logs ask for more than the model allows there. No extra latency is a result, not a bound."""
        bounds = _bounds(self.base)
        return [k for k, v in self.fitted.items() if any(b and math.isclose(v, b, rel_tol=1e-3) for b in bounds[k])]

    def before(self) -> dict:
        """The fitted keys as the base cluster had them."""
        values = network_values(self.base)
        return {k: values[k] for k in self.fitted}

    def rows(self) -> list[dict]:
        """Per log: its shape and the model's error before and after the fit (sizes >= MIN_FIT_BYTES)."""
        out = []
        for log in self.logs:
            before, after = errors(self.base, log), errors(self.cluster, log)
            big = [e for (b, _), e in zip([p for p in log.points if p[0] >= MIN_FIT_BYTES], after) if b >= 1 << 26]
            out.append({"log": log.source, "kind": log.kind, "ranks": log.ranks, "nodes": log.nodes, "gpu": log.gpu,
                        "sizes": len(before), "median_abs_error_before": _median_abs(before),
                        "median_abs_error": _median_abs(after), "max_abs_error": max(abs(e) for e in after),
                        "median_abs_error_64mib_up": _median_abs(big) if big else None,
                        "largest_busbw_gbs": _busbw(log), "fitted": log.source not in self.left_out})
        return out


def network_values(cluster: ClusterSpec) -> dict:
    """The [cluster] keys the fit sets, as `cluster` has them."""
    return {"intra_node_bandwidth_gbs": cluster.intra_node_bandwidth / 1e9,
            "inter_node_bandwidth_gbs": cluster.inter_node_bandwidth / 1e9,
            "net_step_extra_us": cluster.net_step_extra * 1e6}


def _bounds(base: ClusterSpec) -> dict:
    """Each fitted key's search range. The line rate at most BASE's: a log faster than the NICs carry reduced in the
    network or the switch (SHARP, NVLink SHARP), which the model does not time, and a rate above the NICs' would leak
    into every group with fewer ranks per node (a data-parallel ring with one per node), which cannot use it."""
    line = base.inter_node_bandwidth / 1e9
    return {"intra_node_bandwidth_gbs": (1.0, 10000.0), "inter_node_bandwidth_gbs": (0.01 * line, line),
            "net_step_extra_us": (0.0, MAX_EXTRA_US)}


def _median_abs(values: list[float]) -> float:
    return statistics.median(abs(v) for v in values)


def _busbw(log: NcclLog) -> float:
    """nccl-tests' bus bandwidth at the log's largest sizes (the median of the top three), GB/s, with its own factors
    per collective."""
    n = log.ranks
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n}.get(log.kind, 1.0)
    return statistics.median(b / t for b, t in log.points[-3:]) * factor / 1e9


def fit(base: ClusterSpec, logs: list[NcclLog]) -> Fit:
    """Fit NVLink on the one-node logs, then the network on the multi-node ones (with that NVLink)."""
    _check_base(base, logs)
    cluster, fitted, bounds = base, {}, _bounds(base)
    left_out = tuple(log.source for log in logs if beyond_ring(base, log))
    one_node = [log for log in logs if log.nodes == 1 and log.source not in left_out]
    across = [log for log in logs if log.nodes > 1 and log.source not in left_out]
    if one_node:
        (gbs,) = _minimise(lambda x: _loss(replace(cluster, intra_node_bandwidth=x[0] * 1e9), one_node),
                           [cluster.intra_node_bandwidth / 1e9], [bounds["intra_node_bandwidth_gbs"]])
        cluster = replace(cluster, intra_node_bandwidth=gbs * 1e9)
        fitted["intra_node_bandwidth_gbs"] = round(gbs, 2)
    if across:
        def network(x):
            return replace(cluster, inter_node_bandwidth=x[0] * 1e9, net_step_extra=x[1] * 1e-6)

        gbs, extra = _minimise(lambda x: _loss(network(x), across), [base.inter_node_bandwidth / 1e9, 0.0],
                               [bounds["inter_node_bandwidth_gbs"], bounds["net_step_extra_us"]])
        cluster = network([gbs, extra])
        fitted["inter_node_bandwidth_gbs"] = round(gbs, 3)
        fitted["net_step_extra_us"] = round(extra, 2)
    if not fitted:
        raise UsageError(f"--nccl-tests: every log ran faster than a ring can ({', '.join(left_out)}: NVLink SHARP or "
                         f"a two-node tree), so none says what the model's rings take — add all_gather or "
                         f"reduce_scatter logs, or all_reduce over 4 or more nodes (or with NCCL_ALGO=Ring)")
    return Fit(cluster, fitted, tuple(logs), base, left_out)


def cluster_file(fit: Fit, table: dict, command: str) -> str:
    """The base cluster's [cluster] table with the fitted keys, and where they came from."""
    from shardwise.calibrate.profile import toml_table

    table = {**table, **fit.fitted, "name": f"{table.get('name', fit.base.name)} (network from nccl-tests)",
             "network_fit": "nccl-tests"}
    head = [f"# Written by `{_comment(command)}`.",
            "# Fitted to these nccl-tests logs (model error after / before the fit, median over sizes >= 64 KiB):"]
    head += [f"#   {_comment(r['log'])}: {r['kind']}, {r['ranks']} ranks on {r['nodes']} node(s), "
             f"{100 * r['median_abs_error']:.1f} % / {100 * r['median_abs_error_before']:.1f} %"
             f"{'' if r['fitted'] else ' (not fitted: faster than a ring can run)'}"
             for r in fit.rows()]
    return "\n".join(head) + "\n\n" + toml_table("cluster", table)


def _comment(text: str) -> str:
    """Text for one TOML comment line: control characters (a newline in a path) escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
