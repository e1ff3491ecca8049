"""TorchScript exports at op level: tuple-valued ops, paddings and cumulative sums.

``aten::topk`` returns its values and its indices; the capture used to skip ops with
more than one output, so the TopK node fell into the next op's segment and a planted
TopK was named at the node reading it. ``pad`` and ``cumsum`` were not in the pairing
table, with the same effect. Each output of a tuple-valued op is now its own row
(``topk[0]``, ``topk[1]``), paired with the node output that holds it where its shape
and dtype confirm it, and declined with a reason where they do not.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import numpy_helper
from torch import nn

import bisect_onnx
from bisect_onnx.align.script_ops import align_script_ops
from bisect_onnx.pytorch.script_ops import capture_script_ops, trace_script
from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner
from tests.planting import plant, set_attribute
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED

pytestmark = LEGACY_EXPORTER_DEPRECATED


class _Ops(nn.Module):
    """A Linear, then topk, pad, cumsum, sort and max(dim) in ``forward``, then a Linear."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(20, 4)

    def forward(self, x):
        h = self.fc1(x)
        values, indices = torch.topk(h, 4, dim=-1)
        padded = F.pad(values, (1, 1), value=0.5)
        summed = torch.cumsum(padded, dim=-1)
        ordered, order = torch.sort(h, dim=-1)
        top, where = torch.max(h, dim=-1, keepdim=True)
        ranks = (indices + order[..., :4] + where).to(h.dtype) * 0.01
        return self.fc2(torch.cat([summed * padded, ranks, ordered[..., :8], top * 0.1,
                                   values[..., :1]], dim=-1))


def _export(model, x, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17)
    return path


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """The model, its input, and its TorchScript export (made once: it is what is tested)."""
    torch.manual_seed(0)
    model = _Ops().eval()
    x = torch.randn(2, 8)
    return model, x.numpy(), _export(model, x, tmp_path_factory.mktemp("tuples") / "clean.onnx")


def _alignment(model, array, path):
    side = OnnxRuntimeRunner(path, promote="all")
    capture = capture_script_ops(trace_script(model, [array]), [array])
    return align_script_ops(capture, side.nodes, side.run([array]).capture.values, side.model), side


def test_each_output_of_a_tuple_valued_op_is_paired_with_its_node_output(export):
    alignment, side = _alignment(*export)
    producers = {output: (node.op_type, position) for node in side.nodes
                 for position, output in enumerate(node.outputs)}
    held = {pair.reference.name: producers[pair.candidate.name] for pair in alignment.pairs}

    assert held["topk[0]"] == ("TopK", 0) and held["topk[1]"] == ("TopK", 1)
    assert held["sort[0]"] == ("TopK", 0) and held["sort[1]"] == ("TopK", 1)
    assert held["max[0]"] == ("ReduceMax", 0) and held["max[1]"] == ("ArgMax", 0)
    assert held["pad"] == ("Pad", 0) and held["cumsum"] == ("CumSum", 0)
    for pair in alignment.pairs:  # the same tensor on a faithful export
        np.testing.assert_allclose(pair.candidate.array, pair.reference.array, atol=1e-5,
                                   err_msg=pair.reference.name)


def test_a_faithful_export_compares_the_tuple_rows_at_parity(export):
    model, array, path = export
    report = bisect_onnx.bisect(model, array, onnx_model=path,
                                search=bisect_onnx.SearchOptions(granularity="op"))
    assert report.verdict == "parity" and report.hidden_divergences == []
    compared = {record.fx_node for record in report.comparisons}
    assert {"topk[0]", "topk[1]", "sort[0]", "sort[1]", "max[0]", "max[1]", "pad",
            "cumsum"} <= compared


def _pad_value(factor: float):
    def edit(model: onnx.ModelProto) -> onnx.NodeProto:
        node = next(node for node in model.graph.node if node.op_type == "Pad")
        model.graph.initializer.append(numpy_helper.from_array(
            np.asarray(0.5 * factor, np.float32), "planted_pad_value"))
        node.input[2] = "planted_pad_value"
        return node

    return edit


PLANTS = {
    "topk-smallest": set_attribute("/TopK", "TopK", "largest", 0),
    "cumsum-reversed": set_attribute("/CumSum", "CumSum", "reverse", 1),
    "pad-value": _pad_value(1.4),
}


@pytest.mark.parametrize("plant_name", PLANTS)
def test_a_planted_topk_pad_or_cumsum_is_named_at_its_own_node(export, tmp_path, plant_name):
    model, array, path = export
    planted = tmp_path / "planted.onnx"
    node, _ = plant(path, planted, PLANTS[plant_name])

    report = bisect_onnx.bisect(model, array, onnx_model=planted)

    assert report.culprit is not None, report.summary()
    assert report.culprit.onnx_node == node, report.summary()
    assert report.culprit.torch_op in ("aten.topk", "aten.pad", "aten.cumsum")
    assert not any(record.failed for record in report.comparisons[:report.culprit.index])


class _TopKMeans(nn.Module):
    def forward(self, x):
        values, indices = torch.topk(x, 4, dim=-1)
        return values.mean(-1) * indices.to(x.dtype).mean(-1)


def test_a_topk_node_whose_outputs_are_not_the_ops_shape_is_declined(tmp_path):
    """A TopK of another k holds values of another shape: neither output is paired."""
    x = torch.randn(2, 8)
    path = _export(_TopKMeans(), x, tmp_path / "clean.onnx")

    def other_k(onnx_model: onnx.ModelProto) -> onnx.NodeProto:
        node = next(node for node in onnx_model.graph.node if node.op_type == "TopK")
        onnx_model.graph.initializer.append(numpy_helper.from_array(
            np.asarray([5], np.int64), "planted_k"))
        node.input[1] = "planted_k"
        return node

    plant(path, tmp_path / "other_k.onnx", other_k)
    clean, _ = _alignment(_TopKMeans(), x.numpy(), path)
    planted, _ = _alignment(_TopKMeans(), x.numpy(), tmp_path / "other_k.onnx")

    assert {"topk[0]", "topk[1]"} <= {pair.reference.name for pair in clean.pairs}
    assert not {"topk[0]", "topk[1]"} & {pair.reference.name for pair in planted.pairs}
    declined = {item.name: item for item in planted.torch_only}
    for name in ("topk[0]", "topk[1]"):
        assert declined[name].kind == "folded" and "TopK" in declined[name].reason


class _Circular(nn.Module):
    def forward(self, x):
        return F.pad(x, (1, 1), mode="circular") * 2


def test_a_circular_padding_is_paired_with_its_concat_not_a_pad(tmp_path):
    x = torch.randn(1, 2, 6)
    path = _export(_Circular(), x, tmp_path / "circular.onnx")
    alignment, _ = _alignment(_Circular(), x.numpy(), path)
    # The exporter's record: Slices and a Concat, which ends the op (not one Pad).
    paired = {pair.reference.name: pair for pair in alignment.pairs}
    assert paired["pad"].candidate.name.endswith("Concat_output_0")
    np.testing.assert_allclose(paired["pad"].candidate.array, paired["pad"].reference.array,
                               rtol=1e-6, atol=1e-6)
    assert "pad" not in {item.name for item in alignment.torch_only}


class _TwoLayerRecurrent(nn.Module):
    """An embedding, a two-layer LSTM or GRU, a Linear: the word language model's shape."""

    def __init__(self, cell: str):
        super().__init__()
        self.encoder = nn.Embedding(20, 8)
        self.rnn = getattr(nn, cell)(8, 8, 2)
        self.decoder = nn.Linear(8, 20)

    def forward(self, tokens):
        output, _ = self.rnn(self.encoder(tokens))
        return self.decoder(output)


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_a_two_layer_recurrent_op_is_paired_with_its_last_layers_output(tmp_path, cell):
    """Each layer ends in a Squeeze of the output's shape: the op's value is the last one's.

    The first layer's Squeeze was taken for it: the clean file claimed a hidden
    divergence there, and a plant after the op was named at it.
    """
    torch.manual_seed(0)
    model, tokens = _TwoLayerRecurrent(cell).eval(), torch.randint(0, 20, (5, 2))
    path = _export(model, tokens, tmp_path / "clean.onnx")
    alignment, side = _alignment(model, tokens.numpy(), path)
    squeezes = [node.outputs[0] for node in side.nodes if node.op_type == "Squeeze"]
    paired = {pair.reference.name: pair.candidate.name for pair in alignment.pairs}
    op = f"{cell.lower()}[0]"
    assert len(squeezes) == 2 and paired[op] == squeezes[-1]

    report = bisect_onnx.bisect(model, tokens.numpy(), onnx_model=path,
                                search=bisect_onnx.SearchOptions(granularity="op"))
    assert report.verdict == "parity" and report.hidden_divergences == []
    assert op in {record.fx_node for record in report.comparisons}


class _SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        h = self.proj(x)
        return (h.tanh(), h * 0.5)


class _Attention(nn.Module):
    """Returns a tuple holding a tensor of its submodule's tuple, as DeBERTa's does: the
    trace keeps the packing and unpacking of both."""

    def __init__(self):
        super().__init__()
        self.self_attention = _SelfAttention()

    def forward(self, x):
        attended, scores = self.self_attention(x)
        return (attended + x, scores)


class _TupleThenLinear(nn.Module):
    """A Linear reading the first tensor of a submodule's tuple (DeBERTa's layer)."""

    def __init__(self):
        super().__init__()
        self.attention = _Attention()
        self.dense = nn.Linear(8, 8)

    def forward(self, x):
        attended, scores = self.attention(x)
        return self.dense(attended).relu() + scores


def test_a_linear_reading_a_returned_tuple_is_looked_inside(tmp_path):
    """Its input was "computed in the graph": the MatMul's weight named at the Add."""
    from tests.planting import bisect_torchscript_with_scaled_weight

    torch.manual_seed(0)
    model, x = _TupleThenLinear().eval(), torch.randn(2, 3, 8)  # 3-D: MatMul, Add
    weight_index = 1

    report = bisect_torchscript_with_scaled_weight(model, x, tmp_path, "/dense/MatMul",
                                                   weight_index)

    assert report.culprit is not None, report.summary()
    assert report.culprit.onnx_node == "/dense/MatMul", report.summary()
    assert report.culprit.torch_module == "dense", report.summary()


class _PositionIds(nn.Module):
    """Position ids counted over a mask, as XLM-RoBERTa makes them: ``cumsum`` of an
    ``int32`` mask is ``int64`` in PyTorch, the exporter's CumSum stays ``int32``."""

    def __init__(self):
        super().__init__()
        self.words = nn.Embedding(16, 8)
        self.positions = nn.Embedding(16, 8)

    def forward(self, ids):
        mask = ids.ne(1).int()
        positions = (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + 1
        return self.words(ids) + self.positions(positions)


def test_an_integer_cumsum_of_another_width_is_paired_and_named(tmp_path):
    torch.manual_seed(0)
    model, ids = _PositionIds().eval(), torch.tensor([[3, 5, 7, 2, 9, 1, 1]])
    clean = _export(model, ids, tmp_path / "clean.onnx")
    planted = tmp_path / "planted.onnx"
    plant(clean, planted, set_attribute("/CumSum", "CumSum", "reverse", 1))
    op_rows = bisect_onnx.SearchOptions(granularity="op")

    at_parity = bisect_onnx.bisect(model, ids.numpy(), onnx_model=clean, search=op_rows)
    report = bisect_onnx.bisect(model, ids.numpy(), onnx_model=planted, search=op_rows)

    assert at_parity.verdict == "parity" and at_parity.hidden_divergences == []
    assert "cumsum" in {row.fx_node for row in at_parity.comparisons}, at_parity.summary()
    assert report.culprit is not None, report.summary()
    assert report.culprit.onnx_node == "/CumSum", report.summary()
    assert report.culprit.torch_op == "aten.cumsum", report.summary()
