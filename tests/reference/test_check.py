"""Checking a runtime against a recorded reference: the same answers as in one process."""

from __future__ import annotations

import json

import pytest

import bisect_onnx
from bisect_onnx.cli.command import main
from bisect_onnx.judge.records import Report
from tests.planting import plant, scale_conv_weight, set_attribute

pytestmark = pytest.mark.filterwarnings("ignore::bisect_onnx.BisectOnnxWarning")

FIXTURE_NAMES = ["tiny_mlp", "resnet_like", "tiny_transformer", "avgpool_divisor",
                 "inplace_relu", "two_inputs", "dropout_mlp", "token_classifier",
                 "reused_block", "functional_attention"]
PLANTS = {
    "conv-weight": ("resnet_like", scale_conv_weight("layer2.bn1", 1.003)),
    "layernorm-epsilon": ("tiny_transformer",
                          set_attribute("blocks.1.ln2", "LayerNormalization", "epsilon", 1e-3)),
    "resize-coordinates": ("resnet_like", set_attribute(
        "up", "Resize", "coordinate_transformation_mode", "asymmetric")),
}
CASES = [(name, None) for name in FIXTURE_NAMES] + [
    (name, plant_id) for plant_id, (name, _) in PLANTS.items()]


def case_files(fixture_case, tmp_path, name, plant_id):
    model, inputs, onnx_path = fixture_case(name)
    if plant_id is not None:
        planted = tmp_path / "planted.onnx"
        plant(onnx_path, planted, PLANTS[plant_id][1])
        onnx_path = planted
    return model, inputs, onnx_path


def culprit_node(report: Report) -> str | None:
    shown = report.culprit or report.first_divergence
    return shown.onnx_node if shown is not None else None


def assert_same_answer(checked: Report, report: Report) -> None:
    assert checked.verdict == report.verdict
    assert culprit_node(checked) == culprit_node(report)
    assert (checked.culprit is None) == (report.culprit is None)


@pytest.mark.parametrize(("name", "plant_id"), CASES,
                         ids=[plant_id or name for name, plant_id in CASES])
def test_check_names_what_the_run_in_one_process_names(fixture_case, tmp_path, name,
                                                       plant_id):
    model, inputs, onnx_path = case_files(fixture_case, tmp_path, name, plant_id)
    report = bisect_onnx.bisect(model, inputs, onnx_model=onnx_path)
    reference = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                   onnx_model=onnx_path)
    checked = bisect_onnx.check(reference)
    assert_same_answer(checked, report)
    if report.diverged:  # the culprit's row as the recording showed it
        shown, recorded = checked.culprit or checked.first_divergence, (
            report.culprit or report.first_divergence)
        assert (shown.torch_module, shown.torch_op, shown.source) == (
            recorded.torch_module, recorded.torch_op, recorded.source)


@pytest.mark.parametrize(("name", "plant_id"), [("avgpool_divisor", None),
                                                ("resnet_like", "conv-weight"),
                                                ("tiny_transformer", None)])
def test_recorded_with_onnx_runtime_checked_in_openvino(fixture_case, tmp_path, name,
                                                        plant_id):
    pytest.importorskip("openvino")
    model, inputs, onnx_path = case_files(fixture_case, tmp_path, name, plant_id)
    reference = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                   onnx_model=onnx_path)
    openvino = bisect_onnx.RuntimeOptions(runtime="openvino")
    report = bisect_onnx.bisect(model, inputs, onnx_model=onnx_path, runtime=openvino)
    checked = bisect_onnx.check(reference, runtime=openvino)
    assert_same_answer(checked, report)
    assert checked.tolerance_basis == report.tolerance_basis
    assert checked.environment["runtime"] == "openvino"


def test_rows_are_the_recorded_rows(fixture_case, tmp_path):
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    report = bisect_onnx.bisect(model, inputs, onnx_model=onnx_path)
    checked = bisect_onnx.check(bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                                   onnx_model=onnx_path))
    fields = ("index", "onnx_value", "onnx_node", "torch_module", "torch_op", "source",
              "fx_node")

    def shown(row):
        return [*(getattr(row, name) for name in fields), row.figures.status,
                row.figures.max_abs_error]

    for rows, recorded in ((checked.comparisons, report.comparisons),
                           (checked.final_outputs, report.final_outputs)):
        assert [shown(row) for row in rows] == [shown(row) for row in recorded]
    assert checked.coverage == report.coverage
    # The rows; what was not compared is the check's own (its runtime's fused values).
    assert (checked.table().split("not compared")[0]
            == report.table().split("not compared")[0])
    assert checked.culprit.local.classification == "unclassified"
    assert checked.environment["torch"] == report.environment["torch"]
    assert checked.reference["kind"] == "recorded reference"
    assert [warning.code for warning in checked.warnings] == ["needs-pytorch"]
    assert "bisect-onnx MODEL --onnx FILE" in checked.warnings[0]


def test_parity_says_nothing_of_pytorch(fixture_case, tmp_path):
    model, inputs, onnx_path = fixture_case("tiny_mlp")
    checked = bisect_onnx.check(bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                                   onnx_model=onnx_path))
    assert checked.verdict == "parity"
    assert checked.warnings == []


def test_an_export_made_here_is_checked_without_onnx(fixture_case, tmp_path):
    model, inputs, _ = fixture_case("avgpool_divisor")
    checked = bisect_onnx.check(bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz"))
    assert checked.culprit.onnx_node == "node_avg_pool2d"


def test_check_command_line_exit_status_reports_and_repro(fixture_case, tmp_path, capsys):
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    reference = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                   onnx_model=onnx_path)
    status = main(["check", str(reference), "--onnx", str(onnx_path), "--json",
                   str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html"),
                   "--model-explorer", str(tmp_path / "me.json"),
                   "--repro-dir", str(tmp_path / "repro"), "--suggest-fix"])
    captured = capsys.readouterr()
    assert status == 1
    assert "DIVERGED: culprit ONNX node 'node_avg_pool2d'" in captured.out
    assert "aten.avg_pool2d (avg_pool2d)" in captured.out
    assert "WARNING: checked against a recorded reference, without PyTorch" in captured.err
    assert "the exporter and eval-mode fix searches need PyTorch" in captured.out
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["culprit"]["torch_module"] == "pool"
    assert (tmp_path / "r.html").stat().st_size > 0
    assert (tmp_path / "me.json").stat().st_size > 0
    assert (tmp_path / "repro" / "repro.py").exists()
    assert Report.load(tmp_path / "r.json").culprit.onnx_node == "node_avg_pool2d"


def test_check_command_line_parity_exits_zero(fixture_case, tmp_path, capsys):
    model, inputs, onnx_path = fixture_case("tiny_mlp")
    reference = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                   onnx_model=onnx_path)
    assert main(["check", str(reference), "-q"]) == 0
    assert capsys.readouterr().out.startswith("PARITY")


def test_the_given_inputs_must_be_the_recorded_ones(fixture_case, tmp_path):
    model, inputs, onnx_path = fixture_case("tiny_mlp")
    reference = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                   onnx_model=onnx_path)
    assert bisect_onnx.check(reference, inputs=inputs).verdict == "parity"
    other = {name: array + 1 for name, array in inputs.items()}
    with pytest.raises(bisect_onnx.InputError, match="not the one the reference was recorded"):
        bisect_onnx.check(reference, inputs=other)


def test_an_unclassified_culprit_sends_the_pytorch_searches_where_pytorch_runs(fixture_case,
                                                                               tmp_path):
    from bisect_onnx.report.advice import advice

    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    reference = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                   onnx_model=onnx_path)
    plain, searched = (bisect_onnx.check(reference, suggest_fix=fix) for fix in (False, True))
    for checked in (plain, searched):
        assert checked.culprit.local.classification == "unclassified"
    assert ("--suggest-fix tries the runtime's optimizations here, and where PyTorch runs "
            "(the recorded command) the other exporter and opsets and eval mode") in advice(plain)
    said = advice(searched)
    # What ran here is named as run; what needs PyTorch only as where it runs.
    assert "no fix search reached parity (tried: search_optimizer)" in said
    assert "search_exporter" not in said
    assert ("where PyTorch runs (the recorded command), --suggest-fix tries the other "
            "exporter and opsets and eval mode") in said


def test_a_check_passing_only_at_a_wider_tolerance_says_the_recording_diverged(
        fixture_case, tmp_path):
    model, inputs, onnx_path = case_files(fixture_case, tmp_path, "resnet_like", "conv-weight")
    reference = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                   onnx_model=onnx_path)
    held = bisect_onnx.check(reference)
    assert held.diverged
    assert "wider-than-recorded" not in [warning.code for warning in held.warnings]
    loose = bisect_onnx.check(reference, tolerance=(0.5, 0.5))
    assert not loose.diverged
    wider = [warning for warning in loose.warnings if warning.code == "wider-than-recorded"]
    assert len(wider) == 1
    assert f"rtol={held.rtol:g}, atol={held.atol:g}" in wider[0] and "given here" in wider[0]
    assert f"--rtol {held.rtol:g} --atol {held.atol:g}" in wider[0]
