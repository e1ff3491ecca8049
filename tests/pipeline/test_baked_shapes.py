"""Shapes an export baked in: classified and named, refused runs named, fixes checked.

Each model of ``baked_models`` is exported at one shape (the TorchScript exporter with
``dynamic_axes``, fast; the dynamo exporter with ``Dim.AUTO``, which specialises
``int()`` of a size the same way) and compared at another.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import bisect_onnx
from bisect_onnx.cli.command import main
from bisect_onnx.errors import RuntimeRefused
from bisect_onnx.search.baked_shapes import BAKED_KIND
from tests.pipeline import baked_models
from tests.pipeline.baked_models import (
    Broadcast,
    Divisor,
    Flatten,
    Loop,
    LoopSum,
    Positions,
    Symbolic,
    built,
    sample,
)
from tests.torch_warnings import DYNAMO_LEAFSPEC_DEPRECATED, LEGACY_EXPORTER_DEPRECATED

# The fixture exports the files the user would have, with both exporters; the tracer's
# own warnings on the baked lines are what it warns about.
pytestmark = [LEGACY_EXPORTER_DEPRECATED, DYNAMO_LEAFSPEC_DEPRECATED,
              pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
              pytest.mark.filterwarnings("ignore:the export baked:bisect_onnx.BisectOnnxWarning")]

MODELS_FILE = str(Path(baked_models.__file__))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``exported(model_class, shape, axes, exporter)`` -> the ONNX file, made once."""
    folder = tmp_path_factory.mktemp("baked")
    made: dict[tuple, Path] = {}

    def export(model_class, shape, axes, exporter="torchscript") -> Path:
        key = (model_class, shape, exporter)
        if key not in made:
            path = folder / f"{model_class.__name__}-{exporter}.onnx"
            args = (torch.from_numpy(sample(shape)),)
            if exporter == "torchscript":
                torch.onnx.export(built(model_class), args, str(path), dynamo=False,
                                  input_names=["x"], dynamic_axes={"x": axes})
            else:
                program = torch.onnx.export(
                    built(model_class), args, dynamo=True, verbose=False,
                    dynamic_shapes=({index: torch.export.Dim.AUTO for index in axes},))
                program.save(str(path))
            made[key] = path
        return made[key]

    return export


def _baked(report) -> dict:
    baked = report.attribution.baked_shapes
    assert baked is not None
    return baked


def test_a_divisor_traced_as_the_export_s_batch_is_classified_and_named(exported):
    path = exported(Divisor, (2, 4), {0: "batch"})
    report = bisect_onnx.bisect(built(Divisor), sample((4, 4), 1), onnx_model=path)
    assert report.diverged and report.culprit.onnx_node == "/Div"
    assert report.attribution.classification["kind"] == BAKED_KIND
    assert report.culprit.local.classification == BAKED_KIND
    baked = _baked(report)
    assert baked["export_shapes"] == [[2, 4]] and baked["run_shapes"] == [[4, 4]]
    [node] = baked["nodes"]
    assert (node["node"], node["op_type"], node["part"], node["in_file"],
            node["at_run_shapes"], node["module"]) == ("/Div", "Div", "input 1", "2.0", "4.0",
                                                       "")
    assert node["source"]["file"] == MODELS_FILE
    assert "Converting a tensor to a Python integer" in node["tracer_warning"]
    headline = report.summary().splitlines()[0]
    assert "the export baked the size of x's dimension 0 (2 when exported, 4 in this run)" \
        in headline
    assert "`y.mean(0, keepdim=True)` or `y.shape[0]` without `int()`" in headline
    assert f"{MODELS_FILE}:{node['source']['line']}" in headline
    assert [warning.code for warning in report.warnings
            if getattr(warning, "code", None) == "baked-shape"] == ["baked-shape"]


def test_the_fix_is_the_call_that_keeps_it_symbolic_checked_at_both_shapes(exported):
    path = exported(Divisor, (2, 4), {0: "batch"})
    report = bisect_onnx.bisect(built(Divisor), sample((4, 4), 1), onnx_model=path,
                                suggest_fix=True)
    [fix] = report.fixes
    assert fix.kind == "symbolic export" and fix.reaches_parity
    assert fix.change.startswith("export with dynamo=True") and "Dim.DYNAMIC" in fix.change
    assert fix.details["at_export_shapes"]["passes"]
    assert fix.details["export_shapes"] == [[2, 4]]
    # Another export at this run's shapes would reach parity without fixing the file:
    # the exporter search is not what names the fix.
    assert not any(each.kind == "other export" for each in report.fixes)
    assert "which reaches parity at the export's shapes and this run's (checked)" in \
        report.summary().splitlines()[0]


def test_the_dynamo_export_s_specialised_divisor_is_named_the_same_way(exported):
    path = exported(Divisor, (2, 4), {0: "batch"}, exporter="dynamo")
    report = bisect_onnx.bisect(built(Divisor), sample((4, 4), 1), onnx_model=path)
    [node] = _baked(report)["nodes"]
    assert (node["node"], node["op_type"], node["in_file"], node["at_run_shapes"]) == (
        "node_div", "Div", "2.0", "4.0")
    assert node["source"]["file"] == MODELS_FILE
    assert "Dim.AUTO" in _baked(report)["export_call"]
    assert "the export baked the size of x's dimension 0" in report.summary()


def test_an_expand_to_the_export_s_batch_names_what_makes_its_shape(exported):
    path = exported(Broadcast, (2, 4), {0: "batch"})
    report = bisect_onnx.bisect(built(Broadcast), sample((3, 4), 1), onnx_model=path)
    assert report.first_divergence.figures.status == "shape_mismatch"
    baked = _baked(report)
    assert {node["in_file"] for node in baked["nodes"]} == {"[2, -1]"}
    assert all(node["source"]["file"] == MODELS_FILE for node in baked["nodes"])
    assert "`y.expand(x.shape[0], -1)` without `int()`" in report.summary().splitlines()[0]


def test_a_loop_over_a_size_is_found_unrolled_and_no_fix_proposed_unchecked(exported):
    path = exported(Loop, (2, 3), {1: "n"})
    report = bisect_onnx.bisect(built(Loop), sample((2, 5), 1), onnx_model=path,
                                suggest_fix=True)
    baked = _baked(report)
    assert baked["export_shapes"] == [[2, 3]]  # found by exporting at the sizes tried
    assert {each["op_type"]: (each["in_file"], each["at_run_shapes"])
            for each in baked["unrolled"]}["Gather"] == (3, 5)
    assert "the export unrolled a Python loop over the size of x's dimension 1" in \
        report.summary().splitlines()[0]
    assert not report.fixes  # the dynamo exporter cannot trace it; nothing else fixes it
    note = next(note for note in report.fix_notes if "no export call keeps" in note)
    assert f"change line {baked['loop_source']['line']} of {MODELS_FILE}" in note


def test_a_reshape_the_runtime_refuses_names_the_node_and_the_baked_shape(exported):
    path = exported(Flatten, (1, 2, 4), {0: "batch"})
    with pytest.raises(RuntimeRefused) as caught:
        bisect_onnx.bisect(built(Flatten), sample((3, 2, 4), 1), onnx_model=path,
                           suggest_fix=True)
    error = caught.value
    assert (error.node, error.op_type, error.module) == ("/fc/Gemm", "Gemm", "fc")
    assert error.reason.startswith("GEMM: Dimension mismatch")
    [node] = error.baked.nodes
    assert (node.node, node.op_type, node.in_file) == ("/Reshape", "Reshape", "[1, -1]")
    text = str(error)
    assert "at node '/fc/Gemm' (Gemm) in module fc" in text
    assert "`x.reshape(x.shape[0], -1)`" in text
    # The dynamo exporter specialises a size of 1 even with Dim.DYNAMIC: checked, refused.
    assert "no export call keeps the size symbolic" in text


def test_a_range_the_runtime_refuses_is_named_with_the_arange_to_keep(exported):
    path = exported(Positions, (2, 3), {1: "n"})
    with pytest.raises(RuntimeRefused) as caught:
        bisect_onnx.bisect(built(Positions), sample((2, 5), 1), onnx_model=path)
    error = caught.value
    assert (error.node, error.module) == ("/Add", "")
    assert error.baked.nodes[0].in_file == "[0.0, 1.0, 2.0]"
    assert "`torch.arange(x.shape[1])` without `int()`" in str(error)


def test_an_export_made_here_at_the_first_sample_s_shape_is_checked_at_the_second():
    report = bisect_onnx.bisect(
        built(Divisor), bisect_onnx.Samples([sample((2, 4)), sample((4, 4), 1)]),
        export=bisect_onnx.ExportOptions(exporter="torchscript", dynamic_batch=True))
    assert report.attribution.classification["kind"] == BAKED_KIND
    assert _baked(report)["export_shapes"] == [[2, 4]]


def test_a_symbolic_model_at_other_shapes_is_no_false_alarm(exported):
    path = exported(Symbolic, (2, 4), {0: "batch"})
    for batch in (1, 3, 7):
        report = bisect_onnx.bisect(built(Symbolic), sample((batch, 4), batch),
                                    onnx_model=path)
        assert not report.diverged
        assert not any(getattr(warning, "code", None) == "baked-shape"
                       for warning in report.warnings)


def test_the_command_line_names_the_refused_node_in_one_line_exit_3(exported, tmp_path,
                                                                    capsys):
    path = exported(Flatten, (1, 2, 4), {0: "batch"})
    inputs = tmp_path / "x.npy"
    np.save(inputs, sample((3, 2, 4), 1))
    status = main([f"{MODELS_FILE}:flatten", "--onnx", str(path), "--input", str(inputs)])
    error = capsys.readouterr().err
    assert status == 3 and error.count("\n") == 1
    assert error.startswith("bisect-onnx: error: ONNX Runtime refused to run")
    assert "'/fc/Gemm' (Gemm) in module fc" in error and "'/Reshape'" in error


# A run at another shape than the export's must not break the report's invariants (the
# first divergence a failing row): each case below once named a passing row.


def test_a_dynamo_expand_s_wrong_shape_output_is_the_first_divergence(exported):
    path = exported(Broadcast, (2, 4), {0: "batch"}, exporter="dynamo")
    report = bisect_onnx.bisect(built(Broadcast), sample((3, 4), 1), onnx_model=path)
    first = report.first_divergence
    # No probe of production holds the output: its final-output row is the first.
    assert first.failed and first.figures.status == "shape_mismatch"
    assert first.onnx_value == report.final_outputs[0].onnx_value
    assert "the export baked the size of x's dimension 0" in report.summary()


def test_a_loop_sum_unrolled_fewer_times_fails_at_its_output_not_a_partial_sum(exported):
    path = exported(LoopSum, (2, 3), {0: "batch", 1: "n"})
    report = bisect_onnx.bisect(built(LoopSum), sample((2, 5), 1), onnx_model=path)
    first = report.first_divergence
    assert first.failed and first.onnx_node == "/Add_1"
    assert first.onnx_value == report.final_outputs[0].onnx_value
    assert "the export unrolled a Python loop over the size of x's dimension 1" in \
        report.summary()


def test_op_values_traced_at_the_first_sample_are_traced_again_at_the_second():
    # The trace made for the first sample's op values holds its batch as the export
    # does; replayed at the second, its values would agree with the file's.
    report = bisect_onnx.bisect(
        built(Broadcast), bisect_onnx.Samples([sample((2, 4)), sample((3, 4), 1)]),
        export=bisect_onnx.ExportOptions(exporter="torchscript", torch_kwargs={
            "input_names": ["x"], "dynamic_axes": {"x": {0: "batch"}}}))
    first = report.first_divergence
    assert first.failed and first.figures.status == "shape_mismatch"
    assert [row.shape for row in report.comparisons if row.onnx_value == first.onnx_value] \
        in ([], [[3, 4]])


def test_an_edited_file_is_not_put_down_to_its_baked_shapes(exported, tmp_path):
    """A weight edited in a file that also bakes a harmless bound: the weight is the cause.

    An export at the run's shapes reaches parity (it lacks the edit) and differs from the
    file in the baked bound; the model exported at the file's own shapes reaches parity
    at the run's as well, so the bound is not why the file diverges.
    """
    import onnx
    from onnx import numpy_helper

    from tests.pipeline.baked_models import ClampedByBatch

    model = onnx.load(str(exported(ClampedByBatch, (2, 4), {0: "batch"})))
    weight = next(tensor for tensor in model.graph.initializer if tensor.name == "fc.weight")
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1.5, weight.name))
    edited = tmp_path / "edited.onnx"
    onnx.save(model, str(edited))

    report = bisect_onnx.bisect(built(ClampedByBatch), sample((4, 4)), onnx_model=edited)

    assert report.diverged
    assert report.attribution is None or report.attribution.baked_shapes is None
    assert "the export baked" not in report.summary()
