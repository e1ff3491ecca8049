"""One module call exported alone gets the whole model's FX names, exactly or not at all."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from bisect_onnx.pytorch.call_names import UNNAMED, MadeFrom, NamesRefused, map_call_names
from bisect_onnx.pytorch.exporting import as_translated
from bisect_onnx.pytorch.program_side import module_stack, op_name


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)) + x)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 1)
        self.first, self.second = _Block(), _Block()

    def forward(self, x):
        return self.second(self.first(self.stem(x)))


@pytest.fixture(scope="module")
def programs():
    """The whole model's program, the second block's alone, and what the file would say."""
    torch.manual_seed(0)
    model = _Net().eval()
    x = torch.randn(1, 3, 8, 8)
    whole = as_translated(torch.export.export(model, (x,), strict=False))
    entering = model.first(model.stem(x)).detach()
    alone = as_translated(torch.export.export(model.second, (entering,), strict=False))
    inside = [node for node in whole.graph.nodes if node.op == "call_function" and any(
        path == "second" for path, _ in module_stack(node).values())]
    # The file names the ops it made nodes of (not the getitems), and what each read.
    known = {node.name: MadeFrom(op_name(node), tuple(source.name
                                                      for source in node.all_input_nodes))
             for node in inside if op_name(node)}
    elsewhere = {node.name for node in whole.graph.nodes
                 if node.op == "call_function" and node not in inside}
    return whole, alone, inside, known, elsewhere


def test_every_op_of_the_call_gets_its_whole_model_name_and_op(programs):
    whole, alone, inside, known, elsewhere = programs
    names = map_call_names(alone, "second", known, elsewhere)
    by_name = {node.name: node for node in whole.graph.nodes}
    assert sorted(names.ops.values()) == sorted(node.name for node in inside)
    for node in alone.graph.nodes:
        if node.op == "call_function":
            assert op_name(by_name[names.ops[node.name]]) == op_name(node)
    # The block's input is the first block's output, by its whole-model name.
    assert list(names.inputs.values()) == [inside[0].all_input_nodes[0].name]


def _one_changed(known, change):
    name = next(name for name, origin in known.items() if origin.op == "aten.add.Tensor")
    return {**known, name: change(known[name])}


@pytest.mark.parametrize("spoil", [
    lambda known, _: _one_changed(known, lambda origin: replace(origin, op="aten.sub.Tensor")),
    lambda known, _: _one_changed(known, lambda origin: replace(origin,
                                                                reads=origin.reads[::-1])),
    lambda known, _: {**known, "relu_99": MadeFrom("aten.relu.default", None)},
], ids=["another-op", "other-reads", "an-op-more"])
def test_a_call_that_differs_from_the_file_is_refused(programs, spoil):
    _, alone, _, known, elsewhere = programs
    with pytest.raises(NamesRefused):
        map_call_names(alone, "second", spoil(known, elsewhere), elsewhere)


def test_a_name_the_file_gives_outside_the_call_is_refused(programs):
    _, alone, inside, known, elsewhere = programs
    with pytest.raises(NamesRefused, match="outside the call"):
        map_call_names(alone, "second", known, {*elsewhere, inside[-1].name})


def test_an_op_kind_the_file_never_names_gets_no_file_name(programs):
    # As torch.ones for a causal mask, folded into a constant: no node, nothing reads it
    # by name. The other ops keep their exact names; that one gets a name no FX node has.
    whole, alone, inside, known, elsewhere = programs
    folded = {name: origin for name, origin in known.items() if not name.startswith("relu")}
    names = map_call_names(alone, "second", folded, elsewhere)
    exact = map_call_names(alone, "second", known, elsewhere)
    for own, name in names.ops.items():
        if own.startswith("relu"):
            assert name.endswith(UNNAMED) and name not in {n.name for n in whole.graph.nodes}
        else:
            assert name == exact.ops[own]
