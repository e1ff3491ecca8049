"""The words a report is made of: verdicts, statuses, granularities, warning codes.

Each is a string enum, so a report compares, prints and serializes as the plain
strings of the JSON schema (``record.figures.status == "fail"`` holds), while the code that
makes and reads reports names them instead of spelling them.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Verdict", "Status", "Granularity", "ReportWarning"]


class _Word(str, Enum):
    """A string enum that prints as its value (``str.__format__``, not ``Enum``'s)."""

    __str__ = str.__str__
    __format__ = str.__format__


class Verdict(_Word):
    """What the final outputs say."""

    PARITY = "parity"
    DIVERGED = "diverged"


class Status(_Word):
    """The outcome of one comparison (the JSON ``status`` field)."""

    PASS = "pass"
    FAIL = "fail"
    SHAPE_MISMATCH = "shape_mismatch"
    DTYPE_MISMATCH = "dtype_mismatch"
    NAN_MISMATCH = "nan_mismatch"


class Granularity(_Word):
    """What one table row stands for."""

    OP = "op"
    """An ATen op's value (the dynamo exporter's program names the ONNX values)."""
    MODULE = "module"
    """A module call's output."""
    VALUE = "value"
    """An ONNX value of the reference model (ONNX against ONNX)."""


class ReportWarning(str):
    """A warning's text, with a stable code to filter or test it by.

    It is the text for everything that reads warnings as strings (the CLI, the JSON
    report); code that drops or looks for a warning goes by ``code``, never by text.
    """

    code: str

    def __new__(cls, code: str, text: str) -> ReportWarning:
        """The warning ``text``, known by ``code``."""
        warning = super().__new__(cls, text)
        warning.code = code
        return warning

    def __getnewargs__(self) -> tuple[str, str]:  # copies and pickles keep the code
        return self.code, str(self)

    def format(self, *args: object, **kwargs: object) -> ReportWarning:  # type: ignore[override]
        """The warning with its placeholders filled in, keeping its code."""
        return ReportWarning(self.code, str.format(self, *args, **kwargs))
