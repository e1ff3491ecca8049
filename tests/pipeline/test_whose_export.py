"""An ONNX file of another model, or of other weights, is said to be so before any culprit."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

import bisect_onnx
from bisect_onnx.graph.nodes import read_nodes
from bisect_onnx.pytorch.whose_export import check_file_identity
from bisect_onnx.report.verdict import verdict_line
from fixtures.registry import FIXTURES, build_model, repo_path
from tests.planting import plant, scale_conv_weight


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class OneLayer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.c(x))


X = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)


def _export(model: torch.nn.Module, path) -> str:
    torch.onnx.export(model.eval(), (torch.from_numpy(X),), str(path), dynamo=False)
    return str(path)


def _another_model(report) -> list[str]:
    return [warning for warning in report.warnings
            if getattr(warning, "code", None) == "another-model"]


@pytest.mark.parametrize("other", ["architecture", "weights"])
def test_the_file_of_another_model_is_said_to_be_so_first(tmp_path, other):
    torch.manual_seed(0)
    model = TwoLayers().eval()
    torch.manual_seed(1)
    path = _export(OneLayer() if other == "architecture" else TwoLayers(), tmp_path / "o.onnx")
    report = bisect_onnx.bisect(model, [X], onnx_model=path,
                                output=bisect_onnx.OutputOptions(repro_dir=tmp_path / "r"))
    assert report.verdict == "diverged"
    assert report.repro is None  # no node of it to file upstream
    [warning] = _another_model(report)
    assert ("modules its nodes name are not in the model (c)" in warning
            if other == "architecture" else "4 of its 4 weights" in warning)
    headline = verdict_line(report).splitlines()[0]
    assert headline.startswith("DIVERGED: the ONNX file is not this model's export")
    assert "file it with" not in verdict_line(report)


def test_a_plant_in_the_models_own_file_is_no_other_model(fixture_case, tmp_path):
    model, inputs, path = fixture_case("resnet_like")
    plant(path, tmp_path / "planted.onnx", scale_conv_weight("layer1.bn2", 1.05))
    report = bisect_onnx.bisect(model, inputs, onnx_model=tmp_path / "planted.onnx")
    assert report.verdict == "diverged" and not _another_model(report)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_fixture_file_is_its_models_export(name):
    """Folded BatchNorms (new values under the Conv's weight name) included."""
    fixture = FIXTURES[name]
    path = repo_path(fixture.onnx_file)
    model = onnx.load(str(path), load_external_data=False)
    identity = check_file_identity(build_model(fixture), model, read_nodes(model.graph),
                                   path.parent)
    assert identity.another_model is None
    assert identity.weights_compared > 0
