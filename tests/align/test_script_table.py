"""Each op of the TorchScript table is paired with the node its export ends in.

A tiny model of one op (after a Mul, so the op's input is a paired value) is traced
and exported; the op's value must be paired with a node of the table's type whose
value equals it, and its segment must end at that node.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional

from bisect_onnx.align.script_ops import align_script_ops
from bisect_onnx.pytorch.script_ops import capture_script_ops, trace_script
from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED

#: ATen op -> (what the model does with y = x * 0.5, the ONNX node holding its value).
OPS = {
    "sin": (torch.sin, "Sin"),
    "atan": (torch.atan, "Atan"),
    "reciprocal": (torch.reciprocal, "Reciprocal"),
    "softplus": (functional.softplus, "Softplus"),
    "softplus beta": (lambda y: functional.softplus(y, beta=2.0), "Div"),  # Softplus, Div
    "clamp_min": (lambda y: torch.clamp_min(y, y * 0.3), "Max"),  # a tensor bound
    "clamp": (lambda y: torch.clamp(y, y * 0.3, y * 0.9), "Min"),  # Max, then Min
    "hardswish": (functional.hardswish, "HardSwish"),
    "relu6": (functional.relu6, "Clip"),
    "maximum": (lambda y: torch.maximum(y, y * 0.3), "Max"),
    "max": (lambda y: torch.max(y, y * 0.3), "Max"),
    "fmod": (lambda y: torch.fmod(y, 0.7), "Mod"),
    "rsub": (lambda y: 1 - y, "Sub"),
    "log_sigmoid": (functional.logsigmoid, "Log"),
    "masked_fill": (lambda y: y.masked_fill(y > 0.2, 0.0), "Where"),
    "ne": (lambda y: (y != 0.1).float(), "Not"),
    "ge": (lambda y: (y >= 0.1).float(), "GreaterOrEqual"),
    "tril": (torch.tril, "Trilu"),
    "amax": (lambda y: torch.amax(y, -1), "ReduceMax"),
    "argmax": (lambda y: torch.argmax(y, -1), "ArgMax"),
    "logsumexp": (lambda y: torch.logsumexp(y, -1), "ReduceLogSumExp"),
    "linalg_vector_norm": (lambda y: torch.norm(y, dim=-1), "ReduceL2"),
    "einsum": (lambda y: torch.einsum("bij,bkj->bik", y, y), "Einsum"),
    "gather": (lambda y: torch.gather(y, -1, torch.zeros(2, 8, 3, dtype=torch.long)),
               "GatherElements"),
    "stack": (lambda y: torch.stack([y, y]), "Concat"),
    "repeat": (lambda y: y.repeat(1, 2, 1), "Tile"),
    "addcmul": (lambda y: torch.addcmul(y, y, y, value=0.5), "Add"),
    "mish": (functional.mish, "Mul"),
    "glu": (lambda y: functional.glu(y, -1), "Mul"),
}


class _One(nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, x):
        return self.function(x * 0.5) + 0


def _aligned(tmp_path, function):
    """The traced ops of ``_One(function)``, its TorchScript export run with every value
    captured, and their alignment."""
    model, x = _One(function).eval(), torch.randn(2, 8, 16)
    path = tmp_path / "model.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=18)
    arrays = [x.numpy()]
    side = OnnxRuntimeRunner(path, promote="all")
    capture = capture_script_ops(trace_script(model, arrays), arrays)
    return capture, side, align_script_ops(capture, side.nodes, side.run(arrays).capture.values,
                                           side.model)


def _producer(side: OnnxRuntimeRunner, value: str):
    return next(node for node in side.nodes if value in node.outputs)


@LEGACY_EXPORTER_DEPRECATED
@pytest.mark.parametrize("kind", OPS)
def test_a_table_op_is_paired_with_its_node(tmp_path, kind):
    function, node_type = OPS[kind]
    capture, side, alignment = _aligned(tmp_path, function)

    op = next(op for op in capture.ops if op.kind == f"aten::{kind.split()[0]}")
    pair = next((pair for pair in alignment.pairs if pair.reference.name == op.name), None)
    assert pair is not None, [item for item in alignment.torch_only if item.name == op.name]
    producer = _producer(side, pair.candidate.name)
    assert producer.op_type == node_type
    np.testing.assert_allclose(pair.candidate.array, pair.reference.array, rtol=1e-5,
                               atol=1e-6)
    # Its segment (what a local check of it runs) ends at that node.
    assert alignment.segments[op.name][-1].name == producer.name


@LEGACY_EXPORTER_DEPRECATED
def test_a_slice_of_every_element_is_its_input_and_the_real_slice_is_paired(tmp_path):
    """``x[:, 1:]`` is traced as two slices and exported as one Slice."""
    capture, side, alignment = _aligned(tmp_path, lambda y: y[:, 1:])

    whole, part = (op.name for op in capture.ops if op.kind == "aten::slice")
    assert [item.kind for item in alignment.torch_only if item.name == whole] == ["removed"]
    pair = next(pair for pair in alignment.pairs if pair.reference.name == part)
    assert _producer(side, pair.candidate.name).op_type == "Slice"
    np.testing.assert_array_equal(pair.candidate.array, pair.reference.array)


@LEGACY_EXPORTER_DEPRECATED
def test_a_slice_bounded_at_the_axis_length_is_its_own_slice_node(tmp_path):
    """``y[:, :8]`` of 8 keeps every element, but the exporter makes a Slice node for it."""
    capture, side, alignment = _aligned(tmp_path, lambda y: torch.sin(y[:, :8]))

    whole, bounded = (op.name for op in capture.ops if op.kind == "aten::slice")
    assert [item.kind for item in alignment.torch_only if item.name == whole] == ["removed"]
    pair = next(pair for pair in alignment.pairs if pair.reference.name == bounded)
    assert _producer(side, pair.candidate.name).op_type == "Slice"
    sine = next(op.name for op in capture.ops if op.kind == "aten::sin")
    assert [node.op_type for node in alignment.segments[sine]] == ["Sin"]
