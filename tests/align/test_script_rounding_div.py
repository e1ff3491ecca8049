"""A ``div`` with a rounding mode is not paired with its Div node (TorchScript export).

The exporter translates a floor division of integers into a truncating ``Div`` and a
``Where`` that takes one off where the signs differ: the Div's value is not the op's.
Paired with it, the row failed on a correct export, its local check too, and a planted
weight downstream was blamed on the Div.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import bisect_onnx
from tests.planting import plant, scale_initializer_input
from tests.torch_warnings import DYNAMO_LEAFSPEC_DEPRECATED, LEGACY_EXPORTER_DEPRECATED


class _FloorDiv(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        integers = torch.floor(x * 4).to(torch.int64)
        return self.fc(x + 0.1 * torch.div(integers, 3, rounding_mode="floor").to(x.dtype))


@LEGACY_EXPORTER_DEPRECATED
@DYNAMO_LEAFSPEC_DEPRECATED
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_weight_after_a_floor_division_is_blamed_on_its_node(tmp_path, exporter):
    torch.manual_seed(0)
    model = _FloorDiv().eval()
    x = torch.randn(2, 8, 8)  # negatives: floor and truncation differ
    clean, planted = tmp_path / "clean.onnx", tmp_path / "planted.onnx"
    torch.onnx.export(model, (x,), str(clean), dynamo=exporter == "dynamo", opset_version=18)
    assert not bisect_onnx.bisect(model, x.numpy(), onnx_model=clean).diverged

    def weight(onnx_model):
        node = next(node for node in onnx_model.graph.node if node.op_type in ("MatMul", "Gemm"))
        return scale_initializer_input(node.name, 1, 1.05)(onnx_model)

    node, _ = plant(clean, planted, weight)
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=planted)
    assert report.culprit is not None, report.summary()
    assert report.culprit.onnx_node == node, report.summary()



class _ChunkedFloorDiv(nn.Module):
    def forward(self, x):
        # The chunks are no argument the op could be called alone with: the rounding
        # mode is known from the traced node's overload, not from its arguments.
        numerator, denominator = (x * 4).chunk(2, dim=-1)
        return torch.div(numerator, denominator.abs() + 1, rounding_mode="floor") + 1


@LEGACY_EXPORTER_DEPRECATED
def test_a_floor_division_of_chunks_is_at_parity(tmp_path):
    torch.manual_seed(0)
    model, x = _ChunkedFloorDiv().eval(), torch.randn(2, 8, 8)
    path = tmp_path / "model.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=18)
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=path,
                                search=bisect_onnx.SearchOptions(granularity="op"))
    assert report.verdict == "parity" and not report.hidden_divergences, report.summary()
    # The exporter's record says the floor division ends at its Floor: paired there,
    # and at parity (not declined, as the hand table did before the record).
    divs = [row for row in report.comparisons if row.fx_node == "div"]
    assert [(row.onnx_op, row.figures.status) for row in divs] == [("Floor", "pass")], divs
