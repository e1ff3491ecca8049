"""Culprit attribution end to end: which failing value introduced the error, and whose bug."""

from __future__ import annotations

import onnx
import torch
from torch import nn

import bisect_onnx
from tests.planting import fx_segment, plant, scale_conv_weight, scale_initializer_input

EVERY_CULPRIT = bisect_onnx.SearchOptions(all_culprits=True)


def test_a_planted_edit_is_introduced_at_its_node_and_inherited_after_it(fixture_case,
                                                                          tmp_path):
    model, inputs, exported = fixture_case("resnet_like")
    planted = tmp_path / "planted.onnx"
    plant(exported, planted, scale_conv_weight("layer2.bn1", 1.003))
    report = bisect_onnx.bisect(model, inputs, onnx_model=planted, search=EVERY_CULPRIT)
    failing = [record for record in report.comparisons if record.failed]
    culprit = report.culprit
    # The planted Conv (BatchNorm folded in), even where ONNX Runtime fused it with the
    # ReLU after it, so that only the ReLU's output was captured.
    assert culprit is not None and culprit.torch_module == "layer2.bn1"
    assert culprit.onnx_op == "Conv" and culprit.local.introduced_here is True
    assert culprit.local.max_abs_error is not None and culprit.local.status != "pass"
    assert failing[0].local.introduced_here is True
    assert all(record.local.introduced_here is False for record in failing[1:])
    assert [record.onnx_value for record in report.culprits] == [culprit.onnx_value]
    assert culprit.local.classification == "graph semantics"
    assert report.attribution.inputs  # which inputs the node was fed, and from where
    assert set(report.attribution.inputs.values()) <= {"reference", "candidate",
                                                          "graph_input"}
    summary = report.summary()
    # The culprit leads the verdict, before the first failing value that carries it.
    assert summary.startswith(f"DIVERGED: culprit ONNX node {culprit.onnx_node!r}")
    assert "introduces the error" in summary and "graph semantics" in summary
    assert "layer2.bn1" in summary.partition("First failing value")[0]


def test_two_independent_edits_are_the_only_two_culprits(fixture_case, tmp_path):
    model, inputs, exported = fixture_case("tiny_transformer")
    proto = onnx.load(str(exported), load_external_data=False)
    first = fx_segment(proto, "linear_4")[0]   # blocks.0.mlp.fc1's MatMul
    second = fx_segment(proto, "linear_9")[0]  # blocks.1.attn.out's MatMul
    once, twice = tmp_path / "once.onnx", tmp_path / "twice.onnx"
    plant(exported, once, scale_initializer_input(first.name, 1, 1.01))
    plant(once, twice, scale_initializer_input(second.name, 1, 1.01))
    report = bisect_onnx.bisect(model, inputs, onnx_model=twice, search=EVERY_CULPRIT)
    assert [record.fx_node for record in report.culprits] == ["linear_4", "linear_9"]
    failing = [record for record in report.comparisons if record.failed]
    assert len(failing) > 2  # everything after the first edit fails, yet only two are blamed
    assert all(record.local.introduced_here is False for record in failing
               if record.fx_node not in ("linear_4", "linear_9"))
    # Without --all-culprits the search stops at the first.
    first_only = bisect_onnx.bisect(model, inputs, onnx_model=twice)
    assert first_only.culprits is None and first_only.culprit.fx_node == "linear_4"
    assert first_only.culprit.onnx_op == "MatMul"  # the node inside the Linear


def test_an_exporter_semantics_difference_is_classified_as_graph_semantics(fixture_case):
    model, inputs, exported = fixture_case("avgpool_divisor")
    report = bisect_onnx.bisect(model, inputs, onnx_model=exported)
    culprit = report.culprit
    assert culprit is not None and culprit.torch_module == "pool"
    assert culprit.local.classification == "graph semantics"
    classification = report.attribution.classification
    assert classification["torch_vs_onnx64"] > 0.1
    assert "exporter" in classification["file_with"]
    assert "graph semantics" in report.summary()


class DeepTanh(nn.Module):
    """Many small layers: float rounding only, which a tight tolerance turns into failures."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.Tanh())
                                      for _ in range(12)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def test_float_noise_with_a_tight_tolerance_is_float_precision_not_a_culprit():
    model = DeepTanh().eval()
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)).numpy()
    report = bisect_onnx.bisect(model, x, tolerance=(1e-7, 0.0),
                                search=EVERY_CULPRIT)
    assert report.verdict == "diverged"
    assert report.culprit is None and report.culprits == []
    failing = [record for record in report.comparisons if record.failed]
    assert failing[0].local.classification == "float precision"
    assert report.attribution.noise
    assert "float rounding" in report.summary()
