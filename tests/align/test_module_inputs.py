"""What enters a module call is compared too: values no module of its own computes.

``functional_attention`` calls ``F.gelu`` between ``fc1`` and ``fc2`` in its
``forward`` and has a Dropout after it: neither leaves a module output that would show
a divergence, so before module inputs were recorded the first failing row was ``fc2``.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import bisect_onnx
from fixtures.registry import FIXTURES, repo_path
from tests.planting import plant

MODULE_ROWS = bisect_onnx.SearchOptions(granularity="module")

FIXTURE = FIXTURES["functional_attention"]
EXPORTS = {"dynamo": FIXTURE.onnx_file, "torchscript": FIXTURE.torchscript_onnx_file}


def _module_level(fixture_case, onnx_path, model=None):
    default_model, inputs, _ = fixture_case(FIXTURE.name)
    return bisect_onnx.bisect(model or default_model, inputs, onnx_model=onnx_path,
                              search=MODULE_ROWS)


def _gelu_divisor_scaled(factor: float):
    """Scale the divisor of the GELU's Div (an initializer or a Constant's output)."""

    def edit(model: onnx.ModelProto) -> onnx.NodeProto:
        divs = [node for node in model.graph.node if node.op_type == "Div"
                and any(consumer.op_type == "Erf" and node.output[0] in consumer.input
                        for consumer in model.graph.node)]
        assert len(divs) == 1, "the model has one erf GELU"
        div = divs[0]
        source = div.input[1]
        initializer = next((init for init in model.graph.initializer if init.name == source),
                           None)
        if initializer is None:
            constant = next(node for node in model.graph.node if source in node.output)
            tensor = next(attr.t for attr in constant.attribute if attr.name == "value")
        else:
            tensor = initializer
        array = numpy_helper.to_array(tensor)
        model.graph.initializer.append(numpy_helper.from_array(
            (array * factor).astype(array.dtype), f"{source}_planted"))
        div.input[1] = f"{source}_planted"
        return div

    return edit


def _reader_of(model_path, consumer_op: str, module: str) -> str:
    """The node that makes the value ``module``'s first ``consumer_op`` reads."""
    model = onnx.load(str(model_path))
    producers = {output: node.name for node in model.graph.node for output in node.output}
    for node in model.graph.node:
        named = node.name.startswith(f"/{module}/")
        scoped = any(prop.key == "pkg.torch.onnx.name_scopes" and f"'{module}'" in prop.value
                     for prop in node.metadata_props)
        if node.op_type == consumer_op and (named or scoped):
            return producers[node.input[0]]
    raise LookupError(f"no {consumer_op} in {module}")


@pytest.mark.parametrize("exporter", EXPORTS)
def test_faithful_export_compares_the_values_between_modules(fixture_case, exporter):
    report = _module_level(fixture_case, repo_path(EXPORTS[exporter]))

    assert report.verdict == "parity" and report.hidden_divergences == []
    rows = [record.torch_module for record in report.comparisons]
    # The residual sum (fc1's input) and the GELU (fc2's input) have no module of their own.
    assert {"fc1 (input)", "fc2 (input)"} <= set(rows), rows
    # An input that is the previous module's output, unchanged, is not compared twice.
    assert "norm (input)" not in rows and "attn (input)" not in rows
    values = [record.onnx_value for record in report.comparisons]
    assert len(values) == len(set(values))


@pytest.mark.parametrize("exporter", EXPORTS)
def test_function_call_between_modules_is_caught_at_the_next_modules_input(
        fixture_case, tmp_path, exporter):
    planted = tmp_path / "planted.onnx"
    plant(repo_path(EXPORTS[exporter]), planted, _gelu_divisor_scaled(1.05))

    report = _module_level(fixture_case, planted)

    first = report.first_divergence
    assert report.final_outputs[0].failed, "the plant must change the output"
    assert first.torch_module == "fc2 (input)"
    # At the GELU's last node, the value fc2's MatMul reads: not in fc2.
    assert first.onnx_node == _reader_of(planted, "MatMul", "fc2")
    assert not any(record.failed for record in report.comparisons[: first.index])


@pytest.mark.parametrize("exporter", EXPORTS)
def test_training_mode_dropout_is_caught_at_the_value_it_hands_on(fixture_case, exporter):
    model, _, _ = fixture_case(FIXTURE.name)
    model.drop.train()
    try:
        report = _module_level(fixture_case, repo_path(EXPORTS[exporter]), model)
    finally:
        model.eval()

    first = report.first_divergence
    assert first.torch_module == "fc2 (input)", [r.torch_module for r in report.comparisons]
    by_module = {record.torch_module: record for record in report.comparisons}
    assert by_module["fc2 (input)"].failed and not by_module["fc1"].failed


def test_eager_side_records_inputs_once_and_shares_unchanged_copies(fixture_case):
    from bisect_onnx.pytorch.module_side import TorchModuleSide

    model, inputs, _ = fixture_case(FIXTURE.name)
    capture = TorchModuleSide(model).run(list(inputs.values()))

    # attn(h, h, h): one tensor, one input.
    assert "attn (input)" in capture.values and "attn (input 1)" not in capture.values
    assert capture.values["attn (input)"].array is capture.values["norm"].array
    np.testing.assert_array_equal(capture.values["norm (input)"].array, inputs["x"])
    # The Dropout hands its input back: compared there, as before.
    assert capture.values["drop"].provenance.same_as == "drop (input)"
