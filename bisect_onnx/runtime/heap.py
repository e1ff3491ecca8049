"""A large model's ONNX Runtime sessions made in the heap, and what they free kept for reuse.

glibc serves an allocation over its mmap threshold (32 MiB at most) with a map of its
own, and unmaps it when it is freed. Making a session, ONNX Runtime copies each
initializer into a fresh buffer to write the optimized graph: for a 12 GB model, 12 GB
of pages faulted in, zeroed and given back, one buffer after another. And the memory a
released session frees goes back to the system just before the weights parked on disk
are read back into fresh memory of the same size. On a virtual machine that hands
freed memory back to its host, every such first touch costs more than the copy.

Made in the heap, each buffer reuses the pages the last one freed, and the weights read
back reuse the pages the released session freed: on a 3-billion-parameter decoder the
graph-only session took 3.5 s instead of 12 s, and 11 GB read back into reused pages
were touched in 0.5 s instead of 14 s. Nothing more is held; free pages are only not
given back until the run ends (:func:`give_back`), which raised a 1-billion-parameter
decoder's peak by about 7% (5.2 GB against 4.9 GB, for 3.9 GB of weights). Against
another ONNX model, where nothing is read back, a large model's sessions are made in the
heap all the same: that decoder, level disabled against all, took 32-35 s instead of
40-44 s, at the same peak.

glibc only (Linux); nothing is changed where the caller set glibc's malloc options
itself (``MALLOC_*`` variables, ``GLIBC_TUNABLES``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import sys
from collections.abc import Iterator
from functools import cache

__all__ = ["kept_in_heap", "made_in_heap", "give_back"]

logger = logging.getLogger(__name__)

# mallopt's parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
# glibc's own default for how many allocations it maps at once.
_DEFAULT_MMAP_MAX = 65536
# Setting any option stops glibc moving its thresholds with the sizes freed; they are
# left where that movement ends on a 64-bit machine, which a process freeing a large
# tensor reaches at once: maps from 32 MiB, the heap's top given back past 64 MiB.
_MMAP_THRESHOLD = 32 << 20
_TRIM_THRESHOLD = 2 * _MMAP_THRESHOLD
# While kept: the heap's top is never given back (mallopt's documented -1), so freed
# pages wait for reuse.
_NEVER = -1

_keeping = False  # inside kept_in_heap
_kept = False  # kept since, not given back yet


@cache
def _glibc() -> ctypes.CDLL | None:
    """The C library's malloc, where it is glibc and the caller left its options alone."""
    if not sys.platform.startswith("linux") or any(
            name.startswith("MALLOC_") for name in os.environ) or (
            "malloc" in os.environ.get("GLIBC_TUNABLES", "")):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - musl and others lack it
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def kept_in_heap(active: bool = True) -> Iterator[None]:
    """Sessions made inside are made in the heap; what the heap frees stays until :func:`give_back`.

    ``active``: only for a large model (a small one's buffers cost little to map).
    """
    global _keeping, _kept
    libc = _glibc() if active else None
    if libc is None:
        yield
        return
    libc.mallopt(_M_TRIM_THRESHOLD, _NEVER)
    _keeping = _kept = True
    try:
        yield
    finally:
        _keeping = False


@contextlib.contextmanager
def made_in_heap() -> Iterator[None]:
    """Inside :func:`kept_in_heap`, no allocation gets a map of its own (a session's making).

    What the making freed (the buffers it wrote its optimized graph through) is given
    back at the end: the session's run allocates other sizes, which would come on top
    (a 1-billion-parameter decoder's peak was 5.3 GB kept, 5.2 GB given back). What
    stays kept is what the session frees when it is released, for the weights read back.
    """
    libc = _glibc() if _keeping else None
    if libc is None:
        yield
        return
    libc.mallopt(_M_MMAP_MAX, 0)
    try:
        yield
    finally:
        libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
        libc.malloc_trim(0)


def give_back() -> None:
    """Return to the system the free memory the heap kept since :func:`kept_in_heap`."""
    global _kept
    if not _kept:  # (before looking for the C library, which a small run never does)
        return
    libc = _glibc()
    if libc is None:
        return
    _kept = False
    libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    libc.malloc_trim(0)
    logger.debug("free heap memory given back to the system")
