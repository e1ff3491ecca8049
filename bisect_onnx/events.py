"""Public events: what the library is doing, for progress displays and for tests.

The library logs for people; it *emits* for programs. A listener receives an
:class:`Event` each time a step starts or a session is made, so a test can say "a
passing parity check builds one ONNX Runtime session and never bisects" without
counting hidden internals::

    seen = []
    with bisect_onnx.events.listening(seen.append):
        bisect_onnx.assert_parity(model, inputs)
    assert [e.kind for e in seen].count("session_created") == 1
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["Event", "listening", "emit", "EXPORT_STARTED", "CAPTURE_STARTED",
           "SESSION_STARTED", "SESSION_CREATED", "BISECTION_STARTED", "PARITY_CHECKED"]

EXPORT_STARTED = "export_started"
CAPTURE_STARTED = "capture_started"
"""Detail: which side (``pytorch`` or ``onnxruntime``) starts recording its values."""
SESSION_STARTED = "session_started"
SESSION_CREATED = "session_created"
BISECTION_STARTED = "bisection_started"
PARITY_CHECKED = "parity_checked"


@dataclass(frozen=True)
class Event:
    """One thing the library did: its kind (a constant of this module) and a detail."""

    kind: str
    detail: str = ""


_listeners: list[Callable[[Event], None]] = []


@contextlib.contextmanager
def listening(callback: Callable[[Event], None]) -> Iterator[None]:
    """Call ``callback`` with every event emitted inside the ``with`` block."""
    _listeners.append(callback)
    try:
        yield
    finally:
        _listeners.remove(callback)


def emit(kind: str, detail: str = "") -> None:
    """Tell every listener (none, usually: then this costs nothing)."""
    if _listeners:
        event = Event(kind, detail)
        for callback in list(_listeners):
            callback(event)
