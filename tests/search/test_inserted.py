"""A node inserted into a graph (no counterpart in the reference) is named as the culprit."""

from __future__ import annotations

import pytest

import bisect_onnx
from fixtures.registry import FIXTURES, repo_path
from tests.planting import insert_mul, plant

CASES = [  # fixture, export, the node the inserted Mul follows
    ("resnet_like", "onnx_file", "node_Conv_146"),  # inside a Conv+ReLU kernel
    ("resnet_like", "onnx_file", "node_add"),
    ("resnet_like", "torchscript_onnx_file", "/layer2/conv1/Conv"),
    ("tiny_mlp", "onnx_file", "node_relu"),
    ("tiny_mlp", "torchscript_onnx_file", "/relu/Relu"),
]


@pytest.mark.parametrize(("name", "kind", "after"), CASES)
@pytest.mark.parametrize("form", ["pytorch", "onnx"])
def test_an_inserted_node_is_the_culprit_not_its_consumer(fixture_case, tmp_path, name, kind,
                                                           after, form):
    model, inputs, _ = fixture_case(name)
    clean, planted = repo_path(getattr(FIXTURES[name], kind)), tmp_path / "inserted.onnx"
    inserted, _ = plant(clean, planted, insert_mul(after, 1.5))
    report = (bisect_onnx.bisect(model, inputs, onnx_model=planted) if form == "pytorch"
              else bisect_onnx.bisect_onnx_models(clean, planted, list(inputs.values())))
    assert report.diverged or report.hidden_divergences
    assert report.culprit is not None, report.summary()
    assert report.culprit.onnx_node == inserted
    # Its consumers only inherit (a kernel's output checked whole holds the culprit).
    kernel = (report.attribution.get("inside_kernel") or {}).get("kernel_output")
    assert not any(row.introduced_here for row in report.comparisons
                   if row.onnx_node != inserted and row.onnx_value != kernel)
