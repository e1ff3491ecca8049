"""One op alone: a module that calls it, exported and run with every value kept.

To look inside a multi-node op (``aten.linear`` is MatMul then Add, ``aten.gelu``
five nodes), the op is exported again by itself, by the exporter that made the file,
on the reference's values of its inputs, and run in ONNX Runtime with every value
promoted: its :class:`Translation`. Both exporters' looks inside an op go through here
(:mod:`bisect_onnx.search.decomposition` for an FX node,
:mod:`bisect_onnx.align.script_inside` for a TorchScript op); the exporter's
translation evaluated without an export (:mod:`bisect_onnx.search.translation_eval`)
returns a :class:`Translation` too.

The module (:func:`single_op`) holds the op's weights as its own parameters and
buffers, so that the exporter folds them as it did in the whole model; activations are
``forward``'s inputs; literal arguments stay literal. A tensor argument is a
:class:`Slot`, filled from an input or a weight by name when the op is called.
"""

from __future__ import annotations

import functools
import math
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx
    import torch

__all__ = ["Slot", "Translation", "single_op", "export_alone"]

#: The largest weight of an op alone (in elements) kept among its values.
_SMALL_WEIGHT = 1 << 16


@dataclass(frozen=True)
class Slot:
    """A tensor argument of the op alone: a ``forward`` input or a weight, by name."""

    name: str


@dataclass(frozen=True)
class Translation:
    """An op's ONNX translation, run on the reference's inputs."""

    nodes: list[onnx.NodeProto]
    """Its nodes in graph order, Constant nodes dropped."""
    values: dict[str, np.ndarray]
    """Every value it computed, by its own names."""


def single_op(op: Callable[..., object], arguments: Sequence[object],
              keywords: Mapping[str, object],
              input_slots: Sequence[str]) -> torch.nn.Module:
    """A module whose ``forward(*inputs)`` calls ``op(*arguments, **keywords)``.

    ``arguments`` and ``keywords`` may nest (lists, tuples, dicts) and hold
    slots (:class:`Slot`): ``input_slots`` names the slots filled from ``forward``'s inputs,
    in order; every other slot names a weight registered on the module before it runs.
    """
    return _single_op_class()(op, tuple(arguments), dict(keywords), tuple(input_slots))


def export_alone(module: torch.nn.Module, inputs: list[np.ndarray], *, exporter: str,
                 opset: int | None) -> Translation:
    """Export ``module`` (the op alone) and run it on ``inputs``, every value promoted.

    Nothing is left behind: the export lives in a temporary folder for the run.
    """
    from onnx import numpy_helper

    from bisect_onnx.pytorch.exporting import export_model
    from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner

    with tempfile.TemporaryDirectory(prefix="bisect-onnx-op-") as folder:
        exported = export_model(module.eval(), inputs, Path(folder), exporter=exporter,
                                opset=opset)
        runner = OnnxRuntimeRunner(exported.path, promote="all")  # every intermediate
        capture = runner.run(inputs).capture
        # Its small weights and its inputs too: a node of the file may compute what the
        # op alone holds as a weight (a GRU's zero state, made from a shape). Not its
        # large ones (an embedding's table, hundreds of MB in a large model, copied for
        # nothing): a node computing one of those is left uncompared. Read while the
        # folder, which may hold their data, is there.
        values = {initializer.name: numpy_helper.to_array(initializer, folder)
                  for initializer in runner.model.graph.initializer
                  if math.prod(initializer.dims) <= _SMALL_WEIGHT}
    values.update({spec.name: array for spec, array in zip(runner.inputs, inputs, strict=False)})
    values.update({name: value.array for name, value in capture.values.items()})
    return Translation([node for node in runner.model.graph.node if node.op_type != "Constant"],
                       values)


@functools.cache
def _single_op_class() -> type[torch.nn.Module]:
    """The module class, made on first use so that importing this module skips torch."""
    import torch
    from torch.fx.node import map_aggregate

    class SingleOp(torch.nn.Module):
        """Calls one op; its tensor arguments are slots, filled by name."""

        def __init__(self, op: Callable[..., object], arguments: tuple[object, ...],
                     keywords: dict[str, object], input_slots: tuple[str, ...]) -> None:
            super().__init__()
            self.op = op
            self.arguments = arguments
            self.keywords = keywords
            self.input_slots = input_slots

        def forward(self, *inputs: torch.Tensor) -> object:
            fill = functools.partial(self._fill, dict(zip(self.input_slots, inputs, strict=True)))
            return self.op(*map_aggregate(self.arguments, fill),
                           **map_aggregate(self.keywords, fill))

        def _fill(self, inputs: dict[str, torch.Tensor], item: object) -> object:
            if not isinstance(item, Slot):
                return item
            return inputs[item.name] if item.name in inputs else getattr(self, item.name)

    return SingleOp
