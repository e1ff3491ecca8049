"""Which node holds a traced op's value comes from the TorchScript exporter itself.

Each traced op is translated alone by the exporter's own symbolic function, at the
file's opset; the ONNX nodes it became say which one holds the op's value. The hand
table (``align/script_table.py``) answers only where the exporter cannot be asked or
refuses the op alone.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from bisect_onnx.align.script_ends import Chain, HandsBack, chain_of, output_ends
from bisect_onnx.align.script_table import END_OF
from bisect_onnx.pytorch.script_ops import capture_script_ops, trace_script


class _Call(nn.Module):
    def __init__(self, function, *modules: nn.Module):
        super().__init__()
        self.function, self.layers = function, nn.ModuleList(modules)

    def forward(self, x):
        return self.function(x * 0.5, *self.layers)


def _capture(function, *modules: nn.Module, shape=(2, 8, 16)):
    model, x = _Call(function, *modules).eval(), torch.randn(*shape)
    return capture_script_ops(trace_script(model, [x.numpy()]), [x.numpy()])


def _chain(function, *modules: nn.Module, name: str, opset: int = 18, output: int = 0):
    capture = _capture(function, *modules)
    return chain_of(capture.records.of(name, opset), output)


def test_gelu_and_floor_divide_are_what_the_exporter_writes():
    gelu = _capture(F.gelu).records.of("gelu", 18)
    assert [node.kind for node in gelu.nodes] == [
        "Constant", "Div", "Erf", "Constant", "Add", "Mul", "Constant", "Mul"]
    division = _capture(lambda y: torch.floor_divide(y, y.abs() + 1))
    assert division.records.of("floor_divide", 18).kinds == ["Div", "Cast", "Cast"]


def test_the_record_follows_the_files_opset():
    # From opset 20 the exporter writes GELU as one Gelu node.
    assert _capture(F.gelu).records.of("gelu", 20).kinds == ["Gelu"]
    assert _chain(F.gelu, name="gelu", opset=20) == Chain(("Gelu",))


@pytest.mark.parametrize(("name", "function", "modules", "kinds", "reads"), [
    # The last Mul reads the one before and a constant; that one reads the Add of erf.
    ("gelu", F.gelu, (), ("Mul", "Mul"), {"Div", "Erf", "Add"}),
    ("gelu", lambda y: F.gelu(y, approximate="tanh"), (), ("Mul", "Mul"), {"Tanh"}),
    # Truncated, not floored: the value the Cast back holds is the export's.
    ("floor_divide", lambda y: torch.floor_divide(y, 0.7), (), ("Div", "Cast", "Cast"), set()),
    ("linear", lambda y, fc: fc(y), (nn.Linear(16, 4),), ("MatMul", "Add"), set()),
    ("linear", lambda y, fc: fc(y[0]), (nn.Linear(16, 4),), ("Gemm",), set()),
    ("softplus", lambda y: F.softplus(y, beta=2.0), (), ("Mul", "Softplus", "Div"), set()),
    ("rsqrt", lambda y: torch.rsqrt(y.abs() + 1), (), ("Sqrt", "Div"), set()),
    ("scaled_dot_product_attention", lambda y: F.scaled_dot_product_attention(y, y, y), (),
     ("MatMul",), {"Softmax", "MatMul"}),
    ("mish", F.mish, (), ("Mul",), {"Softplus", "Tanh"}),
])
def test_the_node_holding_an_ops_value_ends_the_exporters_chain(name, function, modules,
                                                                 kinds, reads):
    chain = _chain(function, *modules, name=name)
    assert isinstance(chain, Chain) and chain.kinds == kinds
    assert reads <= set(chain.needs)


#: Ops whose node both the table and the record name: the record reproduces the table.
AGREED = {
    "sin": torch.sin, "softmax": lambda y: F.softmax(y, -1), "relu": F.relu,
    "hardswish": F.hardswish, "cumsum": lambda y: torch.cumsum(y, -1),
    "amax": lambda y: torch.amax(y, -1), "transpose": lambda y: y.transpose(1, 2),
    "view": lambda y: y.view(2, 128), "cat": lambda y: torch.cat([y, y], -1),
    "where": lambda y: torch.where(y > 0, y, y * 2), "ne": lambda y: y != 0.1,
    "log_sigmoid": F.logsigmoid, "glu": lambda y: F.glu(y, -1),
}


@pytest.mark.parametrize("name", AGREED)
def test_the_record_ends_where_the_table_does(name):
    chain = _chain(AGREED[name], name=name)
    assert isinstance(chain, Chain) and chain.kinds[-1] in END_OF[name].types | END_OF[name].then


def test_an_op_that_hands_back_its_input_has_no_node_and_one_of_constants_none():
    capture = _capture(lambda y: F.dropout(y, training=False).contiguous() + torch.zeros_like(y))
    assert chain_of(capture.records.of("dropout", 18)) == HandsBack("mul")
    assert chain_of(capture.records.of("contiguous", 18)) == HandsBack("dropout")
    assert chain_of(capture.records.of("zeros_like", 18)) is None  # a constant of the export


def test_each_output_of_a_tuple_valued_op_is_its_nodes():
    capture = _capture(lambda y: torch.topk(y, 3, -1)[0] + torch.max(y, -1)[0][..., None])
    topk = capture.records.of("topk[0]", 18)
    assert output_ends(topk, "aten::topk") == output_ends(None, "aten::topk")  # the table's
    maximum = output_ends(capture.records.of("max[0]", 18), "aten::max")
    assert [(end.type, end.output) for end in maximum] == [("ReduceMax", 0), ("ArgMax", 0)]


def test_an_op_the_exporter_refuses_alone_falls_back_on_the_table():
    capture = _capture(lambda y: torch.special.i0(y))  # no symbolic function at opset 18
    assert capture.records.of("i0", 18) is None
    assert capture.records.of("mul", None) is None  # no opset: the table's, too
