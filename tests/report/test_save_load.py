"""Report.save in each format, and Report.load reading a JSON report back into an equal Report.

The round trips run on every fixture's checked-in exports (dynamo and TorchScript), on
ONNX against ONNX, and on hand-made reports for what the fixtures do not reach (fixes,
the fields JSON cannot hold as they are).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import replace

import numpy as np
import pytest

import bisect_onnx
from bisect_onnx import InputError, Report, UsageError
from bisect_onnx.cli.command import main
from bisect_onnx.fixes.trial import FixKind, FixResult, OutputFigures
from bisect_onnx.judge.assembly import amended
from bisect_onnx.judge.record_parts import ComparisonFigures
from bisect_onnx.judge.report_parts import CulpritNode
from bisect_onnx.judge.vocabulary import ReportWarning, Status
from bisect_onnx.report.html import render_html
from bisect_onnx.report.json import to_json
from bisect_onnx.report.overlay import model_explorer_data
from fixtures.registry import FIXTURES, REPO_ROOT, repo_path
from tests.made_reports import made_report
from tests.planting import plant, scale_initializer_input

EXPORTERS = ("dynamo", "torchscript")
RESNET = FIXTURES["resnet_like"]
PLANTED_NODE = "node_Conv_140"  # layer1.conv1 of the dynamo export, its BatchNorm folded in


@pytest.fixture(scope="module")
def report_of(fixture_case, tmp_path_factory):
    """``report_of(name, kind)``: a fixture's report from a checked-in export, made once."""
    made: dict[tuple[str, str], Report] = {}
    folder = tmp_path_factory.mktemp("save_load")

    def get(name: str, kind: str) -> Report:
        if (name, kind) not in made:
            made[name, kind] = _made(fixture_case, folder, name, kind)
        return made[name, kind]

    return get


def _made(fixture_case, folder, name: str, kind: str) -> Report:
    if kind in EXPORTERS:
        model, inputs, _ = fixture_case(name)
        fixture = FIXTURES[name]
        exported = fixture.onnx_file if kind == "dynamo" else fixture.torchscript_onnx_file
        return bisect_onnx.bisect(model, inputs, onnx_model=repo_path(exported))
    if kind == "onnx-vs-onnx":  # the two exports of one model: matched by structure
        fixture = FIXTURES[name]
        _, inputs, _ = fixture_case(name)
        with pytest.warns(bisect_onnx.BisectOnnxWarning, match="matched by structure"):
            return bisect_onnx.bisect_onnx_models(
                repo_path(fixture.onnx_file), repo_path(fixture.torchscript_onnx_file), inputs)
    if kind == "onnx-vs-onnx planted":  # a culprit inside a fused kernel, every culprit
        planted = folder / "planted.onnx"
        plant(repo_path(RESNET.onnx_file), planted,
              scale_initializer_input(PLANTED_NODE, 1, 1.5))
        return bisect_onnx.bisect_onnx_models(
            repo_path(RESNET.onnx_file), planted, [np.load(repo_path(RESNET.input_file))],
            search=bisect_onnx.SearchOptions(all_culprits=True))
    model, inputs, exported = fixture_case(name)
    if kind == "reference evaluator":
        return bisect_onnx.bisect_onnx_models(exported, inputs=inputs,
                                              reference_runtime="onnx.reference")
    if kind == "probed":  # a budget nothing fits in: production probed, `search` in full
        return bisect_onnx.bisect(model, inputs, onnx_model=exported,
                                  runtime=bisect_onnx.RuntimeOptions(max_memory=1))
    assert kind == "op", kind
    return bisect_onnx.bisect(model, inputs, onnx_model=exported,
                              search=bisect_onnx.SearchOptions(granularity="op"))


EVERY_FIXTURE = [(name, kind) for name in FIXTURES for kind in EXPORTERS]
OTHER_FORMS = [("avgpool_divisor", "op"), ("avgpool_divisor", "probed"),
               ("avgpool_divisor", "onnx-vs-onnx"), ("avgpool_divisor", "reference evaluator"),
               ("resnet_like", "onnx-vs-onnx planted")]


@pytest.mark.parametrize(("name", "kind"), EVERY_FIXTURE + OTHER_FORMS)
def test_a_saved_report_loads_back_equal(report_of, tmp_path, name, kind):
    report = report_of(name, kind)
    path = report.save(tmp_path / "report.json")
    loaded = Report.load(path)
    assert loaded == report
    assert path.read_text(encoding="utf-8") == to_json(report) + "\n"
    assert to_json(loaded) == to_json(report)
    # What the report says, said again by the report read back.
    assert loaded.summary() == report.summary()
    assert loaded.table(show="all") == report.table(show="all")
    assert (loaded.first_divergence, loaded.culprit, loaded.culprits, loaded.nan_origin) == (
        report.first_divergence, report.culprit, report.culprits, report.nan_origin)


def test_the_reports_cover_both_verdicts_probes_and_a_culprit_inside_a_kernel(report_of):
    verdicts = {report_of(name, kind).verdict for name, kind in EVERY_FIXTURE}
    assert verdicts == {"parity", "diverged"}
    assert report_of("avgpool_divisor", "probed").search.probes
    planted = report_of("resnet_like", "onnx-vs-onnx planted")
    assert planted.culprit in planted.kernel_values and planted.culprits
    assert planted.culprit not in planted.comparisons


def test_a_diverged_report_reads_back_its_formats_and_types(report_of, tmp_path):
    report = report_of("resnet_like", "onnx-vs-onnx planted")
    loaded = Report.load(report.save(tmp_path / "report.json"))
    assert render_html(loaded) == render_html(report)
    assert model_explorer_data(loaded) == model_explorer_data(report)
    assert loaded.culprit_node == report.culprit_node is not None
    assert loaded.culprit_ref == report.culprit_ref and loaded.culprit_ref.table == "kernel_values"
    assert loaded.attribution.first_culprit == report.culprit.onnx_value
    first = loaded.first_divergence
    assert first.figures.status is Status.FAIL and type(loaded.verdict) is type(report.verdict)
    assert type(loaded.coverage.granularity) is type(report.coverage.granularity)


def test_a_loaded_report_is_not_assembled_again_and_says_why(report_of, tmp_path):
    report = report_of("avgpool_divisor", "dynamo")
    loaded = Report.load(report.save(tmp_path / "report.json"))
    assert loaded.findings is None and amended(report, repro=None) == report
    with pytest.raises(ValueError, match="read back from JSON cannot be assembled again"):
        amended(loaded, repro=None)


def test_equality_sees_a_changed_figure(report_of, tmp_path):
    # Equality is no formality: one figure changed in the file, and the reports differ.
    report = report_of("avgpool_divisor", "dynamo")
    data = report.to_dict()
    data["comparisons"][0]["max_abs_error"] = 123.0
    path = tmp_path / "changed.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    assert Report.load(path) != report
    assert Report.load(path).comparisons[0].figures.max_abs_error == 123.0


# ---------------------------------------------------------------- hand-made reports


def record(index: int, error: float | None, status: str = "pass") -> bisect_onnx.Record:
    return bisect_onnx.Record(
        index=index, onnx_node=f"node_{index}", onnx_op="Add", onnx_value=f"v{index}",
        torch_module=f"m{index}", torch_op=None, source=None, shape=[2], dtype="float32",
        candidate_shape=[2], candidate_dtype="float32", figures=ComparisonFigures(
            max_abs_error=error, max_rel_error=error,
            mismatch_fraction=0.0 if status == "pass" else 0.5, min_passing_atol=error,
            nan_mismatch=0, status=Status(status)))


def diverged_rows() -> tuple[list, list]:
    rows = [record(0, 0.0), record(1, 0.5, "fail"), record(2, 0.6, "fail")]
    final = [replace(record(0, 0.6, "fail"), onnx_value="v2", torch_module=None)]
    return rows, final


def test_a_report_with_fixes_loads_back_equal(tmp_path):
    rows, final = diverged_rows()
    report = made_report(rows, final, first_divergence=rows[1], culprit=rows[1])
    fix = FixResult(FixKind.KEEP_FLOAT32, "keep node_1 in float32",
                    OutputFigures(math.inf, math.inf, 1, 1), OutputFigures(0.0, 0.0, 0, 1),
                    {"node_block_list": ["node_1"]}, fixed_model=b"onnx bytes", seconds=1.23456)
    report = amended(report, fixes=(fix,), fix_notes=("1 fix tried",))
    loaded = Report.load(report.save(tmp_path / "report.json"))
    assert loaded == report
    (back,) = loaded.fixes
    # The JSON holds no model and the time to the millisecond: neither is the fix.
    assert back.fixed_model is None and back.seconds == 1.235
    assert back.before.max_abs == math.inf and back.reaches_parity and back.factor == math.inf
    assert loaded.fix_notes == ("1 fix tried",)


def test_what_json_cannot_hold_reads_back_as_documented(tmp_path):
    rows, final = diverged_rows()
    rows[2] = replace(rows[2], figures=replace(rows[2].figures, max_abs_error=math.inf,
                                               sqnr_db=math.inf))
    warning = ReportWarning("a-code", "a warning")
    report = made_report(rows, final, first_divergence=rows[1], culprit=None,
                         culprit_node=CulpritNode("node_1", "Add", "ai.onnx", {}, (), (), {}),
                         warnings=(warning,))
    loaded = Report.load(report.save(tmp_path / "report.json"))
    # Each loss is one docs/json-schema.md names; the JSON written again is the same.
    assert to_json(loaded) == to_json(report)
    assert loaded != report
    figures = loaded.comparisons[2].figures
    assert figures.max_abs_error is None and figures.sqnr_db is None
    assert loaded.culprit_node is None  # written only for a culprit
    assert loaded.warnings == ["a warning"] and not hasattr(loaded.warnings[0], "code")
    assert replace(loaded, comparisons=report.comparisons, culprit_node=report.culprit_node
                   ) == report


# ---------------------------------------------------------------- saving


@pytest.mark.parametrize(("name", "format", "render"), [
    ("report.json", None, lambda report: to_json(report) + "\n"),
    ("REPORT.HTM", None, render_html),
    ("report.html", None, render_html),
    ("report.txt", "json", lambda report: to_json(report) + "\n"),
    ("node_data.json", "model-explorer",
     lambda report: json.dumps(model_explorer_data(report), indent=2) + "\n"),
])
def test_save_writes_the_format_its_suffix_or_argument_names(report_of, tmp_path, name, format,
                                                             render):
    report = report_of("avgpool_divisor", "dynamo")
    path = report.save(str(tmp_path / name), format=format)
    assert path == tmp_path / name
    assert path.read_text(encoding="utf-8") == render(report)


def test_save_refuses_an_unknown_suffix_or_format(report_of, tmp_path):
    report = report_of("avgpool_divisor", "dynamo")
    with pytest.raises(UsageError, match=r"from its suffix \.txt.*format='json', 'html' or "
                       r"'model-explorer'"):
        report.save(tmp_path / "report.txt")
    with pytest.raises(UsageError, match="unknown report format 'xml'"):
        report.save(tmp_path / "report.json", format="xml")
    assert list(tmp_path.iterdir()) == []


def test_save_checks_the_path_as_the_cli_does(report_of, tmp_path, fixtures_untouched):
    report = report_of("avgpool_divisor", "dynamo")
    with pytest.raises(UsageError, match="which this run reads"):
        report.save(repo_path(FIXTURES["avgpool_divisor"].onnx_file), format="json")
    with pytest.raises(InputError, match="choose a writable path for --html"):
        report.save(tmp_path / "missing" / "report.html")


def saves_seen(monkeypatch) -> list[tuple[str, str | None]]:
    """Every ``Report.save`` call from now on, as ``(file name, format)``."""
    seen: list[tuple[str, str | None]] = []
    save = Report.save

    def spied(report, path, format=None):
        seen.append((os.path.basename(path), format))
        return save(report, path, format)

    monkeypatch.setattr(Report, "save", spied)
    return seen


def test_the_cli_writes_each_file_in_its_options_format(tmp_path, monkeypatch):
    fixture = FIXTURES["avgpool_divisor"]
    saved = saves_seen(monkeypatch)
    cwd = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        status = main([fixture.factory, "--input", fixture.input_file, "--onnx",
                       fixture.onnx_file, "--json", str(tmp_path / "report.txt"),
                       "--model-explorer", str(tmp_path / "node_data.json"), "--quiet"])
    finally:
        os.chdir(cwd)
    assert status == 1
    assert saved == [("report.txt", "json"), ("node_data.json", "model-explorer")]
    loaded = Report.load(tmp_path / "report.txt")  # JSON, as --json says, whatever the suffix
    assert loaded.culprit.torch_module == "pool"
    (graph,) = json.loads((tmp_path / "node_data.json").read_text()).values()
    assert graph["results"] and graph["thresholds"]  # Model Explorer's node data


def test_a_failing_parity_check_writes_its_artifacts_through_save(fixture_case, tmp_path,
                                                                   monkeypatch):
    # What the pytest plugin's --bisect-onnx-artifacts writes: assert_parity's files.
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    saved = saves_seen(monkeypatch)
    with pytest.raises(bisect_onnx.ParityError) as raised:
        bisect_onnx.assert_parity(model, inputs, onnx_path, output=bisect_onnx.OutputOptions(
            repro_dir=tmp_path, label="pool check"))
    assert [format for _, format in saved] == [None, None]
    (json_name, _), (html_name, _) = saved
    assert json_name.endswith(".json") and html_name.endswith(".html")
    assert Report.load(tmp_path / json_name) == raised.value.report


def test_report_files_are_written_only_through_save():
    # The CLI, assert_parity and the pytest plugin call Report.save; only report.saving
    # picks a format's writer.
    package = REPO_ROOT / "bisect_onnx"
    writers = ("write_json", "write_html", "write_model_explorer")
    calling = sorted(str(path.relative_to(package)) for path in package.rglob("*.py")
                     if any(writer in path.read_text(encoding="utf-8") for writer in writers))
    assert calling == ["report/html.py", "report/json.py", "report/overlay.py",
                       "report/saving.py"]


# ---------------------------------------------------------------- loading what is no report


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", r"is not JSON \(Expecting property name enclosed in double quotes at line 1"),
    ('[1, 2]', r"not a bisect-onnx JSON report \(it holds a JSON array, not an object\)"),
    ('{"name": "something else"}', r'no "schema" and "verdict" keys'),
    ('{"schema": 1, "verdict": "parity"}', r"a report of schema 1, and bisect-onnx .* reads "
     r"schema 2 only; write it again"),
    ('{"schema": 2, "verdict": "parity"}', r"not a bisect-onnx JSON report of schema 2 "
     r"\(no key 'comparisons'\)"),
    (b"\xff\xfe", r"is not JSON \(not UTF-8 text"),
    ("", r"is empty \(0 bytes\)"),
])
def test_load_refuses_what_is_no_report_in_one_line(tmp_path, text, message):
    path = tmp_path / "report.json"
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    with pytest.raises(InputError, match=message) as raised:
        Report.load(path)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_load_refuses_a_corrupt_record_and_a_missing_file(report_of, tmp_path):
    data = report_of("avgpool_divisor", "dynamo").to_dict()
    data["comparisons"][1]["status"] = "great"
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(InputError, match="'great' is not a valid Status"):
        Report.load(path)
    with pytest.raises(InputError, match=r"report file .*missing\.json does not exist"):
        Report.load(tmp_path / "missing.json")
    with pytest.raises(InputError, match="a report of schema 3"):
        Report.from_dict({**data, "schema": 3})


def test_an_onnx_file_is_not_a_report(tmp_path):
    path = tmp_path / "model.onnx"
    shutil.copy(repo_path(RESNET.onnx_file), path)
    with pytest.raises(InputError, match="is not JSON"):
        Report.load(path)
