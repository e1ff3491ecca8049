"""A dynamo export converted to an older opset: its metadata is gone, its layers are not.

ONNX's version converter drops every node's metadata, so nothing in the file says
which module a node came from. The file is matched by structure to an export made
here, at parity as on a divergence: the run compares its layers, not only its outputs.
"""

from __future__ import annotations

import onnx
from onnx import version_converter

import bisect_onnx
from tests.planting import plant, scale_initializer_input


def _converted(source, target):
    model = version_converter.convert_version(onnx.load(str(source)), 17)
    assert not any(node.metadata_props for node in model.graph.node)
    onnx.save(model, str(target))
    return target


def test_a_converted_clean_file_is_compared_layer_by_layer_at_parity(fixture_case, tmp_path):
    model, inputs, path = fixture_case("tiny_transformer")
    report = bisect_onnx.bisect(model, inputs, onnx_model=_converted(path, tmp_path / "17.onnx"))
    assert report.verdict == "parity"
    assert report.coverage.aligned_values >= report.coverage.onnx_values // 2
    assert report.hidden_divergences == []
    assert report.comparisons and all(row.match.matched_by for row in report.comparisons)


def test_a_plant_in_a_converted_file_is_named(fixture_case, tmp_path):
    model, inputs, path = fixture_case("tiny_transformer")
    weights = {init.name for init in onnx.load(str(path)).graph.initializer}
    second = [node for node in onnx.load(str(path)).graph.node
              if node.op_type == "MatMul" and node.input[1] in weights][1]
    planted, _ = plant(path, tmp_path / "planted.onnx",
                       scale_initializer_input(second.name, 1, 1.5))
    report = bisect_onnx.bisect(model, inputs,
                                onnx_model=_converted(tmp_path / "planted.onnx",
                                                      tmp_path / "17.onnx"))
    assert report.verdict == "diverged"
    # The planted MatMul, or the op it is part of: a file matched by structure is not
    # looked inside (linear is MatMul then Add, named by its last node).
    graph = onnx.load(str(tmp_path / "17.onnx")).graph
    matmul = next(node for node in graph.node if node.name == planted)
    its_op = {node.name for node in graph.node if matmul.output[0] in node.input
              and node.op_type == "Add"}
    assert report.culprit is not None and report.culprit.onnx_node in {planted, *its_op}
