"""Other libraries' chatter during bisect-onnx's calls into them, kept in its log.

The exporters and their optimizers print, log and warn as they work: the dynamo
exporter's progress lines, onnxscript's rewrite counts, TracerWarnings, deprecation
notices and, with torch 2.13, the TorchScript exporter's whole graph, which its C++
code writes straight to the process's stderr when one of its passes fails. None of it
is a verdict (a failure that matters reaches bisect-onnx as an exception), so inside
:func:`chatter_logged` it goes to bisect-onnx's log, never to the terminal: one line
each at INFO (the command line's ``-v``), the whole text at DEBUG (``-vv``).

Only for the duration of the call: outside it, a program using the library sees its
own warnings and prints as ever. The command line, whose whole process is bisect-onnx's,
also logs every warning shown during its run (:func:`warnings_logged`). ONNX Runtime's
C++ logs are kept off by the severity each session is made with, not here.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence

__all__ = ["chatter_logged", "warnings_logged"]

logger = logging.getLogger(__name__)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Enough of a printed line to recognise it in the -v log; the whole text is at -vv.
_MAX_SHOWN = 200


@contextlib.contextmanager
def chatter_logged(source: str, *, loggers: Sequence[str] = (),
                   native: bool = False,
                   kept: list[warnings.WarningMessage] | None = None) -> Iterator[None]:
    """Log what ``source`` (``"the dynamo exporter"``) prints and warns in the block.

    ``loggers`` are the library's own loggers, raised to CRITICAL in the block: they
    log (and print tracebacks of) problems they recover from, into whatever handler a
    program has set. ``native``: also take what compiled code writes to the process's
    stdout and stderr descriptors (C++ ``std::cerr``), which Python's redirection of
    ``sys.stdout`` cannot see. ``kept``: a list the block's warnings are also added to,
    for a caller that reads them (the tracer's warnings name the lines it baked in).
    """
    quieted = [logging.getLogger(name) for name in loggers]
    levels = [each.level for each in quieted]
    for each in quieted:
        each.setLevel(logging.CRITICAL)
    printed, printed_natively = io.StringIO(), io.StringIO()
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught, \
                _native_output(native, into=printed_natively), \
                contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            warnings.simplefilter("always")
            yield
    finally:
        for each, level in zip(quieted, levels, strict=True):
            each.setLevel(level)
        _log_warnings(source, caught)
        if kept is not None:
            kept.extend(caught)
        _log_printed(source, printed.getvalue() + printed_natively.getvalue())


@contextlib.contextmanager
def warnings_logged() -> Iterator[None]:
    """Log every Python warning shown in the block instead of writing it to stderr.

    The filters stay as they are (``python -W error`` still raises, libraries'
    DeprecationWarnings stay hidden); only where a shown warning goes changes.
    """
    with warnings.catch_warnings():
        warnings.showwarning = _log_warning
        yield


def _log_warning(message: Warning | str, category: type[Warning], filename: str,
                 lineno: int, file: object = None, line: str | None = None) -> None:
    logger.info("warning at %s:%d: %s: %s", filename, lineno, category.__name__, message)


def _log_warnings(source: str, caught: Sequence[warnings.WarningMessage]) -> None:
    """Each distinct warning once (a tracer repeats its warning for every op)."""
    seen = set()
    for warning in caught:
        key = (warning.category.__name__, str(warning.message))
        if key not in seen:
            seen.add(key)
            logger.info("%s warned: %s: %s", source, *key)


def _log_printed(source: str, text: str) -> None:
    lines = [line for line in _ANSI.sub("", text).splitlines() if line.strip()]
    if not lines:
        return
    first = lines[0].strip()
    first = first[:_MAX_SHOWN] + ("…" if len(first) > _MAX_SHOWN else "")
    more = f" (and {len(lines) - 1} more lines, shown at -vv)" if len(lines) > 1 else ""
    logger.info("%s printed: %s%s", source, first, more)
    logger.debug("%s printed, in full:\n%s", source, "\n".join(lines))


@contextlib.contextmanager
def _native_output(enabled: bool, *, into: io.StringIO) -> Iterator[None]:
    """Point the stdout and stderr descriptors at a temporary file in the block.

    Its text is written ``into`` once the block is over. Where a descriptor cannot be
    redirected (a process started without one), nothing is taken.
    """
    if not enabled:
        yield
        return
    with tempfile.TemporaryFile() as captured:
        saved = _redirect_descriptors(captured.fileno())
        try:
            yield
        finally:
            _flush_streams()
            for descriptor, copy in saved.items():
                os.dup2(copy, descriptor)
                os.close(copy)
            captured.seek(0)
            into.write(captured.read().decode(errors="replace"))


def _redirect_descriptors(target: int) -> dict[int, int]:
    """Point descriptors 1 and 2 at ``target``; a copy of each one's previous target."""
    _flush_streams()  # what was written before the block stays where it was going
    saved: dict[int, int] = {}
    try:
        for descriptor in (1, 2):
            copy = os.dup(descriptor)
            saved[descriptor] = copy
            os.dup2(target, descriptor)
    except OSError:
        for descriptor, copy in saved.items():
            os.dup2(copy, descriptor)
            os.close(copy)
        return {}
    return saved


def _flush_streams() -> None:
    """Flush Python's and C's buffered output, so each goes where it was written."""
    for stream in (sys.__stdout__, sys.__stderr__, sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()
    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(None).fflush(None)  # C stdio, where C++'s std::cout writes
