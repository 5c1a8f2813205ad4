"""How much of this machine's CPU other processes used while a job of ours ran.

    with OtherCpu() as other:
        run_ranks(...)                  # the ranks are this process's children, waited for on return
    other.cores                         # mean cores the rest of the machine kept busy meanwhile (None: unknown)

Why it matters: a CPU timing is only this machine's if nothing else ran. Linux shares CPU time fairly between
sessions (CFS autogroups, on by default on desktops and servers alike), not between processes: one busy
process of another session on a 2-core machine takes a whole core from a 2-rank job, whose ranks then
share the other; ranks that synchronise many times a step lose more than that (one rank waiting for a core
stalls both at the next collective). `calibrate` records the figure in its profile and `validate` beside
its sweep, and warns when either saw one (a calibration and a sweep taken under different neighbours
disagree by their neighbours, not by the model). The machine itself can change speed too (a virtual
machine's host, whose other guests this one does not see): `validate` times the calibration's reference
workload again during its sweep and warns when the two differ by more than SPEED_TOLERANCE (`speed_note`).

Machine-wide busy time is read from /proc/stat (user, nice, system, irq, softirq and steal: a hypervisor's
other guests count as other processes too); ours is this process's and its waited-for children's
(getrusage), plus our fork server's and the ranks it has reaped (launch.run_ranks forks the ranks from a
server this process started, so they are the server's children, not ours: /proc/<server>/stat). Elsewhere
than Linux, or when part of the job is not ours (under torchrun, the other ranks are siblings), the figure
is unknown (None)."""

from __future__ import annotations

import os
import resource
import time

# Cores of other processes' use above which a timing is flagged as not this machine's alone.
BUSY_NEIGHBOURS = 0.25
# A reference workload timed during a sweep and during the calibration that predicts it: a ratio further
# from 1 than this flags the machine as not the one that was calibrated.
SPEED_TOLERANCE = 0.15


def busy_seconds(stat_line: str, ticks_per_s: float) -> float:
    """CPU seconds the whole machine spent busy, from /proc/stat's first ("cpu") line:
    user nice system idle iowait irq softirq steal [guest guest_nice] (guest time is already in user)."""
    fields = [int(x) for x in stat_line.split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / ticks_per_s


def _sample() -> tuple[float, float, float] | None:
    """(wall seconds, machine busy CPU seconds, our CPU seconds incl. waited-for children), or None."""
    try:
        with open("/proc/stat") as f:
            line = f.readline()
        busy = busy_seconds(line, os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError):
        return None
    ours = sum(getattr(resource.getrusage(who), k) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for k in ("ru_utime", "ru_stime"))
    return time.monotonic(), busy, ours + fork_server_seconds()


def fork_server_seconds() -> float:
    """CPU seconds of this process's fork server (multiprocessing's, which launch.run_ranks starts) and of the
    children it has reaped — the ranks, which the server reaps before this process learns they ended — or 0 without
    one. Fields 14-17 of /proc/<pid>/stat: utime, stime, cutime, cstime, in clock ticks."""
    import sys

    server = getattr(sys.modules.get("multiprocessing.forkserver"), "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)  # CPython's, since 3.4
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:  # gone, or not Linux
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()  # from field 3 on: the command name may hold spaces
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def other_cores(start: tuple[float, float, float], end: tuple[float, float, float]) -> float:
    """Mean cores busy with other processes' work between two samples (wall, machine busy, ours)."""
    wall = end[0] - start[0]
    if wall <= 0:
        return 0.0
    return max((end[1] - start[1]) - (end[2] - start[2]), 0.0) / wall


class OtherCpu:
    """Context manager: `cores` = mean cores other processes used while the block ran (None: unknown)."""

    def __init__(self, enabled: bool = True):
        self.enabled, self.cores, self._start = enabled, None, None

    def __enter__(self) -> "OtherCpu":
        self._start = _sample() if self.enabled else None
        return self

    def __exit__(self, *exc) -> None:
        end = _sample() if self._start else None
        self.cores = round(other_cores(self._start, end), 3) if end else None


def machine_cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def gloo_loop_threads() -> int | None:
    """Threads of this process running gloo's tcp event loop (one per gloo process group; each wakes 100 times a
    second even when idle: gloo/transport/tcp/loop.cc polls epoll with a 10 ms timeout), or None where /proc has no
    thread names. Ours too: a rank holding many groups loses CPU to them (validate.measure.mesh_split)."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    count = 0
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                count += f.read().strip() == "gloo_tcp_loop"
        except OSError:  # the thread ended meanwhile
            pass
    return count


def neighbours_note(what: str, cores: float | None) -> str | None:
    """A sentence for a timing taken while other processes kept `cores` busy (None when they did not)."""
    if cores is None or cores <= BUSY_NEIGHBOURS:
        return None
    return (f"other processes kept {cores:.1f} of this machine's {machine_cores()} cores busy during {what}: "
            f"its times include their interference")


def speed_note(ratio: float | None) -> str | None:
    """A sentence when the calibration's reference workload ran at another speed during the sweep."""
    if ratio is None or abs(ratio - 1) <= SPEED_TOLERANCE:
        return None
    return (f"the calibration's reference workload took {ratio:.2f}x its calibrated time during the sweep: the "
            f"machine ran {'slower' if ratio > 1 else 'faster'} than when it was calibrated")


def sweep_warnings(result: dict) -> list[str]:
    """What made the sweep's figures less than a quiet machine's: other processes during the sweep or the
    calibration, the machine's speed drifting from the calibration's, layouts whose repeats stayed noisy."""
    m, s = result.get("machine", {}), result["summary"]
    notes = [f"{note} — compare predictions and measurements taken on a quiet machine"
             for note in (neighbours_note("the sweep", m.get("other_cpu_cores")),
                          neighbours_note("the calibration", m.get("calibration_other_cpu_cores")),
                          speed_note(m.get("speed_ratio"))) if note]
    if s["noisy_layouts"]:
        notes.append(f"{s['noisy_layouts']} layout(s) stayed noisy (spread > 25 %) after a repeat — the machine is "
                     f"busy; rerun when it is quiet or with more --repeats")
    return notes
