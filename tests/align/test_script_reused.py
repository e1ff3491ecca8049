"""A module registered twice is paired op by op on each of its calls (TorchScript).

One module object reached by two paths (``self.reused = blocks[0]``) is one set of
nodes per call in a TorchScript export: ``/blocks.0/norm/`` on its own call and
``/blocks.1/blocks.0/norm/`` when ``blocks.1`` calls it, while the trace names every
call of it after its last attribute (``reused``). Two such modules are told apart by
their class. Between the two calls of the BatchNorm block, the exporter removes the
closing transpose of one and the opening transpose of the next. Before, nothing of
the second calls was paired, and a planted bug there was named as a segment.
"""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import nn

import bisect_onnx
from tests.planting import export_torchscript_at_parity, insert_mul, plant, scale_initializer_input
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED


class _Norm(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(8)

    def forward(self, x):
        return self.norm(x.transpose(1, 2)).transpose(1, 2)


class _Feed(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.linear(x))


class _Reuse(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.reused = module

    def forward(self, x):
        return self.reused(x)


class _Chain(nn.Module):
    """Its blocks, one after the other."""

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class _Model(_Chain):
    def __init__(self):
        super().__init__()
        norm, feed = _Norm(), _Feed()
        self.blocks = nn.ModuleList([norm, _Reuse(norm), feed, _Reuse(feed)])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = _Model().eval()
    with torch.no_grad():  # running statistics worth planting on
        model.blocks[0].norm.running_mean.uniform_(-1, 1)
        model.blocks[0].norm.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 5, 8)
    path = tmp_path_factory.mktemp("reused") / "clean.onnx"
    with pytest.warns(DeprecationWarning):
        torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=17)
    return model, x.numpy(), path


def _second_call(path, op_type: str) -> onnx.NodeProto:
    nodes = [node for node in onnx.load(str(path)).graph.node if node.op_type == op_type]
    assert len(nodes) == 2 and nodes[1].name.startswith("/blocks.")
    return nodes[1]


def _set_attribute(name: str, attribute: str, value: object):
    def edit(model: onnx.ModelProto) -> onnx.NodeProto:
        node = next(node for node in model.graph.node if node.name == name)
        kept = [kept for kept in node.attribute if kept.name != attribute]
        del node.attribute[:]
        node.attribute.extend([*kept, onnx.helper.make_attribute(attribute, value)])
        return node

    return edit


@LEGACY_EXPORTER_DEPRECATED
def test_the_clean_export_is_at_parity(exported):
    model, x, path = exported
    report = bisect_onnx.bisect(model, x, onnx_model=path)
    assert not report.diverged and report.culprit is None, report.summary()


@LEGACY_EXPORTER_DEPRECATED
def test_a_planted_epsilon_on_the_second_call_of_a_norm_is_named(exported, tmp_path):
    model, x, path = exported
    target = _second_call(path, "BatchNormalization")
    planted = tmp_path / "planted.onnx"
    node, _ = plant(path, planted, _set_attribute(target.name, "epsilon", 0.5))
    report = bisect_onnx.bisect(model, x, onnx_model=planted)
    assert report.culprit is not None and report.culprit.onnx_node == node, report.summary()
    assert report.culprit.fx_node == "batch_norm_1"


@LEGACY_EXPORTER_DEPRECATED
def test_a_planted_bias_on_the_second_call_of_a_linear_is_named(exported, tmp_path):
    model, x, path = exported
    target = _second_call(path, "Add")
    planted = tmp_path / "planted.onnx"
    initializers = {tensor.name for tensor in onnx.load(str(path)).graph.initializer}
    position = next(index for index, name in enumerate(target.input) if name in initializers)
    node, _ = plant(path, planted, scale_initializer_input(target.name, position, 1.5))
    report = bisect_onnx.bisect(model, x, onnx_model=planted)
    assert report.culprit is not None and report.culprit.onnx_node == node, report.summary()
    assert report.culprit.fx_node == "linear_1"


class _Thrice(_Chain):
    """One block registered three times: the trace loses the middle call's name."""

    def __init__(self):
        super().__init__()
        feed = _Feed()
        self.blocks = nn.ModuleList([feed, _Reuse(feed), _Reuse(feed)])


@LEGACY_EXPORTER_DEPRECATED
def test_a_planted_bias_on_the_middle_of_three_calls_is_named(tmp_path):
    torch.manual_seed(0)
    model, x = _Thrice().eval(), torch.randn(2, 5, 8)
    clean, planted = export_torchscript_at_parity(model, x, tmp_path)
    adds = [node for node in onnx.load(str(clean)).graph.node if node.op_type == "Add"]
    assert len(adds) == 3 and adds[1].name.startswith("/blocks.1/")
    initializers = {tensor.name for tensor in onnx.load(str(clean)).graph.initializer}
    position = next(index for index, name in enumerate(adds[1].input) if name in initializers)
    node, _ = plant(clean, planted, scale_initializer_input(adds[1].name, position, 1.5))
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=planted)
    assert report.culprit is not None and report.culprit.onnx_node == node, report.summary()


class _Attention(nn.Module):
    """Attention by hand: no parameters, so only object identity says it is registered twice."""

    def forward(self, x):
        scores = torch.matmul(x, x.transpose(-1, -2)) * 0.5
        return torch.matmul(torch.softmax(scores, -1), x)


class _SharedAttention(_Chain):
    def __init__(self):
        super().__init__()
        attention = _Attention()
        self.blocks = nn.ModuleList([_Feed(), attention, _Reuse(attention)])


@LEGACY_EXPORTER_DEPRECATED
@pytest.mark.parametrize("call", [0, 1])
def test_a_planted_axis_in_a_parameterless_module_registered_twice_is_named(tmp_path, call):
    torch.manual_seed(0)
    model, x = _SharedAttention().eval(), torch.randn(2, 5, 8)
    clean, planted = export_torchscript_at_parity(model, x, tmp_path)
    softmaxes = [node for node in onnx.load(str(clean)).graph.node if node.op_type == "Softmax"]
    assert [node.name for node in softmaxes] == ["/blocks.1/Softmax",
                                                 "/blocks.2/blocks.1/Softmax"]
    node, _ = plant(clean, planted, _set_attribute(softmaxes[call].name, "axis", 1))
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=planted)
    assert report.culprit is not None and report.culprit.onnx_node == node, report.summary()
    assert report.culprit.torch_module == ("blocks.1", "blocks.1@1")[call]
    assert report.culprit.fx_node == ("softmax", "softmax_1")[call]


class _Pool(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.AvgPool1d(3, 1, 1)

    def forward(self, x):
        return self.pool(x.transpose(1, 2)).transpose(1, 2)


class _PoolThrice(_Chain):
    """A module without tensors registered three times: the trace inlines the middle call
    (no method call of it), so its calls were counted two, and none was told apart."""

    def __init__(self):
        super().__init__()
        pool = _Pool()
        self.blocks = nn.ModuleList([pool, _Feed(), _Reuse(pool), _Reuse(pool)])


@LEGACY_EXPORTER_DEPRECATED
def test_a_node_inserted_in_the_last_of_three_calls_is_named(tmp_path):
    torch.manual_seed(0)
    model, x = _PoolThrice().eval(), torch.randn(2, 5, 8)
    clean, planted = export_torchscript_at_parity(model, x, tmp_path)
    pools = [node.name for node in onnx.load(str(clean)).graph.node
             if node.op_type == "AveragePool"]
    assert len(pools) == 3
    node, _ = plant(clean, planted, insert_mul(pools[-1], 1.5))
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=planted)
    assert report.culprit is not None and report.culprit.onnx_node == node, report.summary()
