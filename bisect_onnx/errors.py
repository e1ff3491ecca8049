"""The errors bisect-onnx raises on purpose.

Every message says what went wrong, why, and what to do next, in one line, because
the CLI prints it as is (no traceback) and exits with the error's ``exit_code``.
Anything else that escapes is a bug in bisect-onnx and keeps its traceback.
"""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Iterable

__all__ = [
    "BisectOnnxError",
    "BisectOnnxWarning",
    "UsageError",
    "InputError",
    "ModelError",
    "RuntimeRefused",
    "ParityError",
    "one_line",
    "issue_warnings",
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


class RuntimeRefused(ModelError):
    """The runtime refused to run the model on these inputs, at the node it names.

    ONNX Runtime names the node it stopped at ("Non-zero status code returned while
    running Reshape node. Name:'/Reshape'"); :attr:`node` and :attr:`op_type` hold it
    (``None`` where it names none). The PyTorch pipeline adds the node's module and
    source line, and, where the export baked a shape in, what its check found
    (:attr:`baked`, a :class:`~bisect_onnx.search.baked_shapes.BakedShapes`); where a
    sweep found the refused combination, its table (:attr:`sweep`, a
    :class:`~bisect_onnx.judge.sweep_table.SweepTable`, which the command prints).
    """

    def __init__(self, message: str, *, node: str | None = None, op_type: str | None = None,
                 reason: str = "", module: str | None = None, source: object = None,
                 baked: object = None, sweep: object = None) -> None:
        super().__init__(message)
        self.node = node
        self.op_type = op_type
        self.reason = reason
        """The runtime's own words, one line."""
        self.module = module
        """The module path around the node (``""``: the model's own forward)."""
        self.source = source
        """The node's line in the model (a ``SourceLocation``), where known."""
        self.baked = baked
        self.sweep = sweep


class ParityError(AssertionError):
    """A parity check failed; the message holds the verdict and the rows around the culprit.

    An ``AssertionError``, so pytest and unittest report it as a test failure, not an
    error. The whole bisection report is on ``.report``.
    """

    def __init__(self, message: str, report: object) -> None:
        super().__init__(message)
        self.report = report


class BisectOnnxWarning(UserWarning):
    """A caution about a report (a model left in training mode, say), as a Python warning.

    Every warning of a report (``Report.warnings``) is also issued through
    :mod:`warnings` with this category, so notebooks and pytest show it where the
    user called bisect-onnx, and ``warnings.filterwarnings(..., category=...)`` selects
    it; ``code`` is the report warning's stable code (``None`` where it has none).
    """

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


def issue_warnings(texts: Iterable[str]) -> None:
    """Issue each report warning as a :class:`BisectOnnxWarning`, at the caller's line.

    Not under the command line, which prints a report's warnings itself.
    """
    level = _outside_the_package()
    if level is None:
        return
    for text in texts:
        warnings.warn(BisectOnnxWarning(str(text), getattr(text, "code", None)),
                      stacklevel=level + 1)


def _outside_the_package() -> int | None:
    """How many frames above the caller the user's call is; ``None`` under the CLI.

    The user's call is the innermost frame that is not bisect-onnx's.
    """
    frame, level = sys._getframe(2), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("bisect_onnx"):
        if frame.f_globals["__name__"].startswith("bisect_onnx.cli"):
            return None
        frame, level = frame.f_back, level + 1
    return level


def one_line(error: BaseException) -> str:
    """An exception's reason as one readable line: first non-empty line, colours removed."""
    text = _ANSI.sub("", str(error))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    reason = lines[0] if lines else type(error).__name__
    return reason[:_MAX_REASON] + ("…" if len(reason) > _MAX_REASON else "")
