"""Op level on TorchScript files of models whose own ``forward`` calls ops (issue 49).

The ops of a model's own ``forward``, with no submodule or between submodules, are
paired like a submodule's. So are the two steps of an ``LSTMCell`` called twice: its
first step makes its zero state and the next does not, so their ops were not told
apart by order, and ``remove_mutation`` puts the input's Linear before the state's,
which the exporter wrote second; the cell's ``sigmoid_`` on each chunk of its gates
wrote over the gates' sum before the run returned it (four hidden divergences on the
clean file, every plant named at the first call's Gemm). A GELU's nodes, cut by a
node inserted after its Erf, were not found, and the model's own ``y * 2.0`` took the
GELU's Mul. A clean file of a model without submodules had nothing compared inside
it by default (no module call). The TorchScript exporter's own divergences in such models (integer
``floor_divide`` of negatives, ``index_put_`` accumulating repeated indices) get a
culprit node, the op's.
"""

from __future__ import annotations

import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import bisect_onnx
from tests.planting import (
    export_torchscript_at_parity,
    insert_mul,
    plant,
    scale_initializer_input,
)
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED

pytestmark = LEGACY_EXPORTER_DEPRECATED

OP_ROWS = bisect_onnx.SearchOptions(granularity="op")


class _Direct(nn.Module):
    """Ops only, no submodule."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 5))

    def forward(self, x):
        y = torch.tanh(x) * 2
        return torch.softmax(y, -1) @ self.w


class _Between(nn.Module):
    """Ops between two submodules."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        y = self.a(x)
        y = torch.sigmoid(y) * y + 1.0
        return torch.exp(self.b(y) / 3)


class _TwoSteps(nn.Module):
    """One ``LSTMCell`` stepped twice, the model's own op between the steps."""

    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(8, 6)

    def forward(self, x):
        h, c = self.cell(x)
        h, c = self.cell(x * 0.5, (h, c))
        return h + c


class _GeluBeside(nn.Module):
    """A GELU (Div, Erf, Add, Mul, Mul) beside the model's own ``y * 2.0``."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        return F.gelu(y) + y * 2.0


def _clean(model: type[nn.Module], tmp_path):
    torch.manual_seed(0)
    model, x = model().eval(), torch.randn(3, 8)
    clean, planted = export_torchscript_at_parity(model, x, tmp_path)
    return model, x.numpy(), clean, planted


@pytest.mark.parametrize("model", [_Direct, _Between, _TwoSteps, _GeluBeside])
def test_the_clean_export_compares_every_op_with_nothing_claimed(model, tmp_path):
    model, x, clean, _ = _clean(model, tmp_path)
    report = bisect_onnx.bisect(model, x, onnx_model=clean, search=OP_ROWS)
    assert not report.diverged and report.hidden_divergences == [], report.summary()
    assert report.culprit is None
    # Every op compared, but where ONNX Runtime fused its node into the next one's kernel.
    assert {item.kind for item in report.unaligned} <= {"runtime-fused"}, report.summary()
    assert report.coverage.compared_ops >= report.coverage.torch_ops - 1


def test_a_clean_file_of_a_model_without_submodules_compares_its_ops_by_default(tmp_path):
    # Module level has no call to compare there: the ops are all that can be checked.
    model, x, clean, _ = _clean(_Direct, tmp_path)
    report = bisect_onnx.bisect(model, x, onnx_model=clean)
    assert not report.diverged and report.hidden_divergences == [], report.summary()
    assert report.coverage.granularity == "op"
    assert report.coverage.compared_ops == report.coverage.torch_ops == 4, report.summary()
    assert "FINAL OUTPUTS ONLY" not in report.summary()


@pytest.mark.parametrize(("model", "after"), [
    (_Direct, "/Tanh"), (_Direct, "/Mul"), (_Direct, "/Softmax"),
    (_Between, "/Sigmoid"), (_Between, "/Add"), (_Between, "/b/Gemm"),
    (_TwoSteps, "/cell/Tanh_1"), (_TwoSteps, "/Mul"), (_TwoSteps, "/cell_1/Gemm"),
    (_TwoSteps, "/cell_1/Sigmoid_2"),
    (_GeluBeside, "/Div"), (_GeluBeside, "/Erf"), (_GeluBeside, "/Mul_2"),
])
def test_a_node_inserted_after_an_op_of_the_models_own_forward_is_named(model, after,
                                                                        tmp_path):
    model, x, clean, planted = _clean(model, tmp_path)
    inserted, _ = plant(clean, planted, insert_mul(after, 1.5))
    report = bisect_onnx.bisect(model, x, onnx_model=planted)
    assert report.culprit is not None and report.culprit.onnx_node == inserted, (
        report.summary())


@pytest.mark.parametrize(("target", "fx_node"), [
    ("/cell/Gemm_1", "linear"), ("/cell_1/Gemm", "linear_2"), ("/cell_1/Gemm_1", "linear_1")])
def test_a_weight_planted_in_either_step_of_a_cell_is_named_at_its_gemm(target, fx_node,
                                                                       tmp_path):
    model, x, clean, planted = _clean(_TwoSteps, tmp_path)
    node, _ = plant(clean, planted, scale_initializer_input(target, 1, 1.5))
    report = bisect_onnx.bisect(model, x, onnx_model=planted)
    assert report.culprit is not None and report.culprit.onnx_node == node, report.summary()
    assert report.culprit.fx_node == fx_node
    assert report.culprit.torch_module == ("cell" if target.startswith("/cell/") else "cell@1")


class _FloorDivide(nn.Module):
    def forward(self, x, d):
        return torch.floor_divide(x, d) * 2 + x


class _Accumulate(nn.Module):
    def forward(self, x, index, v):
        y = x * 1.0
        y = y.index_put_((index,), v, accumulate=True)
        return y * 2


@pytest.mark.parametrize(("model", "inputs", "fx_node", "nodes"), [
    # ONNX Div of integers truncates: -7 // 2 is -4 in PyTorch, -3 in ONNX Runtime.
    (_FloorDivide, (torch.tensor([[-7, 7, -3, 5]]), torch.tensor([[2, -2, 2, 3]])),
     "floor_divide", {"Div", "Cast"}),
    # ScatterND of repeated indices keeps one of them instead of adding them.
    (_Accumulate, (torch.randn(5, 3), torch.tensor([0, 0, 2, 0]), torch.randn(4, 3)),
     "index_put", {"ScatterND", "Add"}),
])
def test_a_divergence_of_the_exporter_in_the_models_own_forward_has_a_culprit(
        model, inputs, fx_node, nodes, tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "model.onnx"
    torch.onnx.export(model(), inputs, str(path), dynamo=False, opset_version=17)
    report = bisect_onnx.bisect(model(), [item.numpy() for item in inputs], onnx_model=path)
    assert report.diverged and report.culprit is not None, report.summary()
    assert report.culprit.fx_node == fx_node
    op_types = {node.name: node.op_type for node in onnx.load(str(path)).graph.node}
    assert op_types[report.culprit.onnx_node] in nodes
