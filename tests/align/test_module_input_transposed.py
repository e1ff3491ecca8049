"""What enters a call is not the value before a transpose the exporter gave the call.

``self.pool(x.transpose(1, 2))`` on a value made in place: the dynamo exporter puts the
transpose in the pool's scope, so the value the pool's nodes read from outside is the
one *before* it. With a square shape it passed for the pool's input by shape alone:
paired, the input row failed on the clean export, and a planted MaxPool dilation was
named as a segment of the block before (``mul, add, relu``) at module level.
"""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import nn

import bisect_onnx
from tests.planting import clean_at_module_level, export_dynamo, plant, set_attribute
from tests.torch_warnings import DYNAMO_LEAFSPEC_DEPRECATED


class _Pool(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.MaxPool1d(3, 1, 1)

    def forward(self, x):
        return self.pool(x.transpose(1, 2)).transpose(1, 2)


class _Pooled(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = _Pool()

    def forward(self, x):
        y = x.clone()
        y.mul_(0.5)
        y.add_(x)
        # In place, then transposed in the block: the exporter scopes the transpose to
        # the pool (a functional relu keeps it in the block).
        return self.block(y.relu_())


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model, x = _Pooled().eval(), torch.randn(2, 8, 8)  # time = width: a square shape
    return model, x.numpy(), export_dynamo(model, x, tmp_path_factory.mktemp("pooled"))


@DYNAMO_LEAFSPEC_DEPRECATED
def test_the_clean_export_has_no_failing_row(exported):
    report = clean_at_module_level(*exported)
    # Before, "block.pool (input)" was paired with the value before the transpose: failed.
    assert not any(row.failed for row in report.comparisons)
    assert any(row.torch_module == "block.pool" for row in report.comparisons)


@DYNAMO_LEAFSPEC_DEPRECATED
@pytest.mark.parametrize("granularity", ["module", None])
def test_a_planted_dilation_is_found_at_the_pool(exported, tmp_path, granularity):
    model, x, path = exported
    pool = next(node for node in onnx.load(str(path)).graph.node if node.op_type == "MaxPool")
    planted = tmp_path / "planted.onnx"
    plant(path, planted, set_attribute("block.pool", "MaxPool", "dilations", [2]))
    report = bisect_onnx.bisect(model, x, onnx_model=planted,
                                search=bisect_onnx.SearchOptions(granularity=granularity))
    assert report.first_divergence.onnx_node == pool.name, report.summary()
    if granularity is None:
        assert report.culprit is not None and report.culprit.onnx_node == pool.name
