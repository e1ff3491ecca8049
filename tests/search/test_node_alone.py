"""A failing segment's nodes are run alone: the one that fails is named, with its figure.

ONNX Runtime fuses a TorchScript Linear's MatMul and Add (its MatMul output is then no
capture output), so ONNX against ONNX the local check runs both nodes together. The
reference graph has the MatMul's value: each node reruns alone on the reference's
values of its inputs, and only the planted one fails there. Named before as "a segment
of 2 nodes: MatMul, Add".
"""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import nn

import bisect_onnx
from tests.planting import export_torchscript_at_parity, plant, scale_initializer_input
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED


class _TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


def _node(model: onnx.ModelProto, op_type: str, scope: str) -> onnx.NodeProto:
    return next(node for node in model.graph.node
                if node.op_type == op_type and scope in node.name)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The model exported by TorchScript (3-D input: MatMul and Add, not Gemm)."""
    torch.manual_seed(0)
    model = _TwoLinears().eval()
    x = torch.randn(2, 5, 8)
    path = tmp_path_factory.mktemp("alone") / "clean.onnx"
    with pytest.warns(DeprecationWarning):
        torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17)
    return path, x.numpy()


def _planted(exported, tmp_path, op_type: str, index: int):
    clean, x = exported
    model = onnx.load(str(clean))
    target = _node(model, op_type, "second")
    initializers = {tensor.name for tensor in model.graph.initializer}
    position = next(number for number, name in enumerate(target.input) if name in initializers)
    assert position == index
    planted = tmp_path / "planted.onnx"
    node, _ = plant(clean, planted, scale_initializer_input(target.name, position, 1.05))
    return clean, planted, node, x, model


def test_the_add_of_a_fused_linear_is_named_when_its_matmul_passes_alone(exported, tmp_path):
    clean, planted, node, x, model = _planted(exported, tmp_path, "Add", 0)
    report = bisect_onnx.bisect_onnx_models(clean, planted, [x])
    assert report.diverged and report.culprit_segment is None, report.summary()
    assert report.culprit is not None and report.culprit.onnx_node == node, report.summary()
    narrowed = report.attribution.narrowed
    matmul = _node(model, "MatMul", "second").name
    assert narrowed["segment"] == [matmul, node] and narrowed["node"] == node
    assert narrowed["alone"][matmul] == 0.0 and narrowed["alone"][node] > 1e-4
    # The figure the verdict gives is the Add's own run, not the segment's.
    assert report.culprit.local.max_abs_error == pytest.approx(narrowed["alone"][node])
    assert "narrowed from a segment of 2 nodes" in report.summary()


def test_the_matmul_of_a_fused_linear_is_named_inside_it(exported, tmp_path):
    clean, planted, node, x, _ = _planted(exported, tmp_path, "MatMul", 1)
    report = bisect_onnx.bisect_onnx_models(clean, planted, [x])
    assert report.diverged and report.culprit_segment is None, report.summary()
    assert report.culprit is not None and report.culprit.onnx_node == node, report.summary()
    assert report.culprit.local.introduced_here and report.culprit.local.max_abs_error > 1e-4


def test_the_pytorch_form_names_the_planted_add_too(exported, tmp_path):
    clean, planted, node, x, _ = _planted(exported, tmp_path, "Add", 0)
    torch.manual_seed(0)
    report = bisect_onnx.bisect(_TwoLinears().eval(), x, onnx_model=planted)
    assert report.culprit is not None and report.culprit.onnx_node == node, report.summary()


class _ChainedLinears(nn.Module):
    """Two Linears back to back: one segment holds both, as no capture lies between."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.second(self.first(x))


@LEGACY_EXPORTER_DEPRECATED
@pytest.mark.parametrize(("op_type", "index"), [("MatMul", 1), ("Add", 0)])
def test_a_node_of_the_second_of_two_chained_linears_is_named(tmp_path, op_type, index):
    """The first Linear reran alone and agreed, so the op found wrong inside the segment
    (the second, against its own export) is the one that introduced the error there."""
    torch.manual_seed(0)
    model, x = _ChainedLinears().eval(), torch.randn(2, 5, 8)
    clean, planted = export_torchscript_at_parity(model, x, tmp_path)
    target = _node(onnx.load(str(clean)), op_type, "second")
    node, _ = plant(clean, planted, scale_initializer_input(target.name, index, 1.05))
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=planted)
    assert report.culprit is not None and report.culprit.onnx_node == node, report.summary()
    assert report.culprit.fx_node == "linear_1" and report.culprit.local.introduced_here
    assert {"/first/MatMul", "/first/Add"} <= set(report.attribution.passed_alone)
