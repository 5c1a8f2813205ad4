"""The one error type users see: a one-line message naming the problem and the fix.

The CLI turns it into `shardwise: error: <message>` and exit code 2, with no traceback.
Raise it at the edge (spec loading, layout validation) before any process group starts.
"""


class UsageError(ValueError):
    """Bad input from the user: an unknown preset, an impossible layout, a malformed file."""

    exit_code = 2


class InputError(UsageError):
    """Bad input whatever stack runs it: a value out of range, degrees that do not divide the GPUs, the model's heads
    or its experts. Under the default stack's fallback (commands/common.py under_framework) it is said plainly, as
    either stack meets it, where another refusal names both stacks' reasons."""


class DoesNotFit(UsageError):
    """`estimate` under the default stack (no --framework): the layout does not fit its memory, so the fallback stack
    is tried (commands/common.py under_framework); never reaches the user as an error."""


class JobFailed(RuntimeError):
    """A running job failed: a rank died or hung, or training diverged; the message names it (one line), `details`
    has the tracebacks. The CLI prints it as `shardwise: error: <message>`, exit code 1."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details
