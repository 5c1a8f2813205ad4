"""Ranks are forks of a fork server that imported torch and shardwise once (fork_server.py): they start in about a second
instead of importing torch each, yet each sees this process's environment as it is at the launch, not as it was
when the server started — and keeps the variables torch elastic sets for it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from shardwise import fork_server, launch
from shardwise.launch import spawn_ranks

KEYS = ("SHARDWISE_PROBE", "SHARDWISE_GONE", "RANK", "WORLD_SIZE")


def _probe(rank, world, out):
    Path(out).mkdir(exist_ok=True)
    Path(out, f"{rank}.json").write_text(json.dumps({k: os.environ.get(k) for k in KEYS}))


def _seen(folder: Path) -> list[dict]:
    return [json.loads((folder / f"{r}.json").read_text()) for r in range(2)]


def test_ranks_see_the_environment_of_the_launch_not_of_the_servers_start(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDWISE_GONE", "1")
    spawn_ranks(_probe, 2, str(tmp_path / "a"))  # the server exists from here on (started now or earlier)
    assert fork_server._server_env is not None
    monkeypatch.setitem(fork_server._server_env, "SHARDWISE_GONE", "1")  # as if the server had started with it
    monkeypatch.delenv("SHARDWISE_GONE")
    monkeypatch.setenv("SHARDWISE_PROBE", "set after the server started")
    monkeypatch.setenv("RANK", "7")  # torch elastic's per-rank variables are never taken from the launcher
    try:
        launch.run_ranks(launch._with_rank, _probe, str(tmp_path / "b"), world=2)
    finally:
        monkeypatch.delenv("RANK")
    for rank, seen in enumerate(_seen(tmp_path / "b")):
        assert seen["SHARDWISE_PROBE"] == "set after the server started"
        assert seen["SHARDWISE_GONE"] is None
        assert (seen["RANK"], seen["WORLD_SIZE"]) == (str(rank), "2")


def test_the_servers_imports_never_ask_the_cuda_driver(tmp_path):
    """The server is forked into NCCL ranks: a CUDA driver initialised in it (torch.cuda.is_available() or a device
    count is enough) would leave every fork unable to use its GPU. Its imports must not ask."""
    import subprocess
    import sys

    code = (
        "import torch, torch.cuda\n"
        "asked = []\n"
        "for name in ('is_available', 'device_count', 'init', '_lazy_init'):\n"
        "    setattr(torch.cuda, name, lambda *a, _n=name, **k: asked.append(_n))\n"
        "if hasattr(torch._C, '_cuda_getDeviceCount'):\n"
        "    torch._C._cuda_getDeviceCount = lambda *a: asked.append('_cuda_getDeviceCount')\n"
        "from shardwise.fork_server import PRELOAD\n"
        "for module in PRELOAD: __import__(module)\n"
        "print(asked, torch.cuda.is_initialized())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] False"


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_an_interrupt_ends_the_server_with_the_ranks_it_was_still_forking():
    """After Ctrl-C the launcher ends its fork server; a rank the server forked just before (still reading its launch
    from the launcher, which is about to exit, where it would fail with a traceback) must end with it, silently."""
    import multiprocessing
    import time

    import pytest

    if not Path("/proc").is_dir():
        pytest.skip("finds the server's forks through /proc (Linux)")
    fork_server.start(2)
    fork = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(120,))
    fork.start()
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    fork_server.stop()
    fork.join(30)
    for _ in range(50):  # a killed process takes a moment to end; init reaps the orphan
        if not _running(fork.pid) and not _running(server):
            break
        time.sleep(0.1)
    assert not _running(fork.pid) and not _running(server)
    assert fork_server._server_env is None


def _fail_on_rank_one(rank, world):
    if rank == 1:
        raise ValueError("rank one's own error")


def test_a_launch_leaves_nothing_in_the_temporary_folder_and_still_names_a_ranks_error(tmp_path, monkeypatch):
    """torch elastic keeps each rank's error file in a folder of its own; left to it, every launch would leave one in
    the system's temporary folder. The launch removes it, after reading a failed rank's error from it, and the copy of
    the error torch.multiprocessing writes there for each failed rank and never removes (one file per failed rank,
    'pytorch-errorfile-*.pickle', before)."""
    import multiprocessing.util
    import tempfile

    import pytest

    multiprocessing.util.get_temp_dir()  # this process's own, made once for its life: not the launch's
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    spawn_ranks(_probe, 2, str(tmp_path / "out"))
    assert list((tmp_path / "tmp").iterdir()) == []
    with pytest.raises(RuntimeError, match="rank one's own error"):
        spawn_ranks(_fail_on_rank_one, 2)
    assert list((tmp_path / "tmp").iterdir()) == []


def _signal_probe(rank, world, out):
    import signal

    Path(out).mkdir(exist_ok=True)
    Path(out, f"{rank}.json").write_text(json.dumps({"int_ignored": signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
                                                     "term_default": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL}))


def test_ranks_ignore_the_group_signals_the_launch_ignores_not_those_of_the_servers_start(tmp_path):
    """The server is kept across launches and gives its children back the dispositions it started with; the ranks
    take the launcher's at each launch instead (an in-process caller may launch with SIGINT ignored, then not)."""
    import signal

    spawn_ranks(_probe, 2, str(tmp_path / "a"))  # the server exists from here on, with whatever SIGINT was then
    saved = signal.getsignal(signal.SIGINT)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
    try:
        for ignored, folder in ((True, "ign"), (False, "handled"), (True, "ign-again")):
            signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else signal.default_int_handler)
            launch.run_ranks(launch._with_rank, _signal_probe, str(tmp_path / folder), world=2)
            assert _seen(tmp_path / folder) == [{"int_ignored": ignored, "term_default": True}] * 2, folder
            # torch's agent installed its handlers for the launch; the launcher took them back after it
            assert signal.getsignal(signal.SIGINT) is (signal.SIG_IGN if ignored else signal.default_int_handler)
            assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    finally:
        signal.signal(signal.SIGINT, saved)


def test_train_starts_its_ranks_server_before_importing_torch_and_ends_it_on_a_bad_flag():
    """`train` starts the server its ranks fork from before it imports torch itself, so the two imports run side by
    side; stopped by a bad flag (exit 2) before any launch, it ends the server with it, which would otherwise finish
    its imports behind the command's exit while holding the command's output open."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from shardwise import fork_server\n"
        "from shardwise.cli import main\n"
        "seen, env = [], fork_server._launch_env\n"
        "fork_server._launch_env = lambda world: (seen.append(('torch' in sys.modules, world)), env(world))[1]\n"
        "code = main(['train', '--model', 'tiny', '--dp', '2', '--tp', '2', '--steps', '0'])\n"
        "import multiprocessing.forkserver, os, time\n"
        "server = multiprocessing.forkserver._forkserver._forkserver_pid\n"
        "for _ in range(50):  # killed, it is a zombie of this process until reaped\n"
        "    if os.waitpid(server, os.WNOHANG)[0] == server: break\n"
        "    time.sleep(0.1)\n"
        "else: server = 'still running'\n"
        "print(code, seen, fork_server.started(), server != 'still running')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "2 [(False, 4)] False True", out.stderr
    assert "--steps must be at least 1" in out.stderr


def test_a_command_stopped_before_its_launch_ends_the_server_it_started_early():
    import pytest

    from shardwise.errors import UsageError

    earlier = multiprocessing_server_pid() if fork_server.started() else None
    if earlier:  # one a test before started: gone before this test starts its own
        fork_server.stop()
        _wait_gone(earlier)
    with pytest.raises(UsageError):
        with fork_server.early(2):
            server = multiprocessing_server_pid()
            assert _running(server) and server != earlier
            raise UsageError("a bad flag")
    _wait_gone(server)
    assert not fork_server.started()
    with fork_server.early(1):  # one rank runs in this process: no server
        assert not fork_server.started()


def multiprocessing_server_pid() -> int:
    import multiprocessing.forkserver

    return multiprocessing.forkserver._forkserver._forkserver_pid


def _wait_gone(pid: int) -> None:
    import time

    for _ in range(50):  # a killed process takes a moment to end
        if not _running(pid):
            return
        time.sleep(0.1)
    raise AssertionError(f"process {pid} still runs")


def test_asked_ranks_are_read_from_the_flags_over_the_plan_file(tmp_path):
    from argparse import Namespace

    from shardwise.commands.train import _ranks_asked

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"best": {"dp": 2, "tp": 2, "pp": 2, "cp": 1}}))
    flags = dict(dp=None, tp=None, pp=None, cp=None, plan=None)
    assert _ranks_asked(Namespace(**flags)) == 1
    assert _ranks_asked(Namespace(**{**flags, "tp": 2, "cp": 2})) == 4
    assert _ranks_asked(Namespace(**{**flags, "plan": str(plan)})) == 8
    assert _ranks_asked(Namespace(**{**flags, "plan": str(plan), "pp": 1})) == 4  # a contradiction, said later
    assert _ranks_asked(Namespace(**{**flags, "plan": str(tmp_path / "missing.json"), "dp": 4})) == 1
    assert _ranks_asked(Namespace(**{**flags, "dp": -2})) == 0


def _env_probe(rank, world, out):
    import torch

    Path(out).mkdir(exist_ok=True)
    Path(out, f"{rank}.json").write_text(json.dumps({"omp": os.environ.get("OMP_NUM_THREADS"),
                                                     "log": os.environ.get("TORCH_CPP_LOG_LEVEL"),
                                                     "threads": torch.get_num_threads()}))


def test_a_server_started_early_leaves_this_process_environment_and_ranks_get_the_launchs(tmp_path, monkeypatch):
    """The launcher's own torch is imported after the early start: its threads and logs stay as the user's
    environment sets them; the ranks get one thread per core share and quiet C++ logs, as from a server started at
    the launch."""
    earlier = multiprocessing_server_pid() if fork_server.started() else None
    if earlier:
        fork_server.stop()
        _wait_gone(earlier)
    for key in ("OMP_NUM_THREADS", "TORCH_CPP_LOG_LEVEL"):
        monkeypatch.setenv(key, "recorded, to be put back")
        monkeypatch.delenv(key)
    with fork_server.early(2):
        assert fork_server.started()
        assert "OMP_NUM_THREADS" not in os.environ and "TORCH_CPP_LOG_LEVEL" not in os.environ
        launch.run_ranks(launch._with_rank, _env_probe, str(tmp_path), world=2)
    share = max(1, (os.cpu_count() or 1) // 2)
    seen = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    assert seen == [{"omp": str(share), "log": "FATAL", "threads": share}] * 2
