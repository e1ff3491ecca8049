"""The sweep: other shapes and input values from one sample, until one combination fails.

Models come from ``baked_models``; each is exported here by the TorchScript exporter
(fast), at the sample's shapes, so every failure the sweep finds is one the sample
itself does not show.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import bisect_onnx
from bisect_onnx.cli.command import main
from bisect_onnx.errors import UsageError
from bisect_onnx.judge.sweep_table import FAILED, PASSED
from bisect_onnx.pipeline.sweep import NOT_ONE_SAMPLE, SAMPLE, SCALES, sweep_inputs, sweep_sizes
from bisect_onnx.runtime.input_specs import InputSpec
from bisect_onnx.search.baked_shapes import BAKED_KIND
from tests.pipeline import baked_models
from tests.pipeline.baked_models import Branch, Divisor, Symbolic, built, sample
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED

pytestmark = [LEGACY_EXPORTER_DEPRECATED,
              pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
              pytest.mark.filterwarnings("ignore:the export baked:bisect_onnx.BisectOnnxWarning")]

MODELS_FILE = str(Path(baked_models.__file__))
SWEEP = bisect_onnx.SearchOptions(sweep=True)


def _export(dynamic: bool = True) -> bisect_onnx.ExportOptions:
    return bisect_onnx.ExportOptions(exporter="torchscript", dynamic_batch=dynamic)


def test_a_dynamic_model_passes_every_combination_and_shows_the_table():
    report = bisect_onnx.bisect(built(Symbolic), sample((2, 4)), export=_export(),
                                search=SWEEP)
    sweep = report.sweep
    assert not report.diverged and sweep.bisected is None
    assert sweep.free_dims == ("batch",)
    assert [row.verdict for row in sweep.rows] == [PASSED] * len(sweep.rows)
    batches = list(dict.fromkeys(row.shapes[0][0] for row in sweep.rows))
    assert batches == [2, 1, 7, 8]  # the sample's, 1, (2 is the sample's), a prime, the largest
    assert {row.scale for row in sweep.rows} == {SAMPLE, *SCALES}
    text = str(report)
    assert "sweep (final outputs only, until one fails; free dimensions: batch):" in text
    assert any(line.split()[:3] == ["x[7,4]", "x100", "negative"] for line in text.splitlines())
    assert f"all {len(sweep.rows)} combinations of the sweep pass" in report.summary()


def test_a_branch_the_tracer_took_is_found_from_a_sample_that_passes():
    positive = np.abs(sample((2, 4)))
    report = bisect_onnx.bisect(built(Branch), positive, export=_export(dynamic=False),
                                search=SWEEP)
    sweep = report.sweep
    assert sweep.rows[0].scale == SAMPLE and sweep.rows[0].verdict == PASSED
    assert sweep.failing.scale == "x100 negative" and sweep.failing.verdict == FAILED
    assert sweep.free_dims == () and "no free dimension" in sweep.note
    assert report.diverged
    # At the sample the layer's sum is negative: the tracer kept ``y * 2``.
    assert (report.culprit.onnx_node, report.culprit.torch_module) == ("/gate/Mul", "gate")
    assert "an `if` on a tensor" in report.summary()


def test_a_divisor_baked_at_batch_1_is_found_from_a_batch_1_sample():
    report = bisect_onnx.bisect(built(Divisor), sample((1, 4)), export=_export(), search=SWEEP)
    sweep = report.sweep
    assert [row.verdict for row in sweep.rows][-1] == FAILED
    assert {row.shapes for row in sweep.rows[:-1]} == {((1, 4),)}  # the sample's size passes
    assert sweep.failing.shapes == ((2, 4),)
    assert report.culprit.onnx_node == "/Div"
    assert report.attribution.classification["kind"] == BAKED_KIND
    assert "(1 when exported, 2 in this run)" in report.summary()


def test_the_sweep_reads_back_from_json_and_shows_in_html(tmp_path):
    report = bisect_onnx.bisect(built(Divisor), sample((1, 4)), export=_export(), search=SWEEP)
    assert bisect_onnx.Report.load(report.save(tmp_path / "r.json")) == report
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["sweep"]["bisected"] == len(data["sweep"]["rows"]) - 1
    page = report.save(tmp_path / "r.html").read_text()
    assert 'id="sweep"' in page and "<strong>x[2,4]</strong>" in page
    assert "<strong>x[2,4]</strong>" in report._repr_html_()  # a notebook's block


def test_the_command_line_prints_the_table_and_exits_diverged(tmp_path, capsys):
    inputs = tmp_path / "x.npy"
    np.save(inputs, sample((1, 4)))
    status = main([f"{MODELS_FILE}:Divisor", "--exporter", "torchscript", "--dynamic",
                   "--input", str(inputs), "--sweep"])
    out = capsys.readouterr().out
    assert status == 1
    assert "sweep (final outputs only" in out
    assert [line.split()[:3] for line in out.splitlines() if line.startswith(">> x[")] == [
        [">>", "x[2,4]", "N(0,1)"]]


def test_a_sweep_of_several_samples_is_refused_in_one_line(capsys):
    with pytest.raises(UsageError, match="starts from one sample"):
        bisect_onnx.bisect(built(Symbolic), bisect_onnx.Samples([sample((2, 4)),
                                                                 sample((3, 4))]),
                           export=_export(), search=SWEEP)
    status = main([f"{MODELS_FILE}:Symbolic", "--samples", "2", "--sweep"])
    error = capsys.readouterr().err
    assert status == 2 and error == f"bisect-onnx: error: {NOT_ONE_SAMPLE}\n"


def _centring(path: Path, divisor: float | None) -> Path:
    """``x - mean(x, 0)``, or with the mean as a sum over ``divisor`` (a baked batch)."""
    import onnx
    from onnx import TensorProto, helper

    nodes = ([helper.make_node("ReduceMean", ["x", "axes"], ["mean"], keepdims=1)]
             if divisor is None else
             [helper.make_node("ReduceSum", ["x", "axes"], ["sum"], keepdims=1),
              helper.make_node("Div", ["sum", "divisor"], ["mean"])])
    nodes.append(helper.make_node("Sub", ["x", "mean"], ["y"]))
    constants = [helper.make_tensor("axes", TensorProto.INT64, [1], [0]),
                 helper.make_tensor("divisor", TensorProto.FLOAT, [], [divisor or 1.0])]
    graph = helper.make_graph(
        nodes, "centring", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        initializer=constants)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def test_two_onnx_models_take_the_sweep_too(tmp_path):
    reference = _centring(tmp_path / "reference.onnx", None)
    same = bisect_onnx.bisect_onnx_models(reference, inputs=sample((2, 4)),
                                          reference_runtime="onnx.reference", search=SWEEP)
    assert not same.diverged and same.sweep.bisected is None and len(same.sweep.rows) > 4
    baked = bisect_onnx.bisect_onnx_models(reference, _centring(tmp_path / "baked.onnx", 2.0),
                                           inputs=sample((2, 4)), search=SWEEP)
    assert baked.diverged and baked.sweep.rows[0].verdict == PASSED
    assert baked.sweep.failing.shapes == ((1, 4),)
    assert baked.first_divergence.onnx_node is not None


def test_the_sizes_tried_follow_the_sample_a_prime_and_a_declared_range():
    sizes, note = sweep_sizes({"batch": 4}, 8, {})
    assert (sizes, note) == ([0, 1, 2, 7, 8], None)  # 0: the sample's own sizes
    sizes, note = sweep_sizes({"batch": 7}, 14, {"batch": (2, 10)})
    assert sizes == [0, 2, 10] and note.endswith("not tried: 1, 13, 14")


def test_integers_are_drawn_within_the_sample_s_range_and_floats_at_each_scale():
    specs = [InputSpec("ids", np.dtype("int64"), ("batch", 3)),
             InputSpec("x", np.dtype("float32"), ("batch", 2))]
    arrays = [np.array([[5, 9, 7]]), np.ones((1, 2), np.float32)]
    ids, x = sweep_inputs(specs, arrays, {"batch": 6}, "x100 negative", seed=0)
    assert ids.shape == (6, 3) and ids.dtype == np.int64 and 5 <= ids.min() <= ids.max() <= 9
    assert x.shape == (6, 2) and x.dtype == np.float32 and (x <= 0).all() and x.min() < -10


def test_a_combination_the_runtime_refuses_is_raised_with_the_sweep_s_table(tmp_path, capsys):
    from bisect_onnx.errors import RuntimeRefused
    from bisect_onnx.judge.sweep_table import REFUSED
    from tests.pipeline.baked_models import Flatten

    with pytest.raises(RuntimeRefused) as caught:
        bisect_onnx.bisect(built(Flatten), sample((1, 2, 4)), export=_export(), search=SWEEP)
    error = caught.value
    assert error.node == "/fc/Gemm" and error.sweep.failing.verdict == REFUSED
    assert error.sweep.failing.shapes == ((2, 2, 4),)
    assert "found by the sweep: the sweep's combination" in str(error)
    inputs = tmp_path / "x.npy"
    np.save(inputs, sample((1, 2, 4)))
    status = main([f"{MODELS_FILE}:Flatten", "--exporter", "torchscript", "--dynamic",
                   "--input", str(inputs), "--sweep"])
    captured = capsys.readouterr()
    assert status == 3 and captured.err.count("\n") == 1
    assert "sweep (final outputs only" in captured.out
    assert any(line.startswith(">> x[2,2,4]") and "refused" in line
               for line in captured.out.splitlines())


def test_a_program_s_declared_range_bounds_the_sizes_tried():
    import torch

    batch = torch.export.Dim("batch", min=2, max=12)
    program = torch.export.export(built(Symbolic), (torch.from_numpy(sample((4, 4))),),
                                  dynamic_shapes=({0: batch},))
    report = bisect_onnx.bisect(program, sample((4, 4)), search=SWEEP)
    batches = list(dict.fromkeys(row.shapes[0][0] for row in report.sweep.rows))
    assert not report.diverged
    assert batches == [4, 2, 7, 12, 8]  # the sample's, 2, a prime, the range's end, largest
    assert report.sweep.note == "sizes outside the exporter's declared ranges not tried: 1"
