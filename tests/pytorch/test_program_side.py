"""ExportedProgramSide records what forward hooks on the eager model record."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from bisect_onnx.errors import ModelError
from bisect_onnx.pytorch.module_side import TorchModuleSide
from bisect_onnx.pytorch.program_side import ExportedProgramSide


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 6)
        self.act = nn.ReLU(inplace=True)  # overwrites linear's output in place

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.linear(x))


class Halves(nn.Module):
    """Returns two tensors: recorded as ``halves[0]`` and ``halves[1]``."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x[:, :3] * 2, x[:, 3:] + 1


class Model(nn.Module):
    """``inner`` (nested) is called twice; an eval Dropout passes its input through."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()
        self.drop = nn.Dropout(0.5)
        self.halves = Halves()
        self.head = nn.Sequential(nn.Linear(3, 4), nn.Tanh())

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.inner(self.drop(self.inner(x)))
        a, b = self.halves(y)
        return self.head(a - b), b


@pytest.fixture(scope="module")
def case():
    torch.manual_seed(0)
    model = Model().eval()
    x = torch.randn(2, 6)
    exported = torch.export.export(model, (x,))
    return model, exported, [x.numpy()]


def test_names_values_and_order_match_the_eager_hooks(case):
    model, exported, inputs = case
    eager = TorchModuleSide(model).run(inputs)
    graph = ExportedProgramSide(exported).run(inputs)

    assert list(graph.values) == list(eager.values)
    assert "inner@1" in graph.values and "inner.linear@1" in graph.values
    assert {"halves[0]", "halves[1]"} <= set(graph.values)
    for name, value in graph.values.items():
        expected = eager.values[name]
        np.testing.assert_allclose(value.array, expected.array, rtol=1e-6, atol=1e-6,
                                   err_msg=name)
        for field in ("module", "call", "module_class", "same_as"):
            assert getattr(value.provenance, field) == getattr(expected.provenance, field), \
                (name, field)
    # Copied before the in-place ReLU ran: the linear output keeps its negatives.
    assert (graph.values["inner.linear"].array < 0).any()
    assert graph.values["drop"].provenance.same_as == "inner"
    assert graph.values["inner.linear@1"].provenance.torch_op == "aten.linear.default"


def test_final_outputs_match(case):
    model, exported, inputs = case
    eager = TorchModuleSide(model).run(inputs)
    graph = ExportedProgramSide(exported).run(inputs)
    assert [value.name for value in graph.outputs] == ["output[0]", "output[1]"]
    for mine, theirs in zip(graph.outputs, eager.outputs, strict=True):
        assert mine.name == theirs.name
        np.testing.assert_allclose(mine.array, theirs.array, rtol=1e-6, atol=1e-6)


def test_survives_save_and_load(case, tmp_path):
    model, exported, inputs = case
    path = tmp_path / "model.pt2"
    torch.export.save(exported, path)
    side = ExportedProgramSide(torch.export.load(path))
    assert side.describe() == {"kind": "exported_program", "model": "Model", "class": "Model",
                               "module_calls": 11}
    assert list(side.run(inputs).values) == list(TorchModuleSide(model).run(inputs).values)


def test_wrong_input_shape_is_a_one_line_model_error(case):
    _, exported, _ = case
    with pytest.raises(ModelError) as caught:
        ExportedProgramSide(exported).run([np.zeros((3, 5), np.float32)])
    message = str(caught.value)
    assert "\n" not in message and "float32[3,5]" in message


def test_training_mode_program_leaves_its_statistics_as_they_were():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)).train()
    exported = torch.export.export(model, (torch.randn(3, 4),))
    before = {name: tensor.clone() for name, tensor in exported.state_dict.items()}
    ExportedProgramSide(exported).run([np.ones((3, 4), np.float32)])
    for name, tensor in exported.state_dict.items():
        torch.testing.assert_close(tensor, before[name], msg=name)
