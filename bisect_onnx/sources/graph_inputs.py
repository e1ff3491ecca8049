"""Inputs checked against the ONNX graph's inputs: count, dtype, rank, fixed dimensions.

Arrays are checked before any model runs on them. Where the graph is known before
the input files are read (``--onnx``, or MODEL an ``.onnx``), their ``.npy`` headers
are checked first: a compressed member of the wrong shape may inflate to gigabytes
before the arrays' check could refuse it.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.errors import InputError
from bisect_onnx.pytorch.module_side import describe_arrays
from bisect_onnx.sources.input_sizes import npz_members

if TYPE_CHECKING:
    from bisect_onnx.runtime.input_specs import InputSpec

__all__ = ["POSITIONAL_KEY", "check_against_onnx", "check_count", "check_header",
           "check_npz_members"]

#: How ``numpy.savez`` names positional arrays: ``arr_0``, ``arr_1``...
POSITIONAL_KEY = re.compile(r"arr_(\d+)")


def check_against_onnx(inputs: Sequence[np.ndarray], specs: Sequence[InputSpec]) -> None:
    """Refuse inputs whose count, dtype, rank or fixed dimensions differ from the graph's."""
    if len(inputs) != len(specs):
        raise InputError(f"got {len(inputs)} input(s) ({describe_arrays(inputs)}) but the ONNX "
                         f"graph takes {len(specs)}: {_graph_takes(specs)}")
    for position, (array, spec) in enumerate(zip(inputs, specs, strict=True)):
        problem = _spec_mismatch(array.shape, array.dtype, spec)
        if problem:
            raise InputError(f"input {position} ({spec.name}) has shape "
                             f"{list(array.shape)} and {problem}; the ONNX graph takes: "
                             f"{_graph_takes(specs)}")


def _spec_mismatch(shape: tuple[int, ...], dtype: np.dtype, spec: InputSpec) -> str | None:
    """How an array of this shape and dtype differs from the graph input ``spec``, if it does."""
    # Byte order is not a difference: the inputs are made native before they are compared.
    if np.dtype(dtype).newbyteorder("=") != spec.dtype:
        return f"dtype {dtype}, expected {spec.dtype} (convert with .astype)"
    if spec.shape is not None and len(shape) != len(spec.shape):
        return f"rank {len(shape)}, expected {len(spec.shape)}"
    for axis, (have, want) in enumerate(zip(shape, spec.shape or (), strict=False)):
        if isinstance(want, int) and have != want:
            return f"dimension {axis} is {have}, expected {want}"
    return None


def _graph_takes(specs: Sequence[InputSpec]) -> str:
    return "; ".join(str(spec) for spec in specs)


def check_count(count: int, what: str, specs: Sequence[InputSpec]) -> None:
    """Refuse a count of inputs (``what`` says of which kind) other than the graph's."""
    if count != len(specs):
        raise InputError(f"got {count} input {what} but the ONNX graph takes {len(specs)}: "
                         f"{_graph_takes(specs)}; pass one input per graph input")


def check_header(where: str, position: int, shape: tuple[int, ...], dtype: np.dtype,
                 specs: Sequence[InputSpec]) -> None:
    """Refuse, from its header, an array that cannot be graph input ``position``."""
    spec = specs[position]
    problem = _spec_mismatch(shape, dtype, spec)
    if problem:
        raise InputError(f"{where} (input {position}, {spec.name}) has shape {list(shape)} and "
                         f"{problem}; the ONNX graph takes: {_graph_takes(specs)}")


def check_npz_members(path: Path, specs: Sequence[InputSpec]) -> None:
    """Refuse an archive whose members cannot be the graph's inputs, from their headers.

    Its data is not read: a member of the wrong shape may inflate to gigabytes. Each
    member is matched to a graph input where its key says which (``arr_<k>``, or the
    input's name); keys naming ``forward``'s parameters are matched once the model
    is known, after loading.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
        members = list(npz_members(path))
    except (zipfile.BadZipFile, OSError, EOFError):
        return  # a corrupt archive: loading it says so
    if len(members) != len(names):
        return  # a member that is no readable .npy: loading it gives the precise error
    check_count(len(members), f"array(s) in {path} ({', '.join(k for k, _, _ in members)})",
                specs)
    positions = _graph_positions([key for key, _, _ in members], specs)
    for (key, shape, dtype), position in zip(members, positions or [], strict=False):
        check_header(f"entry {key!r} of {path}", position, shape, dtype, specs)


def _graph_positions(keys: Sequence[str], specs: Sequence[InputSpec]) -> list[int] | None:
    """The graph input each key stands for, where the keys alone tell (else ``None``)."""
    if all(POSITIONAL_KEY.fullmatch(key) for key in keys):
        positions = [int(key[4:]) for key in keys]
        return positions if sorted(positions) == list(range(len(specs))) else None
    by_name = {spec.name: position for position, spec in enumerate(specs)}
    return [by_name[key] for key in keys] if set(keys) <= set(by_name) else None
