"""The interface both sides of a comparison implement.

A *reference* side (a PyTorch model today) and a *candidate* side (an ONNX model in
ONNX Runtime today) each run on the same inputs and hand back named values with
their provenance. A reference side only has to implement :class:`Side`; a
candidate side (the runtime under test) also offers what the pipeline reads off it
(production's outputs, the capture's check, its own sessions): docs/runtimes.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from bisect_onnx.graph.provenance import Provenance

__all__ = ["CapturedValue", "Capture", "Side"]


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


@runtime_checkable
class Side(Protocol):
    """One side of a comparison."""

    def describe(self) -> dict[str, Any]:
        """What this side is, for the report (kind, model, settings)."""
        ...

    def run(self, inputs: Sequence[np.ndarray], *, keywords: Sequence[str] = ()) -> Capture:
        """Run on ``inputs`` and capture every value this side can see.

        The last ``len(keywords)`` inputs go by keyword, under those names.
        """
        ...
