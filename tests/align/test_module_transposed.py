"""A module whose closing transpose the exporter folded is not paired with a transposed value.

A block that transposes, normalizes and transposes back, followed by one that transposes
again: the dynamo exporter cancels the two transposes between them, so the first
block's last ONNX value is its output with the dimensions in another order. Paired, it
failed by shape and its BatchNormalization was named the culprit of a plant elsewhere.
"""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import nn

import bisect_onnx
from bisect_onnx.align.modules import RESHAPED, TRANSPOSED
from tests.planting import clean_at_module_level, export_dynamo, insert_mul, plant
from tests.torch_warnings import DYNAMO_LEAFSPEC_DEPRECATED


class _ChannelNorm(nn.Module):
    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = norm

    def forward(self, x):
        return self.norm(x.transpose(1, 2)).transpose(1, 2)


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = _ChannelNorm(nn.BatchNorm1d(8)), _ChannelNorm(nn.GroupNorm(2, 8))

    def forward(self, x):
        return self.second(self.first(x)) * 2.0


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model, x = _Model().eval(), torch.randn(2, 5, 8)
    return model, x.numpy(), export_dynamo(model, x, tmp_path_factory.mktemp("transposed"))


@DYNAMO_LEAFSPEC_DEPRECATED
def test_the_folded_modules_output_is_left_unaligned_with_its_reason(exported):
    report = clean_at_module_level(*exported)
    assert any(item.name == "first" and item.reason == TRANSPOSED
               for item in report.unaligned), report.unaligned


@DYNAMO_LEAFSPEC_DEPRECATED
def test_a_node_inserted_after_it_is_named_not_the_norm_before(exported, tmp_path):
    model, x, path = exported
    graph = onnx.load(str(path)).graph
    after = [node.name for node in graph.node if node.op_type == "InstanceNormalization"][0]
    inserted, _ = plant(path, tmp_path / "inserted.onnx", insert_mul(after, 1.5))
    report = bisect_onnx.bisect(model, x, onnx_model=tmp_path / "inserted.onnx")
    assert report.culprit is not None and report.culprit.onnx_node == inserted, report.summary()


class _Shuffle(nn.Module):
    """A channel shuffle: ``view`` into two groups, ``transpose``, ``reshape`` back."""

    def forward(self, x):
        b, t, d = x.shape
        return x.view(b, t, 2, d // 2).transpose(2, 3).contiguous().reshape(b, t, d)


class _TwoShuffles(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = _Shuffle(), _Shuffle()

    def forward(self, x):
        return self.second(self.first(x - x.amax(-1, keepdim=True))) * 2.0


@DYNAMO_LEAFSPEC_DEPRECATED
def test_a_module_whose_closing_reshape_was_merged_is_left_unaligned(tmp_path):
    """The optimizer merges the first shuffle's closing reshape with the second's opening
    view: the first's last value is its transpose, of another shape. Paired, it failed
    by shape and was named where nothing diverges."""
    torch.manual_seed(0)
    model, x = _TwoShuffles().eval(), torch.randn(2, 8, 8)
    report = clean_at_module_level(model, x.numpy(), export_dynamo(model, x, tmp_path))
    assert any(item.name == "first" and item.reason == RESHAPED
               for item in report.unaligned), report.unaligned
