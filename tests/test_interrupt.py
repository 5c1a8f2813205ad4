"""Ctrl-C and SIGTERM on real multi-process commands (`train --dp 2`, `calibrate --world 2`, `validate --world 2`):
exit 130 / 143, one line on stderr, no traceback, no process of the job left running — whether the signal comes
while the ranks train or while the job is still starting (its fork server importing torch, before any rank exists).

Ctrl-C is a SIGINT to the terminal's whole process group (launcher and ranks alike); SIGTERM comes from a
scheduler or `kill` to the launcher alone. All jobs run at once (each in its own session, so its processes can
be found afterwards) to share their start-up time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

TRAIN = ["train", "--model", "tiny", "--dp", "2", "--steps", "100000", "--global-batch", "4", "--seq-len", "16",
         "--no-progress"]
# name: (command, signal, to the whole group (Ctrl-C), exit code, when: "training" (two steps written) or
# "ranks" (the fork server the ranks are forked from is importing torch))
CASES = {
    "train ctrl-c": (TRAIN, signal.SIGINT, True, 130, "training"),
    "train sigterm": (TRAIN, signal.SIGTERM, False, 143, "training"),
    # --json: stdout still one JSON object, what stopped the run and where its steps are
    "train sigterm --json": (TRAIN + ["--json"], signal.SIGTERM, False, 143, "training"),
    "train ctrl-c at start-up": (TRAIN, signal.SIGINT, True, 130, "ranks"),
    # a closed terminal: multiprocessing's resource tracker, in the same group, had died of it and the launch's
    # cleanup printed a dozen tracebacks from the one it started again
    "train sighup": (TRAIN, signal.SIGHUP, True, 129, "training"),
    "calibrate sigterm": (["calibrate", "--world", "2", "--out", "{tmp}/profile.toml"], signal.SIGTERM, False, 143, "ranks"),
    "validate ctrl-c": (["validate", "--world", "2", "--cluster", "dgx-h100-80gb", "--steps", "1", "--repeats", "50"],
                        signal.SIGINT, True, 130, "ranks"),
}


@contextmanager
def _started_with(ignored=()):
    """Processes started inside inherit SIGINT, SIGQUIT, SIGTERM and SIGHUP as a terminal's foreground job has them
    (the program's own handler, the default) or, for those in `ignored`, ignored (a script's `cmd &`), whatever this
    test process inherited: a suite started in the background of a script ignores SIGINT, one under nohup SIGHUP, and
    so would the jobs. Set here
    around the start rather than in the child (preexec_fn is unsafe in a process with threads); signal.signal works
    in the main thread only, where pytest runs tests."""
    wanted = {signal.SIGINT: signal.default_int_handler, signal.SIGQUIT: lambda *_: None,
              signal.SIGTERM: signal.SIG_DFL, signal.SIGHUP: signal.SIG_DFL}
    saved = {sig: signal.getsignal(sig) for sig in wanted}
    try:
        for sig, handler in wanted.items():
            signal.signal(sig, signal.SIG_IGN if sig in ignored else handler)
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _kill_session(proc) -> None:
    """Whatever of a job is left after a failed check: its whole process group, launcher gone or not."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _in_session(sid: int) -> list[tuple[str, str]]:
    """(pid, command line) of the processes of session `sid` that still run (a zombie has ended; init reaps it)."""
    alive = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                alive.append((proc.name, cmdline))
    return alive


def _ready(name: str, proc, tmp: Path) -> bool:
    when = CASES[name][4]
    if when == "training":
        metrics = tmp / f"{name}.jsonl"
        return metrics.exists() and metrics.read_text().count("\n") >= 2
    return any("multiprocessing.forkserver" in cmd and _importing_torch(pid) for pid, cmd in _in_session(proc.pid))


def _importing_torch(pid: str) -> bool:
    """The job's fork server is importing torch (its libraries are mapped): the ranks are not forked yet."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the job's processes through /proc (Linux)")
def test_ctrl_c_and_sigterm_stop_multi_process_commands_in_one_line(tmp_path):
    jobs = {}
    for name, (argv, *_, when) in CASES.items():
        argv = [a.format(tmp=tmp_path) for a in argv]
        if when == "training":
            argv += ["--metrics-file", str(tmp_path / f"{name}.jsonl")]
        with _started_with():
            # -X faulthandler: a job still running after its signal dumps every thread's stack on SIGABRT (below)
            jobs[name] = subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "shardwise", *argv],
                                          stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=tmp_path)
    try:
        deadline, stopped, ended = time.monotonic() + 300, {}, {}
        while len(stopped) < len(jobs):  # each is stopped as soon as it reaches its moment
            for name, proc in jobs.items():
                if name not in stopped and _ready(name, proc, tmp_path):
                    sig, whole_group = CASES[name][1:3]
                    os.killpg(proc.pid, sig) if whole_group else os.kill(proc.pid, sig)
                    stopped[name] = time.monotonic()
                elif name not in stopped:
                    assert proc.poll() is None, (name, proc.communicate())
            _note_ends(jobs, stopped, ended)  # a job stopped early ends while the others still start
            assert time.monotonic() < deadline, f"not started: {sorted(jobs.keys() - stopped.keys())}"
            time.sleep(0.05)
        _end_times(jobs, ended)
        for name, proc in jobs.items():
            sig, _, code, _ = CASES[name][1:]
            out, err = _communicate_or_dump(name, proc)
            took = ended.get(name, time.monotonic()) - stopped[name]
            lines = err.strip().splitlines()
            # Stopped, not timed out: far below the jobs' collective timeouts (train's default: 300 s). Each job's own
            # time (0.3-1.7 s at load average 7): the 36 s that once failed here was the wait for the jobs stopped after it.
            assert proc.returncode == code and took < 30, (name, proc.returncode, took, err)
            assert len(lines) == 1 and lines[0].startswith(f"shardwise: interrupted by {sig.name}"), (name, err)
            if "--json" in name:
                said = json.loads(out)
                assert said["exit_code"] == code and said["error"].startswith(f"interrupted by {sig.name}"), out
                assert said["metrics_file"].endswith(f"{name}.jsonl")
            left = _in_session(proc.pid)
            for _ in range(50):  # ranks the launcher stopped may take a moment to be gone
                if not left:
                    break
                time.sleep(0.1)
                left = _in_session(proc.pid)
            assert not left, (name, left)
    finally:
        for proc in jobs.values():
            _kill_session(proc)


def _note_ends(jobs: dict, stopped: dict, ended: dict) -> None:
    """Record in `ended` (time.monotonic) each stopped job seen to have ended since the last look."""
    for name in stopped.keys() - ended.keys():
        if jobs[name].poll() is not None:
            ended[name] = time.monotonic()


def _end_times(jobs: dict, ended: dict, timeout: float = 120) -> None:
    """Watch every stopped job together, from the moment the last was stopped, until all have ended or `timeout`
    seconds pass, adding each end to `ended`: with the ends seen while the others were still being stopped, a job's
    time is its own, neither the wait for the jobs stopped after it nor for those read before it."""
    deadline = time.monotonic() + timeout
    while len(ended) < len(jobs) and time.monotonic() < deadline:
        _note_ends(jobs, jobs, ended)
        time.sleep(0.05)


def _communicate_or_dump(name: str, proc, timeout: float = 60) -> tuple[str, str]:
    """The job's stdout and stderr once it has ended; if it has not within 60 s of its signal, fail with what each of its
    processes was doing (their states, and every Python thread's stack, which SIGABRT makes faulthandler print)."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        left = _in_session(proc.pid)
        states = [f"{pid} {Path(f'/proc/{pid}/stat').read_text().split()[2] if Path(f'/proc/{pid}/stat').exists() else '?'}"
                  f" {cmd[:120]}" for pid, cmd in left]
        for pid, _ in left:
            try:
                os.kill(int(pid), signal.SIGABRT)
            except OSError:
                pass
        try:
            err = proc.communicate(timeout=30)[1]
        except subprocess.TimeoutExpired:
            err = "(no stderr: still running after SIGABRT)"
        pytest.fail(f"{name}: still running {timeout:g} s after its signal; processes: {states}\n{err[-20000:]}")


EXPLAIN = ["explain", "--model", "tiny", "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "16",
           "--seq-len", "128"]


def test_an_error_raised_while_unwinding_a_signal_is_still_the_interrupt(monkeypatch, capsys):
    """The signal's exception is raised wherever the main thread is, and a library whose clean-up it cuts half-way can
    fail in its own way while unwinding (torch's elastic rendezvous registers a finalizer that joins its keep-alive
    thread before starting it: SIGTERM in between, and the agent's shutdown raised "cannot join thread before it is
    started", a traceback and exit 1). The command still ends in the interrupt's one line and exit code; an error with
    no signal behind it in the same command stays an error, even after an earlier command was interrupted, and
    `sys.exit` keeps its code."""
    import shardwise.commands.explain as explain
    from shardwise import cli

    def interrupted_clean_up(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)  # the handler raises here
        finally:
            raise RuntimeError("cannot join thread before it is started")

    def failed_while_handling_ctrl_c(args):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("cannot join thread before it is started") from None

    def raised_from_ctrl_c(args):
        error = RuntimeError("wrapped")
        error.__cause__ = KeyboardInterrupt()
        raise error

    def bug(args):
        raise RuntimeError("a bug")

    def exits(args):
        sys.exit(3)

    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    for command, code, line in [(interrupted_clean_up, 143, "SIGTERM"), (bug, RuntimeError, None),
                                (failed_while_handling_ctrl_c, 130, "SIGINT"), (raised_from_ctrl_c, 130, "SIGINT"),
                                (exits, SystemExit, None)]:
        monkeypatch.setattr(explain, "run", command)
        if isinstance(code, int):
            assert cli.main(EXPLAIN) == code, command.__name__
            assert capsys.readouterr().err.strip().splitlines() == [f"shardwise: interrupted by {line} — stopped"]
        else:
            with pytest.raises(code):
                cli.main(EXPLAIN)
        # the command's handlers are gone once it returns: an in-process caller keeps its own
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == handlers, command.__name__


def test_ctrl_c_while_the_command_loads_is_its_one_line_too():
    """A Ctrl-C in the command's first moments, while its modules load and before its own handlers are in place,
    raised Python's KeyboardInterrupt with a traceback; it is the interrupt's one line and exit 130 as later, with the
    JSON object under --json."""
    code = ("import os, signal, sys\n"
            "from shardwise import cli\n"
            "build = cli.build_parser\n"
            "def interrupted(argv):\n"
            "    os.kill(os.getpid(), signal.SIGINT)  # raised at the next instruction, inside the parser's build\n"
            "    return build(argv)\n"
            "cli.build_parser = interrupted\n"
            "sys.exit(cli.main(sys.argv[1:]))\n")
    for extra in ([], ["--json"]):
        with _started_with():  # SIGINT as a terminal's job has it, even in a suite started in the background
            out = subprocess.run([sys.executable, "-c", code, *EXPLAIN, *extra], capture_output=True, text=True,
                                 timeout=120)
        assert out.returncode == 130, out.stderr
        assert out.stderr.strip().splitlines() == ["shardwise: interrupted by SIGINT — stopped"], out.stderr
        assert (json.loads(out.stdout) if extra else out.stdout) == (
            {"error": "interrupted by SIGINT — stopped", "exit_code": 130} if extra else "")


def test_a_signal_the_process_was_started_ignoring_stays_ignored():
    """`shardwise plan ... &` from a script starts with SIGINT ignored: the command leaves it so (Ctrl-C at the terminal
    is not for it), and still turns SIGTERM into its one line, even one it inherited ignored (no shell ignores SIGTERM
    for a job; SIGTERM at any moment stops the command)."""
    from shardwise.interrupt import _raise, cli_handlers

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        restore = cli_handlers()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is _raise
        restore()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


def test_rank_handlers_ignore_what_the_launcher_ignores_and_end_on_the_rest():
    """A rank ends at once on SIGINT / SIGTERM / SIGQUIT, unless its launcher ignores the group signal (handed over at
    the launch, whatever the fork server it came from inherited); under torchrun (None) the rank's own. SIGTERM, how
    the agent stops ranks, is never kept ignored."""
    from shardwise.interrupt import rank_handlers

    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)
    previous = {sig: signal.getsignal(sig) for sig in sigs}
    try:
        for sig in sigs:
            signal.signal(sig, signal.SIG_IGN)
        rank_handlers()  # torchrun: what this process ignores stays ignored, SIGTERM excepted
        assert [signal.getsignal(s) for s in sigs] == [signal.SIG_IGN, signal.SIG_DFL, signal.SIG_IGN]
        rank_handlers(frozenset())  # a server started ignoring them, a launcher that does not
        assert [signal.getsignal(s) for s in sigs] == [signal.SIG_DFL] * 3
        rank_handlers(frozenset({signal.SIGINT, signal.SIGTERM}))  # the reverse, SIGTERM named too
        assert [signal.getsignal(s) for s in sigs] == [signal.SIG_IGN, signal.SIG_DFL, signal.SIG_DFL]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the job's processes through /proc (Linux)")
def test_a_job_started_ignoring_sigint_trains_on_through_it_and_stops_on_sigterm(tmp_path):
    """`shardwise train --dp 2 ... &` from a script (SIGINT and SIGQUIT ignored): a SIGINT or SIGQUIT to the job's
    group ends no process of it (its ranks included: the steps go on being written, past the 3 s torch's agent would
    give ranks it was stopping), and SIGTERM still stops it in one line, nothing left running."""
    metrics = tmp_path / "m.jsonl"
    with _started_with(ignored=(signal.SIGINT, signal.SIGQUIT)):
        proc = subprocess.Popen([sys.executable, "-m", "shardwise", *TRAIN, "--metrics-file", str(metrics)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                cwd=tmp_path)

    def steps() -> int:
        return metrics.read_text().count("\n") if metrics.exists() else 0

    def wait_for(n: int) -> None:
        deadline = time.monotonic() + 240
        while steps() < n:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"fewer than {n} steps written"
            time.sleep(0.05)
    try:
        wait_for(2)
        os.killpg(proc.pid, signal.SIGINT)
        os.killpg(proc.pid, signal.SIGQUIT)
        heard = time.monotonic()
        wait_for(steps() + 3)
        while time.monotonic() < heard + 5:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        wait_for(steps() + 1)
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 143 and err.strip().startswith("shardwise: interrupted by SIGTERM"), err
        assert len(err.strip().splitlines()) == 1, err
        for _ in range(50):
            if not _in_session(proc.pid):
                break
            time.sleep(0.1)
        assert not _in_session(proc.pid)
    finally:
        _kill_session(proc)
