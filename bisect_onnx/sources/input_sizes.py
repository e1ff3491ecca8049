"""Input sizes, known before any memory is taken, checked against the memory budget.

A 2 MB ``.npz`` can inflate to 2 GiB, and ``--dim seq=1000000000`` asks for a
terabyte: numpy would try to allocate first and fail (or take the machine down)
after. The sizes are in the ``.npy`` headers of an archive's members and in the
graph's input shapes, so they are read there and refused in one line naming the
size and the budget.
"""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from tokenize import TokenError
from typing import BinaryIO

import numpy as np

from bisect_onnx.errors import InputError, UsageError
from bisect_onnx.runtime.memory import default_budget, format_size, parse_size

__all__ = ["MAX_SAMPLES", "Budget", "input_budget", "npy_header", "npz_members",
           "check_npz_size", "array_bytes", "check_sample_count"]

# Each random sample is a full comparison of both models (an ONNX Runtime run with every
# value captured, seconds on a real model): ten thousand already take hours.
MAX_SAMPLES = 10_000
# The share of the memory available that inputs may take by default, as for captures.
_DEFAULT_SOURCE = "80% of the memory available"


@dataclass(frozen=True)
class Budget:
    """Bytes the inputs may take, and where that figure came from (for the message)."""

    size: int | None
    """``None``: the memory available is unknown, so nothing is refused."""
    source: str

    def check(self, size: int, what: str, fix: str) -> None:
        """Refuse ``what`` (of ``size`` bytes) when it does not fit."""
        if self.size is not None and size > self.size:
            raise InputError(f"{what} would take {format_size(size)}, over the memory budget "
                             f"of {format_size(self.size)} ({self.source}); {fix}")


def input_budget(max_memory: int | str | None = None) -> Budget:
    """The budget: ``--max-memory`` when given, else most of the memory available now."""
    if max_memory is not None:
        return Budget(parse_size(max_memory), "--max-memory")
    return Budget(default_budget(), _DEFAULT_SOURCE)


def npy_header(handle: BinaryIO) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype a ``.npy`` stream's header describes; the data is not read."""
    version = np.lib.format.read_magic(handle)
    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
            else np.lib.format.read_array_header_2_0)
    shape, _, dtype = read(handle)
    return shape, dtype


def npz_members(path: Path) -> Iterator[tuple[str, tuple[int, ...], np.dtype]]:
    """Each ``.npy`` member of an archive: its key, shape and dtype, from its header only.

    Members whose header cannot be read are skipped: loading them gives the precise
    error.
    """
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                continue
            try:
                with archive.open(info) as member:  # decompresses the header only
                    shape, dtype = npy_header(member)
            except (ValueError, SyntaxError, TokenError, EOFError, OSError,
                    zipfile.BadZipFile, zlib.error):
                continue
            yield info.filename[:-4], shape, dtype


def check_npz_size(path: Path, budget: Budget) -> None:
    """Refuse an archive whose members, once inflated, would not fit in the budget."""
    try:
        members = list(npz_members(path))
    except (zipfile.BadZipFile, OSError, EOFError):
        return  # a corrupt archive: loading it says so
    sizes = [(key, shape, dtype, array_bytes(shape, dtype)) for key, shape, dtype in members]
    if not sizes:
        return
    key, shape, dtype, largest = max(sizes, key=lambda entry: entry[3])
    total = sum(entry[3] for entry in sizes)
    budget.check(total, f"input {path} holds {len(sizes)} array(s) that once loaded "
                 f"(the largest, {key!r}, is {dtype} {list(shape)}: {format_size(largest)})",
                 "pass smaller inputs, or a larger --max-memory if the machine has it")


def array_bytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Bytes of an array of this shape and dtype (exact, however large)."""
    count = 1
    for dim in shape:
        count *= int(dim)
    return count * np.dtype(dtype).itemsize


def check_sample_count(samples: object) -> None:
    """Refuse a ``--samples`` count that could not finish: each sample is a whole run."""
    if isinstance(samples, int) and not isinstance(samples, bool) and samples > MAX_SAMPLES:
        raise UsageError(f"--samples {samples} is over {MAX_SAMPLES}: each sample is a full "
                         "comparison of both models (seconds each), so it would run for "
                         f"days; try at most {MAX_SAMPLES}")
