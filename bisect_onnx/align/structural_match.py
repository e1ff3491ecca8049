"""What structural matching returns: one record per foreign value.

:func:`bisect_onnx.align.structural.match_graphs` makes these; the module docstring
there says what each ``how`` means and how confidence ranks the evidence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = ["How", "Agree", "StructuralMatch"]

How = Literal["input", "output", "topology", "region", "values", "position", "consumer",
              "ambiguous", "unmatched"]

#: ``agree(foreign_value, template_value)``: whether two run-time arrays hold the same tensor.
Agree = Callable[[np.ndarray, np.ndarray], bool]


@dataclass(frozen=True)
class StructuralMatch:
    """The template value a foreign value was paired with, and on what evidence."""

    foreign: str
    template: str | None
    """``None`` when unmatched or ambiguous."""
    confidence: float
    """From 1 (one structural choice) down to 0 (no match); see
    :mod:`bisect_onnx.align.structural`."""
    how: How
    alternatives: tuple[str, ...] = ()
    """Template values that fitted equally, when ``how`` is ``"ambiguous"``."""
