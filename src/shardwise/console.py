"""The terminal: rich's Console, with two things made the command line's own.

- A reader that went away (`shardwise plan ... | head`) ends the command quietly with exit 0, as `--json` output
  does: rich's default exits 1 (Console.on_broken_pipe), which a script under `set -o pipefail` reads as a failure.
- Streams that cannot take the table's characters (·, —, µ) under an ASCII or Latin-1 locale, a closed stdout, a
  terminal width of 0: `prepare_streams` (called once by cli.main) makes each one line or nothing, never a traceback.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console as _RichConsole

# Below this many columns a table is unreadable (a width of 0 prints nothing, 1 a column of characters): such a
# COLUMNS is ignored, and rich falls back to the terminal's width, or 80 when there is none.
MIN_COLUMNS = 40


class Console(_RichConsole):
    def on_broken_pipe(self) -> None:
        """The reader went away: write nothing more (stdout onto /dev/null, so Python's flush at exit is quiet too), and
        let cli.main end the command with exit 0."""
        self.quiet = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise BrokenPipeError


def prepare_streams() -> None:
    """For a command run from the shell: a closed stdout or stderr (`>&-`) becomes /dev/null; characters an ASCII or
    Latin-1 stream cannot encode are written as `?`; a COLUMNS below MIN_COLUMNS is dropped."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))
        stream = getattr(sys, name)
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    columns = os.environ.get("COLUMNS", "")
    if columns and not (columns.isdigit() and int(columns) >= MIN_COLUMNS):
        del os.environ["COLUMNS"]
