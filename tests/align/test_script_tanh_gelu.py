"""A tanh-approximated ``gelu`` is not paired with the first node of its decomposition.

TorchScript writes ``F.gelu(x, approximate="tanh")`` as six Muls around a Tanh, not the
exact form's Div, Erf, Add, Mul, Mul; the table's rule for gelu took the first Mul, whose
value failed on a correct export, and a plant after it was blamed on that Mul (corpus
seed 101).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import bisect_onnx
from tests.planting import plant, scale_initializer_input
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED


class _TanhGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        return self.second(F.gelu(self.first(x), approximate="tanh"))


@LEGACY_EXPORTER_DEPRECATED
def test_a_tanh_gelu_is_at_parity_and_a_weight_after_it_is_named(tmp_path):
    torch.manual_seed(0)
    model, x = _TanhGelu().eval(), torch.randn(2, 5, 8)
    clean, planted = tmp_path / "clean.onnx", tmp_path / "planted.onnx"
    torch.onnx.export(model, (x,), str(clean), dynamo=False, opset_version=17)
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=clean,
                                search=bisect_onnx.SearchOptions(granularity="op"))
    assert not any(row.failed for row in report.comparisons), report.summary()
    import onnx

    matmul = [node.name for node in onnx.load(str(clean)).graph.node
              if node.op_type == "MatMul"][-1]
    node, _ = plant(clean, planted, scale_initializer_input(matmul, 1, 1.05))
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=planted)
    assert report.culprit is not None and report.culprit.onnx_node == node, report.summary()
