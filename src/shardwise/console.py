"""The terminal: rich's Console, with two things made the command line's own.

- A reader that went away (`shardwise plan ... | head`) ends the command quietly with exit 0, as `--json` output
  does: rich's default exits 1 (Console.on_broken_pipe), which a script under `set -o pipefail` reads as a failure.
- Streams that cannot take the table's characters (·, —, µ) under an ASCII or Latin-1 locale, a closed stdout, a
  terminal width of 0: `prepare_streams` (called once by cli.main) makes each one line or nothing, never a traceback.
"""

from __future__ import annotations

import os
import sys
import time

_held: list[str] | None = None  # notes waiting for the command's checks (held_notes)


def note(text: str) -> None:
    """'note: <text>' on stderr, or, inside held_notes, once the command's checks have passed: a refused command is one
    line, without the notes about the layout it would have run."""
    if _held is not None:
        _held.append(text)
    else:
        print(f"note: {text}", file=sys.stderr)


class held_notes:
    """Hold note() lines while a command checks its input: said at release() (or at the end of the block), dropped
    where a check refuses it (an exception leaves the block)."""

    def __enter__(self):
        global _held
        self.outer, _held = _held, []
        return self

    def release(self) -> None:
        global _held
        held, _held = _held, self.outer
        for text in held or ():
            note(text)
        self.outer = _held

    def __exit__(self, kind, value, tb):
        global _held
        if kind is None and _held is not self.outer:
            self.release()
        _held = self.outer
        return False


# Below this many columns a table is unreadable (a width of 0 prints nothing, 1 a column of characters): such a
# COLUMNS is ignored, and rich falls back to the terminal's width, or 80 when there is none.
MIN_COLUMNS = 40


def __getattr__(name: str):
    """`Console`, made on first use: rich takes 40-60 ms to import, which a command that never draws with it (`plan
    --json`, `estimate --json`) should not pay before its answer; the streams and the search's progress line below
    need none of it."""
    if name != "Console":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()["Console"] = console = _console_class()
    return console


def _console_class() -> type:
    from rich.console import Console as RichConsole

    class Console(RichConsole):
        """rich's Console; `keep_going`: a progress display of long work (training, tokenizing), which goes quiet when
        its reader goes away and lets the work finish rather than end it."""

        def __init__(self, *args, keep_going: bool = False, **kwargs):
            super().__init__(*args, **kwargs)
            self.keep_going = keep_going

        def on_broken_pipe(self) -> None:
            """The reader went away: write nothing more (its stream onto /dev/null, so Python's flush at exit is quiet
            too), and let cli.main end the command with exit 0 — or, for a progress display, carry on."""
            self.quiet = True
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, (sys.stderr if self.stderr else sys.stdout).fileno())
            if not self.keep_going:
                raise BrokenPipeError

    Console.__module__, Console.__qualname__ = __name__, "Console"
    return Console


class WatchedStream:
    """stdout, remembering the error a write to it raised (`failed`): cli.main reports that one as the output's (a full
    disk), and lets any other OSError (a data file's, a checkpoint's) say what it is."""

    def __init__(self, stream):
        self._stream, self.failed = stream, None

    def write(self, text):
        try:
            return self._stream.write(text)
        except OSError as exc:
            self.failed = exc
            raise

    def flush(self):
        try:
            return self._stream.flush()
        except OSError as exc:
            self.failed = exc
            raise

    def __getattr__(self, name):
        return getattr(self._stream, name)


def prepare_streams() -> None:
    """For a command run from the shell: a closed stdout or stderr (`>&-`) becomes /dev/null; characters an ASCII or
    Latin-1 stream cannot encode are written as `?`; a COLUMNS below MIN_COLUMNS is dropped; stdout is watched
    (WatchedStream)."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))
        stream = getattr(sys, name)
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    sys.stdout = WatchedStream(sys.stdout)
    columns = os.environ.get("COLUMNS", "")
    if columns and not (columns.isdigit() and int(columns) >= MIN_COLUMNS):
        del os.environ["COLUMNS"]


class SearchProgress:
    """A one-line count of a search's dp x tp x pp x cp splits on stderr while it runs (planner.search's `progress`),
    where stderr is a terminal and the search has run DELAY_S already, so a quick plan draws nothing; the line is
    erased when the search ends. No thread: the search calls it between splits, and a second thread would keep the
    search in one process (forked.worker_count)."""

    DELAY_S = 0.5

    def __init__(self, stream=None, clock=time.monotonic, on: bool | None = None):
        self.stream, self.clock = stream or sys.stderr, clock
        self.start, self.drawn = clock(), False
        self.on = _foreground_terminal(self.stream) if on is None else on

    def __call__(self, taken: int, total: int) -> None:
        if self.on and self.clock() - self.start >= self.DELAY_S:
            text = f"searching: {taken} of {total} dp x tp x pp x cp splits taken"
            self._write("\r\x1b[K" + text[: max(_columns(self.stream) - 1, 0)])  # one row: a wrapped one stays drawn
            self.drawn = True

    def __enter__(self) -> "SearchProgress":
        return self

    def __exit__(self, *exc) -> None:
        if self.drawn:
            self._write("\r\x1b[K")

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except OSError:  # a terminal gone: the answer matters, not the count
            self.on = False


def _foreground_terminal(stream) -> bool:
    """Whether `stream` is a terminal that takes the line: not a pipe or file, not a dumb terminal (no erase), and this
    process in its foreground (a job in the background would draw over the prompt, or stop on SIGTTOU)."""
    try:
        if not stream.isatty() or os.environ.get("TERM") == "dumb":
            return False
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # no descriptor, or a closed one: no line
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:  # a terminal, but not this process's controlling one: no job control there to stop it
        return True


def _columns(stream) -> int:
    """The terminal's width, or 80 where it says none (a new pseudo-terminal reports 0)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (AttributeError, OSError, ValueError):
        return 80


def print_wrapped(console, text: str) -> None:
    """`text` wrapped to the console's width at word boundaries, no line ending in a space (rich's own wrapping
    leaves one at each break) and nothing in it read as markup."""
    import textwrap

    console.print(textwrap.fill(text, width=max(console.width, 20), break_long_words=False, break_on_hyphens=False),
                  highlight=False, markup=False, soft_wrap=True)


def break_after(cell: str, sep: str, room: int) -> str:
    """`cell` on lines of at most `room` characters where it can break just after `sep` (a layout's "·"), so a fold
    never splits one of its parts ("mb" above "1"); a part longer than `room` stays whole for rich to fold."""
    if len(cell) <= room or sep not in cell:
        return cell
    parts = cell.split(sep)
    lines, line = [], ""
    for piece in [p + sep for p in parts[:-1]] + parts[-1:]:  # each part with the separator it ends with
        if line and len(line) + len(piece) > room:
            lines.append(line)
            line = ""
        line += piece
    return "\n".join(lines + [line])


def fit_table(table, width: int | None, text=(), drop=(), floor: int = 6, sep: str = "") -> list[str]:
    """Fit a rich table into `width` terminal columns without splitting a number over two lines: every column but the
    `text` ones (headers or positions: a layout's name, a schedule) is kept whole (no_wrap), the text ones fold, down
    to `floor` characters each (rich would otherwise fold the numbers once the text alone cannot give the room, or
    shrink the one column that may wrap to nothing). Where even that is too wide, the `drop` columns (headers or
    positions, the first named first) are left out until it fits. Returns the headers left out, for a caption; None
    width: nothing to fit, the table as it is. With `sep` (a layout's "·"), a text cell too long for its room breaks
    after it, not inside one of its parts (break_after)."""
    if width is None:
        return []
    from dataclasses import replace
    from io import StringIO

    from rich.console import Console as RichConsole

    probe = RichConsole(file=StringIO(), width=10_000, color_system=None, legacy_windows=False)
    wide = probe.options.update_width(10_000)

    def natural(renderable) -> int:  # its width on one line
        if isinstance(renderable, str):
            renderable = probe.render_str(renderable)
        return probe.measure(renderable, options=wide).maximum

    def position(key) -> int | None:
        if isinstance(key, int):
            return key
        return next((i for i, c in enumerate(original) if str(c.header) == key), None)

    original = list(table.columns)
    texts = {position(k) for k in text} - {None}
    keep = list(range(len(original)))
    dropping = [p for p in (position(k) for k in drop) if p is not None]
    while True:
        table.columns = [replace(original[i], _index=n) for n, i in enumerate(keep)]  # _index: rich's padding
        widths = [max([natural(c.header)] + [natural(cell) for cell in c.cells]) for c in table.columns]
        frame = probe.measure(table, options=wide).maximum - sum(widths)  # borders and padding
        need = frame + sum(min(w, floor) if i in texts else w for i, w in zip(keep, widths))
        if need <= width or not dropping:
            break
        gone = dropping.pop(0)
        if gone in keep and len(keep) > 1:
            keep.remove(gone)
    for i, column in zip(keep, table.columns):
        column.no_wrap, column.overflow = (False, "fold") if i in texts else (True, column.overflow)
    if sep:  # each text column's cells broken after `sep` to the room the other columns leave it at most
        for n, (i, column) in enumerate(zip(keep, table.columns)):
            if i in texts:
                others = sum(min(w, floor) if j in texts else w for j, w in zip(keep, widths) if j != i)
                room = max(width - frame - others, floor)
                column._cells = [break_after(c, sep, room) if isinstance(c, str) else c for c in column._cells]
    return [str(original[i].header) for i in range(len(original)) if i not in keep]
