"""Captured values, and the interface a PyTorch reference implements.

A PyTorch reference (:mod:`bisect_onnx.pytorch`) implements :class:`Side`: it runs on
the inputs and hands back named values with their provenance, a :class:`Capture`. A
runtime that runs an ONNX file is a :class:`~bisect_onnx.runtime.runner.Runner`,
whose runs return a :class:`Capture` too, with how it was checked against production.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias, runtime_checkable

import numpy as np

from bisect_onnx.graph.provenance import Provenance

__all__ = ["CapturedValue", "Capture", "SampleArrays", "Side", "Json", "JsonObject"]

#: A value as the JSON report holds it.
Json: TypeAlias = "str | int | float | bool | None | list[Json] | dict[str, Json]"
#: What a side's or a runner's ``describe()`` gives: an object of the JSON report.
JsonObject: TypeAlias = "dict[str, Json]"


@dataclass(frozen=True)
class CapturedValue:
    """One named array a side produced, and where it came from."""

    name: str
    array: np.ndarray
    provenance: Provenance


@dataclass
class Capture:
    """Everything one run of a side produced."""

    values: dict[str, CapturedValue]
    """Intermediate values by name, in the order the side produced them."""
    outputs: list[CapturedValue]
    """The model's final outputs, in order."""


@dataclass(frozen=True)
class SampleArrays:
    """One sample's arrays by the candidate's ONNX value names.

    What local checks and a repro feed the candidate's nodes, and judge against.
    """

    reference: Mapping[str, np.ndarray]
    """The reference's values (PyTorch's, or the reference model's in the candidate's
    dtypes)."""
    candidate: Mapping[str, np.ndarray]
    """What the candidate computed (captured or probed)."""
    graph_inputs: Mapping[str, np.ndarray]


@runtime_checkable
class Side(Protocol):
    """A PyTorch reference: one side of a comparison."""

    def describe(self) -> JsonObject:
        """What this side is, for the report (kind, model, settings)."""
        ...

    def run(self, inputs: Sequence[np.ndarray], *, keywords: Sequence[str] = ()) -> Capture:
        """Run on ``inputs`` and capture every value this side can see.

        The last ``len(keywords)`` inputs go by keyword, under those names.
        """
        ...
