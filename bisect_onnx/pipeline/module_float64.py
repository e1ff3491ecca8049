"""PyTorch's float64 side of a module-level segment, for classifying its culprit.

Module level pairs ONNX values with what module calls returned or were given; a
segment checked on PyTorch's inputs is fed those values. Each of them pins the float64
rerun of a module call enclosing the segment (:mod:`bisect_onnx.pytorch.span_float64`),
so that PyTorch's side computes from the very inputs the ONNX side was fed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.errors import BisectOnnxError
from bisect_onnx.pytorch.calls import call_name, input_of
from bisect_onnx.pytorch.reference import MODULE, TorchReference
from bisect_onnx.pytorch.span_float64 import Pin, span_in_float64
from bisect_onnx.runtime.sides import CapturedValue

if TYPE_CHECKING:
    import torch

    from bisect_onnx.align.modules import Pair
    from bisect_onnx.search.local import LocalCheck

__all__ = ["ModuleFloat64", "module_float64"]

logger = logging.getLogger(__name__)

#: Which tensor of a call's tuple output a module-level value is (``[0]``, ``[1][2]``).
_SUFFIX = re.compile(r"(\[\d+\])*")


def module_float64(reference: TorchReference, arrays: Sequence[np.ndarray],
                   keywords: Sequence[str], graph_inputs: Mapping[str, np.ndarray],
                   pairs: Sequence[Pair]) -> ModuleFloat64 | None:
    """A rerun for this sample's module-level segments; ``None`` unless an ``nn.Module``.

    ``pairs``: the sample's module-level pairs, which say what module value each ONNX
    value stands for.
    """
    if reference.kind != MODULE:
        return None
    return ModuleFloat64(reference.exportable, arrays, keywords, graph_inputs,
                         {pair.candidate.name: pair.reference for pair in pairs})


class ModuleFloat64:
    """Called with a local check, gives PyTorch's float64 value of its segment, or ``None``.

    Each value's segment is rerun once per sample (a segment: the value and what it was
    fed): module-level attribution may run again after a trace was tried and refused.
    """

    def __init__(self, model: torch.nn.Module, arrays: Sequence[np.ndarray],
                 keywords: Sequence[str], graph_inputs: Mapping[str, np.ndarray],
                 by_value: Mapping[str, CapturedValue]) -> None:
        self.model, self.arrays, self.keywords = model, arrays, keywords
        self.graph_inputs, self.by_value = graph_inputs, by_value
        self.done: dict[tuple[str, frozenset[str]], np.ndarray | None] = {}

    def __call__(self, check: LocalCheck, known: Mapping[str, CapturedValue] | None = None
                 ) -> np.ndarray | None:
        """PyTorch's float64 value of ``check``'s segment (``None``: why is logged).

        ``known``: module values of ONNX values the capture did not hold (inside a fused
        kernel), by ONNX name, for a segment that ends or starts there.
        """
        # The same value's segment checked from other values is another rerun.
        key = (check.value, frozenset(check.feeds))
        if key not in self.done:
            try:
                self.done[key] = self._rerun(check, {**(known or {}), **self.by_value})
            except BisectOnnxError as error:
                logger.info("no float64 rerun of %s in PyTorch: %s", check.value, error)
                self.done[key] = None
        return self.done[key]

    def _rerun(self, check: LocalCheck, by_value: Mapping[str, CapturedValue]) -> np.ndarray:
        output = by_value.get(check.value)
        if output is None:
            raise BisectOnnxError("no module call's value is paired with it")
        pin = self._pin(output)
        if pin.given or pin.suffix:
            raise BisectOnnxError(f"it is not the one tensor {call_name(pin.path, pin.call)} "
                                  "returns")
        pins = [self._pin(by_value[name], array) if name not in self.graph_inputs
                else Pin("", 0, np.asarray(array)) for name, array in check.feeds.items()
                if name in by_value or name in self.graph_inputs]
        if len(pins) != len(check.feeds):
            raise BisectOnnxError("an input of its segment is no module call's value")
        return span_in_float64(self.model, self.arrays, self.keywords,
                               output=(pin.path, pin.call), pins=pins,
                               reference=np.asarray(output.array))

    @staticmethod
    def _pin(value: CapturedValue, array: np.ndarray | None = None) -> Pin:
        """The call behind a module-level value: what it returned, or its one argument."""
        path, call = value.provenance.module or "", value.provenance.call
        given = input_of(value.name)
        array = np.asarray(value.array if array is None else array)
        if given is not None and value.name == f"{call_name(path, call)} (input)":
            return Pin(path, call, array, given=True)
        suffix = value.name[len(call_name(path, call)):]
        if given is None and path and value.name.startswith(call_name(path, call)) and (
                _SUFFIX.fullmatch(suffix)):
            return Pin(path, call, array, suffix=suffix)
        raise BisectOnnxError(f"{value.name} is not one tensor a call returns or is given")
