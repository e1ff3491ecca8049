"""The errors bisect-onnx raises on purpose.

Every message says what went wrong, why, and what to do next, in one line, because
the CLI prints it as is (no traceback) and exits with the error's ``exit_code``.
Anything else that escapes is a bug in bisect-onnx and keeps its traceback.
"""

from __future__ import annotations

import re

__all__ = [
    "BisectOnnxError",
    "UsageError",
    "InputError",
    "ModelError",
    "ParityError",
    "one_line",
]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Long enough for an exporter's or runtime's reason, short enough for one terminal line.
_MAX_REASON = 300


class BisectOnnxError(Exception):
    """Base of every error bisect-onnx raises for a problem the user can fix."""

    #: Process exit status the CLI uses for this error.
    exit_code: int = 2


class UsageError(BisectOnnxError):
    """The arguments do not make sense together (a bad option value, say)."""

    exit_code = 2


class InputError(BisectOnnxError):
    """A file or value the user gave cannot be used: missing, corrupt, wrong shape."""

    exit_code = 2


class ModelError(BisectOnnxError):
    """The model could not be exported or run; the exporter's or runtime's reason is kept."""

    exit_code = 3


class ParityError(AssertionError):
    """A parity check failed; the message holds the verdict and the rows around the culprit.

    An ``AssertionError``, so pytest and unittest report it as a test failure, not an
    error. The whole bisection report is on ``.report``.
    """

    def __init__(self, message: str, report: object) -> None:
        super().__init__(message)
        self.report = report


def one_line(error: BaseException) -> str:
    """An exception's reason as one readable line: first non-empty line, colours removed."""
    text = _ANSI.sub("", str(error))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    reason = lines[0] if lines else type(error).__name__
    return reason[:_MAX_REASON] + ("…" if len(reason) > _MAX_REASON else "")
