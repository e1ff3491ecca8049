"""Attention layers run the path the exporters trace, not their fused fast path."""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import nn

import bisect_onnx
from bisect_onnx.pytorch.fast_paths import as_the_exporter_runs
from tests.planting import node_of_module, plant, scale_initializer_input
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED, TORCH_JIT_DEPRECATED


class _Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0,
                                                batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.block(x))


def test_the_fast_path_is_off_inside_and_put_back_after():
    before = torch.backends.mha.get_fastpath_enabled()
    with as_the_exporter_runs():
        assert torch.backends.mha.get_fastpath_enabled() is False
    assert torch.backends.mha.get_fastpath_enabled() == before


@pytest.mark.parametrize("dynamo", [False, True])
@LEGACY_EXPORTER_DEPRECATED
@TORCH_JIT_DEPRECATED
def test_a_plant_inside_a_transformer_layer_is_found_inside_it(tmp_path, dynamo):
    torch.manual_seed(0)
    model, x = _Encoder().eval(), torch.randn(2, 5, 16)
    exported, planted = tmp_path / "model.onnx", tmp_path / "planted.onnx"
    torch.onnx.export(model, (x,), str(exported), dynamo=dynamo)
    graph = onnx.load(str(exported), load_external_data=False)
    first_ffn = (node_of_module(graph, "block.linear1", "MatMul") if dynamo else
                 next(node for node in graph.graph.node if "/linear1/" in node.name
                      and node.op_type in ("MatMul", "Gemm")))
    plant(exported, planted, scale_initializer_input(first_ffn.name, 1, 1.5))
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=planted)
    assert report.diverged
    named = report.culprit or report.first_divergence
    assert named.torch_module.startswith("block"), report.summary()  # not the head
    assert report.culprit is not None and report.culprit.torch_module == "block.linear1"
