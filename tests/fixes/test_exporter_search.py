"""The exporter fix search through the fix stage: a FixContext, and bisect(suggest_fix=True)."""

import onnx
import pytest
import torch

import bisect_onnx
from bisect_onnx.fixes.context import FixContext, FixUnavailable
from bisect_onnx.fixes.exporter_search import REPRO_NAME, search_exporter
from bisect_onnx.fixes.exporter_trials import torch_outputs, try_export
from bisect_onnx.fixes.registry import searches_for
from bisect_onnx.fixes.stage import culprit_class
from bisect_onnx.judge.report_parts import Attribution
from bisect_onnx.pipeline.options import ExportOptions, Tolerance
from bisect_onnx.pytorch.reexport import ExportCall
from tests.fixes.test_exporter_fix import SoftplusHead

TOLERANCE = Tolerance(1e-3, 1e-5)


def _context(model, args, used, **fields):
    reference = torch_outputs(model, args, {})
    failing = try_export(model, args, {}, used, reference_outputs=reference,
                         rtol=TOLERANCE.rtol, atol=TOLERANCE.atol)
    fields.setdefault("extra", {})
    fields.setdefault("candidate", None)
    return FixContext(culprit_class="exporter", inputs={},
                      reference_outputs=reference, before=failing.figures,
                      tolerance=TOLERANCE, torch_model=model, torch_inputs=args,
                      **fields)


def test_graph_semantics_is_the_exporter_class_and_its_search_is_registered():
    class Classified:
        attribution = Attribution(classification={"kind": "graph semantics"})

    assert culprit_class(Classified()) == "exporter"
    assert search_exporter in searches_for("exporter")


def test_the_search_names_the_dynamo_export_for_a_torchscript_softplus():
    torch.manual_seed(0)
    model, args = SoftplusHead().eval(), (torch.randn(4, 8),)
    context = _context(model, args, ExportCall("torchscript", 18), culprit_module="act",
                       extra={"export": ExportOptions(exporter="torchscript", opset=18)})
    results = search_exporter(context)
    assert [result.change for result in results] == ["export with dynamo=True, opset_version=18"]
    assert results[0].reaches_parity and results[0].before == context.before
    assert "exporter_repro" not in results[0].details  # a fix needs no bug report


def test_where_nothing_fixes_it_the_checked_script_goes_to_the_repro_folder(fixture_case,
                                                                             tmp_path):
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    args = (torch.from_numpy(inputs["x"]),)
    context = _context(model, args, ExportCall("dynamo", 18),
                       candidate=onnx.load(onnx_path), culprit_nodes=("node_avg_pool2d",),
                       culprit_module="pool",
                       extra={"repro_dir": tmp_path, "time_budget_s": 0.0})
    with pytest.raises(FixUnavailable, match="exported alone shows the mismatch") as raised:
        search_exporter(context)
    assert str(tmp_path / REPRO_NAME) in str(raised.value)
    text = (tmp_path / REPRO_NAME).read_text()
    assert "torch.ops.aten.avg_pool2d.default(input0, [2, 2], [2, 2], [0, 0], False, True, 3)" \
        in text and "dynamo=True, opset_version=18" in text


def test_bisect_with_suggest_fix_tries_every_export_and_suggests_nothing_unchecked(
        fixture_case):
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    report = bisect_onnx.bisect(model, inputs, onnx_model=str(onnx_path), suggest_fix=True)
    assert report.diverged and report.fixes == ()
    notes = " ".join(report.fix_notes)
    assert "none reaches parity" in notes and "other export(s) tried" in notes
    assert "aten.avg_pool2d.default exported alone shows the mismatch" in notes
