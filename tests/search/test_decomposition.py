"""Looking inside the ONNX segment of one FX op: real exports of tiny_transformer, real ORT.

Each test plants a change in one node of a multi-node segment (the MatMul of an
``aten.linear``, the Div of an ``aten.gelu``) and checks that the op exported alone
points at that node, not at the segment's last node that bears the FX name.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from bisect_onnx.graph.provenance import read_torch_metadata
from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner
from bisect_onnx.search.decomposition import (
    localize_in_segment,
    pair_by_structure,
    translate_alone,
)
from fixtures.registry import FIXTURES, OPSET, build_model, load_inputs
from tests.planting import node_of_module
from tests.torch_warnings import DYNAMO_LEAFSPEC_DEPRECATED

pytestmark = DYNAMO_LEAFSPEC_DEPRECATED

RTOL, ATOL = 1e-3, 1e-5


class _Recorder(torch.fx.Interpreter):
    """Keeps a copy of every tensor node's output, by node name."""

    def __init__(self, module: torch.fx.GraphModule) -> None:
        super().__init__(module)
        self.values: dict[str, np.ndarray] = {}

    def run_node(self, node: torch.fx.Node):
        result = super().run_node(node)
        if isinstance(result, torch.Tensor):
            self.values[node.name] = result.detach().clone().numpy()
        return result


@dataclass(frozen=True)
class Exported:
    """tiny_transformer exported once, and its PyTorch values."""

    model: onnx.ModelProto
    program: torch.export.ExportedProgram
    reference: dict[str, np.ndarray]
    """FX node name -> the value PyTorch computed."""
    inputs: list[np.ndarray]
    folder: Path
    """Where the tests save the models they run."""


def _export(name: str, tmp_path_factory) -> Exported:
    fixture = FIXTURES[name]
    inputs = list(load_inputs(fixture).values())
    program = torch.onnx.export(build_model(fixture), tuple(torch.from_numpy(a) for a in inputs),
                                dynamo=True, opset_version=OPSET)
    recorder = _Recorder(program.exported_program.module())
    with torch.no_grad():
        recorder.run(*(torch.from_numpy(a) for a in inputs))
    folder = tmp_path_factory.mktemp(f"decomposition-{name}")
    return Exported(program.model_proto, program.exported_program, recorder.values, inputs,
                    folder)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Exported:
    return _export("tiny_transformer", tmp_path_factory)


@pytest.fixture(scope="module")
def attention(tmp_path_factory) -> Exported:
    """An nn.MultiheadAttention, whose SDPA segment lost a Reshape to the optimizer."""
    return _export("functional_attention", tmp_path_factory)


def _candidate_values(model: onnx.ModelProto, inputs, path: Path) -> dict[str, np.ndarray]:
    onnx.save(model, str(path))
    capture = OnnxRuntimeRunner(path, promote="all").run(inputs).capture  # every intermediate
    return {name: value.array for name, value in capture.values.items()}


def _fx_node(program, name: str) -> torch.fx.Node:
    return next(node for node in program.graph.nodes if node.name == name)


def _fx_name(node: onnx.NodeProto) -> str | None:
    meta = read_torch_metadata({p.key: p.value for p in node.metadata_props})
    return meta.fx_node if meta else None


def _segment(model: onnx.ModelProto, fx_name: str) -> list[onnx.NodeProto]:
    return [node for node in model.graph.node if _fx_name(node) == fx_name]


def _localize(exported: Exported, model: onnx.ModelProto, fx_name: str, file_name: str):
    """Run ``model`` in ORT and look inside ``fx_name``'s segment of it."""
    candidate = _candidate_values(model, exported.inputs, exported.folder / file_name)
    program = exported.program
    return localize_in_segment(_fx_node(program, fx_name), program, exported.reference,
                               _segment(model, fx_name), candidate, rtol=RTOL, atol=ATOL,
                               opset=OPSET)


def _scale_initializer_input(model: onnx.ModelProto, node: onnx.NodeProto, index: int,
                             factor: float) -> None:
    """Feed ``node`` a scaled copy of its initializer input ``index`` (others keep theirs)."""
    source = next(init for init in model.graph.initializer if init.name == node.input[index])
    array = numpy_helper.to_array(source)
    planted = numpy_helper.from_array((array * factor).astype(array.dtype),
                                      f"{source.name}_planted")
    model.graph.initializer.append(planted)
    node.input[index] = planted.name


def test_planted_matmul_weight_is_found_inside_linear(exported):
    model = copy.deepcopy(exported.model)
    matmul = node_of_module(model, "blocks.0.mlp.fc1", "MatMul")
    _scale_initializer_input(model, matmul, 1, 1.01)
    fx_name = _fx_name(matmul)
    assert [node.op_type for node in _segment(model, fx_name)] == ["MatMul", "Add"]

    finding = _localize(exported, model, fx_name, "matmul.onnx")

    assert (finding.node, finding.value) == (matmul.name, matmul.output[0]), finding.how
    assert finding.compared == 1


def test_planted_gelu_divisor_is_found_inside_gelu(exported):
    model = copy.deepcopy(exported.model)
    div = node_of_module(model, "blocks.0.mlp.act", "Div")
    # The divisor (sqrt 2) is shared by both GELUs: only this Div gets the changed copy.
    _scale_initializer_input(model, div, 1, 1.01)
    fx_name = _fx_name(div)
    assert [node.op_type for node in _segment(model, fx_name)][0] == "Div"

    finding = _localize(exported, model, fx_name, "gelu.onnx")

    assert (finding.node, finding.value) == (div.name, div.output[0]), finding.how
    assert finding.compared == 1


def test_unplanted_segment_agrees_everywhere(exported):
    model = exported.model
    fx_name = _fx_name(node_of_module(model, "blocks.0.mlp.act", "Div"))

    finding = _localize(exported, model, fx_name, "original.onnx")

    assert finding.node is None and finding.value is None
    assert finding.compared == len(_segment(model, fx_name))
    assert "values of" in finding.how and "agree with" in finding.how, finding.how


def test_one_node_segment_is_that_node(exported):
    model, program, reference = exported.model, exported.program, exported.reference
    softmax = node_of_module(model, "blocks.0.attn", "Softmax")
    fx_name = _fx_name(softmax)
    assert _segment(model, fx_name) == [softmax]

    # No export and no values needed: candidate values are not even looked at.
    finding = localize_in_segment(_fx_node(program, fx_name), program, reference, [softmax],
                                  {}, rtol=RTOL, atol=ATOL, opset=OPSET)

    assert (finding.node, finding.value, finding.compared) == (softmax.name, softmax.output[0], 0)


def test_segment_that_matches_the_fresh_translation_but_not_torch_says_so(exported):
    model, program, reference = exported.model, exported.program, exported.reference
    fx_name = _fx_name(node_of_module(model, "blocks.0.mlp.act", "Div"))
    # As if torch computed another GELU: the ONNX side agrees with its own translation.
    skewed = {**reference, fx_name: reference[fx_name] * np.float32(1.01) + np.float32(0.01)}
    candidate = _candidate_values(model, exported.inputs, exported.folder / "skewed.onnx")

    finding = localize_in_segment(_fx_node(program, fx_name), program, skewed,
                                  _segment(model, fx_name), candidate, rtol=RTOL, atol=ATOL,
                                  opset=OPSET)

    assert finding.node is None and finding.compared == 5
    assert "matches aten.gelu.default exported alone" in finding.how, finding.how


def test_segments_in_another_order_are_paired_by_data_flow(exported):
    model, program, reference = exported.model, exported.program, exported.reference
    fx_name = _fx_name(node_of_module(model, "blocks.0.mlp.act", "Div"))
    reordered = list(reversed(_segment(model, fx_name)))
    fresh_nodes = translate_alone(_fx_node(program, fx_name), program, reference, OPSET).nodes

    pairs = pair_by_structure(reordered, fresh_nodes)

    assert {name: node.op_type for name, node in pairs.items()} == {
        node.name: node.op_type for node in reordered}


def test_segments_that_cannot_be_paired_name_nothing(exported):
    model, program, reference = exported.model, exported.program, exported.reference
    fx_name = _fx_name(node_of_module(model, "blocks.0.mlp.act", "Div"))
    # The fc1 Linear's nodes offered as the GELU's: no op type meets at the output.
    foreign = _segment(model, _fx_name(node_of_module(model, "blocks.0.mlp.fc1", "MatMul")))

    finding = localize_in_segment(_fx_node(program, fx_name), program, reference, foreign,
                                  {}, rtol=RTOL, atol=ATOL, opset=OPSET)

    assert (finding.node, finding.compared) == (None, 0)
    assert "cannot pair nodes" in finding.how and "Div-Erf-Add-Mul-Mul" in finding.how


def test_softmax_inside_sdpa_is_found_though_the_segments_differ(attention):
    model = copy.deepcopy(attention.model)
    softmax = next(node for node in model.graph.node if node.op_type == "Softmax")
    fx_name = _fx_name(softmax)
    segment_ops = [node.op_type for node in _segment(model, fx_name)]
    fresh_nodes = translate_alone(_fx_node(attention.program, fx_name), attention.program,
                                  attention.reference, OPSET).nodes
    # The optimizer folded SDPA's first Reshape into the attention's own: no sequence match.
    assert segment_ops != [node.op_type for node in fresh_nodes]
    assert segment_ops.count("Softmax") == 1
    set_attribute_in_place(softmax, "axis", 1)

    finding = _localize(attention, model, fx_name, "sdpa_softmax.onnx")

    assert (finding.node, finding.value) == (softmax.name, softmax.output[0]), finding.how
    assert finding.compared == segment_ops.index("Softmax") + 1


def test_unplanted_sdpa_segment_agrees_everywhere(attention):
    model = attention.model
    fx_name = _fx_name(next(node for node in model.graph.node if node.op_type == "Softmax"))

    finding = _localize(attention, model, fx_name, "sdpa.onnx")

    assert finding.node is None
    assert finding.compared == len(_segment(model, fx_name)), finding.how


def set_attribute_in_place(node: onnx.NodeProto, name: str, value: object) -> None:
    kept = [attribute for attribute in node.attribute if attribute.name != name]
    del node.attribute[:]
    node.attribute.extend([*kept, onnx.helper.make_attribute(name, value)])


def test_missing_input_value_is_a_reason_not_an_exception(exported):
    model, program, reference = exported.model, exported.program, exported.reference
    matmul = node_of_module(model, "blocks.0.mlp.fc1", "MatMul")
    fx_node = _fx_node(program, _fx_name(matmul))
    without_input = {name: value for name, value in reference.items()
                     if name != fx_node.args[0].name}

    finding = localize_in_segment(fx_node, program, without_input,
                                  _segment(model, fx_node.name), {}, rtol=RTOL, atol=ATOL,
                                  opset=OPSET)

    assert (finding.node, finding.compared) == (None, 0)
    assert f"input {fx_node.args[0].name} has no reference value" in finding.how, finding.how
