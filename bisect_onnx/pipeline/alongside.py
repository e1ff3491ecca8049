"""Work done in a thread while the pipeline does something else: fewer seconds, same result.

Importing the exporter's translations reads nothing the main thread computes, and ONNX
Runtime leaves the GIL and a core idle while it makes its sessions: on two cores the
import is done by the time a divergence needs it. The block a thread accompanies joins
it when it ends, so its result, and its error, are the main thread's before anything
reads them. (Planning the capture beside PyTorch's run was measured too, and gained
nothing: the graph-only session and parking both stream the weights through memory.)
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

__all__ = ["alongside"]


@contextlib.contextmanager
def alongside(work: Callable[[], object], *, name: str, wanted: bool = True) -> Iterator[None]:
    """Run ``work`` in a thread while the block runs, if ``wanted``; join it at the end.

    An error ``work`` raised is raised when the block ends (after the block's own, if
    the block raised one).
    """
    if not wanted:
        yield
        return
    failures: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as error:  # noqa: BLE001 - handed to the main thread
            failures.append(error)

    thread = threading.Thread(target=run, name=f"bisect-onnx-{name}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()
    if failures:
        raise failures[0]
