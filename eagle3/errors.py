"""Errors a user fixes by changing config or running another stage, not by reading a traceback.

The entrypoint prints their message as one line and exits non-zero; everything else is a bug
and keeps its traceback.
"""


class Eagle3Error(RuntimeError):
    """Base of the one-line, user-facing errors."""
