"""TorchScript scopes read back to module paths, where a level is left out of them too."""

from __future__ import annotations

from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.graph.scopes import read_scopes

# SqueezeBERT's encoder calls its layers through ``layer.forward(...)``: the exporter
# records no ``layers.N`` scope, so both layers' modules show under ``encoder``.
PATHS = ["model", "model.encoder", "model.encoder.layers",
         *(f"model.encoder.layers.{n}{suffix}" for n in (0, 1)
           for suffix in ("", ".attention", ".attention.query"))]


def _scope(name: str):
    node = NodeInfo(0, name, name.rsplit("/", 1)[1], ("out",), None, ("in",))
    nodes = [node, NodeInfo(1, "/model/Relu", "Relu", ("y",), None, ("out",))]
    return read_scopes(nodes, PATHS)[0]


def test_scopes_that_leave_a_level_out_are_the_same_named_modules_in_order():
    first = _scope("/model/encoder/attention/Reshape")
    assert first.modules[-1] == "model.encoder.layers.0.attention" and first.complete
    second = _scope("/model/encoder/attention_1/Reshape")
    assert second.modules[-1] == "model.encoder.layers.1.attention"
    assert second.calls == {"model.encoder.layers.1.attention": 0}
    # The second layer's query: its enclosing scope unsuffixed, its own suffixed.
    query = _scope("/model/encoder/attention/query_1/Conv")
    assert query.modules[-1] == "model.encoder.layers.1.attention.query"
    assert query.calls == {"model.encoder.layers.1.attention.query": 0}


def test_a_module_called_twice_keeps_its_call_number():
    paths = ["model", "model.act"]
    node = NodeInfo(0, "/model/act_1/Relu", "Relu", ("out",), None, ("in",))
    scope = read_scopes([node, NodeInfo(1, "/model/Add", "Add", ("y",), None, ("out",))],
                        paths)[0]
    assert scope.modules == ("model", "model.act") and scope.calls == {"model.act": 1}
