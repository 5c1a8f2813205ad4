"""The `shardwise` command: one thin layer over the library.

Each sub-command lives in `shardwise/commands/<name>.py` and exposes
`register(subparsers, name, help)` (which adds its parser and sets `func`);
it must not import torch at module level, so that
`plan` and `estimate` answer in well under a second.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import re
import sys

from shardwise.errors import UsageError

# name -> one-line help; the module is shardwise.commands.<name> ('-' -> '_').
COMMANDS = {
    "demo": "plan a 65B Llama on 64 A100s, then measure this machine, plan a tiny Llama on 4 CPU processes and "
            "really train the planner's pick",
    "plan": "rank every dp x tp x pp x cp (x ep) layout for a model on a cluster and explain the winner",
    "estimate": "predict memory and step time of one layout",
    "explain": "the planner's decision in plain words, with numbers",
    "report": "write one self-contained HTML page: the ranked layouts, their memory and time, the winner's pipeline, a validate run",
    "simulate": "simulate a pipeline schedule: makespan, bubble, activations in flight, timeline picture",
    "train": "train a model with a dp x tp x pp x cp (x ep) layout on torch.distributed",
    "checkpoint": "inspect a training checkpoint, or export its model (one safetensors file, or a Hugging Face folder)",
    "calibrate": "measure this machine (matmul, memory, collectives by size) and write a cluster profile",
    "validate": "train a sweep of real layouts briefly and compare the planner's predictions with the measurements",
}


# Commands that only plan: at exit their process holds nothing but the planner's caches (tens of thousands of
# objects after a whole-space search), which it leaves at once rather than freeing them one by one (0.1 s of a 1 s plan).
PLANNER_COMMANDS = {"plan", "estimate", "explain"}


class Parser(argparse.ArgumentParser):
    """argparse, except that a bad flag is one line (the problem, and where the flags are listed), exit 2."""

    chosen: str | None = None  # the command named on the line (the top parser reports a subcommand's unknown flags)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # A value that starts with a minus and a digit is a value, as argparse already reads -1 and -.5: also -1,2 and
        # -1K, so `--tp -1,2` and `--sizes -1K` reach the product's own range checks instead of "expected one argument";
        # and -inf / -nan, which Python's float() reads, so `--lr -inf` reaches the check that says "finite".
        self._negative_number_matcher = re.compile(r"^-(\.?\d|inf(inity)?$|nan$)", re.IGNORECASE)

    def error(self, message: str):
        where = f"{self.prog} {self.chosen}" if self.chosen in COMMANDS else self.prog
        self.exit(2, f"{_one_line(f'shardwise: error: {message}')} — see `{where} --help`\n")


def _version() -> str:
    """The installed package's version (the source tree's, run without installing: unknown)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shardwise")
    except PackageNotFoundError:
        return "(not installed)"


class _VersionAction(argparse.Action):
    """--version, looked up only when asked: reading the installed package's metadata takes 30-60 ms, a tenth of a
    `plan --json` answer's start."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0,
                         help=help or "show program's version number and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        # as argparse's own version action writes it: on stdout, a write that fails (a reader gone, a full disk) left
        # unsaid rather than a traceback
        parser._print_message(f"shardwise {_version()}\n", sys.stdout)
        parser.exit()


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """Only the chosen command's module is imported, so each command starts fast."""
    parser = Parser(
        prog="shardwise",
        description=("Where to split a training job (data, tensor, pipeline, context or expert parallel), how to run "
                     "it, and proof it is right."),
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser.chosen = chosen
    for name, text in COMMANDS.items():
        if name == chosen:
            importlib.import_module(f"shardwise.commands.{name.replace('-', '_')}").register(sub, name, text)
        else:
            sub.add_parser(name, help=text)
    return parser


# Flags whose own checks say what an empty value means for them
EMPTY_SAID = {"--layouts", "--framework"}


def _empty_value(argv: list[str]) -> str | None:
    """The first flag given an empty value ('--checkpoint-dir ""', '--out='), as a script's unset variable gives it:
    argparse takes it, and an empty path or size then reads as unset or as the working folder, silently."""
    for i, token in enumerate(argv):
        flag, eq, value = token.partition("=")
        if flag.startswith("--") and eq and not value and flag not in EMPTY_SAID:
            return flag
        if token == "" and i and argv[i - 1].startswith("--") and "=" not in argv[i - 1] \
                and argv[i - 1] not in EMPTY_SAID:
            return argv[i - 1]
    return None


def main(argv: list[str] | None = None) -> int:
    from_shell = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    if from_shell:
        from shardwise.console import prepare_streams

        prepare_streams()
    empty = _empty_value(argv)
    if empty:
        _say(f"shardwise: error: {empty} is given an empty value — give one, or leave {empty} out for its default")
        return 2
    try:
        args = build_parser(argv).parse_args(argv)
    except SystemExit as exc:  # --help, or a bad flag (already reported in one line)
        return exc.code if isinstance(exc.code, int) else 2
    except KeyboardInterrupt:  # Ctrl-C while the command's modules load, before its handlers (below) are in place
        return _interrupted_early(argv)
    from shardwise.interrupt import cli_handlers, interrupt_behind

    if from_shell and not sys.stdout.isatty():  # piped (`| tee log`): each line as it is written, not at exit
        sys.stdout.reconfigure(line_buffering=True)
    restore = cli_handlers()
    try:
        code = args.func(args)
    except UsageError as exc:
        _say(f"shardwise: error: {exc}")
        code = exc.exit_code
    except BrokenPipeError:  # the reader went away (`| head`): not an error of ours
        sys.stderr.close()
        return 0
    except OSError as exc:  # the output could not be written (a full disk: `> /dev/full`); any other OSError says itself
        if getattr(sys.stdout, "failed", None) is exc:
            _say(f"shardwise: error: cannot write the output: {os.strerror(exc.errno)} — write it somewhere with room")
            return 1
        if isinstance(exc, PermissionError) and exc.filename:  # an input this user may not read (a model, data file)
            _say(f"shardwise: error: {exc.filename}: {exc.strerror} — this user cannot open it; change its permissions "
                 f"or give another path")
            return 2
        if exc.errno == errno.ENAMETOOLONG and exc.filename:  # a path given on the command line (checked before launch)
            path = str(exc.filename)
            name = max(path.split(os.sep), key=len).encode()
            what = (f"a name in this path is {len(name):,} bytes, more than the file system takes (255)" if len(name) > 255
                    else f"this path is {len(path.encode()):,} bytes, more than the system takes ({os.pathconf('/', 'PC_PATH_MAX'):,})")
            _say(f"shardwise: error: {path[:60]}...: {what} — give a shorter path")
            return 2
        raise
    except BaseException as exc:  # Ctrl-C, or SIGTERM (Interrupted): every process was stopped
        stop = interrupt_behind(exc)
        if stop is None:
            raise
        _report_stop(args, stop)
        if from_shell:  # torch's teardown takes seconds
            exit_now(stop.exit_code)
        return stop.exit_code
    finally:
        if not from_shell:
            restore()
    code = int(code or 0)
    if from_shell and args.command in PLANNER_COMMANDS:
        exit_now(code)
    return code


def _interrupted_early(argv: list[str]) -> int:
    """Ctrl-C before the command started: said as one later is, exit 130."""
    import signal
    from argparse import Namespace

    from shardwise.interrupt import Interrupted

    stop = Interrupted(signal.SIGINT)
    _report_stop(Namespace(json="--json" in argv), stop)
    return stop.exit_code


def _report_stop(args, stop) -> None:
    """An interrupted command's one line on stderr, and under --json its JSON object on stdout."""
    from shardwise.commands.common import print_failure_json

    _say(f"shardwise: {stop} — stopped")
    print_failure_json(args, f"{stop} — stopped", stop.exit_code)


def _one_line(text: str) -> str:
    """`text` on one line: a line break inside a value the user gave (a path, a flag's value) shown escaped."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def _say(line: str) -> None:
    """One line on stderr, if stderr can take it (the exit code says the rest)."""
    try:
        print(_one_line(line), file=sys.stderr)
    except OSError:
        pass


def exit_now(code: int) -> None:
    """What Python runs at exit (atexit's functions, the flushes), then out at once, without freeing each object."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # the reader went away, the disk is full, or the stream was closed
            pass
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
