"""A reference ONNX file's values recorded, checked where the reference is not run."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import onnx
import pytest

import bisect_onnx
from bisect_onnx.cli.command import main
from fixtures.registry import FIXTURES, repo_path
from tests.planting import plant, quantize_qdq, scale_initializer_input, scale_quantized_weight
from tests.reference.test_check import assert_same_answer, culprit_node

pytestmark = pytest.mark.filterwarnings("ignore::bisect_onnx.BisectOnnxWarning")

RESNET = repo_path(FIXTURES["resnet_like"].onnx_file)
RESNET_INPUT = repo_path(FIXTURES["resnet_like"].input_file)
PLANTED_NODE = "node_Conv_140"


@pytest.fixture(scope="module")
def float16(tmp_path_factory):
    """resnet_like's float16 conversion, and a copy with one Conv's weight planted."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    folder = tmp_path_factory.mktemp("record_onnx")
    clean, planted = folder / "fp16.onnx", folder / "fp16_planted.onnx"
    onnx.save(convert_float_to_float16(onnx.load(str(RESNET)), keep_io_types=True), str(clean))
    plant(clean, planted, scale_initializer_input(PLANTED_NODE, 1, 1.5))
    return {"clean": clean, "planted": planted}


@pytest.fixture(scope="module")
def qdq_planted(tmp_path_factory):
    """resnet_like's static QDQ quantization, one Conv's weight scale negated."""
    folder = tmp_path_factory.mktemp("record_qdq")
    clean = quantize_qdq(RESNET, folder / "qdq.onnx", np.load(RESNET_INPUT))
    planted = folder / "qdq_planted.onnx"
    plant(clean, planted, scale_quantized_weight(PLANTED_NODE, -1.0))
    return planted


def test_a_check_compares_the_qdq_values_the_run_compared_once_converted(qdq_planted,
                                                                          tmp_path):
    x = np.load(RESNET_INPUT)
    report = bisect_onnx.bisect_onnx_models(RESNET, qdq_planted, x)
    reference = bisect_onnx.record(RESNET, x, path=tmp_path / "ref.npz",
                                   candidate=qdq_planted)
    checked = bisect_onnx.check(reference, qdq_planted)
    # The planted weight shows under agreeing outputs, first at a float the quantizer
    # left before its QDQ pair (its Relu dropped): compared once put through the pair.
    assert report.verdict == checked.verdict == "parity"
    hidden = [(row.onnx_value, row.onnx_node) for row in report.hidden_divergences]
    assert hidden[0] == ("relu_1", PLANTED_NODE)
    assert [(row.onnx_value, row.onnx_node) for row in checked.hidden_divergences] == hidden
    assert_same_answer(checked, report)
    assert [(row.onnx_value, row.failed, row.figures.sqnr_db) for row in checked.comparisons] \
        == [(row.onnx_value, row.failed, row.figures.sqnr_db) for row in report.comparisons]


@pytest.mark.parametrize("which", ["clean", "planted"])
def test_check_of_a_recorded_onnx_reference_names_what_the_run_names(float16, tmp_path,
                                                                     which):
    x = np.load(RESNET_INPUT)
    candidate = float16[which]
    report = bisect_onnx.bisect_onnx_models(RESNET, candidate, x)
    reference = bisect_onnx.record(RESNET, x, path=tmp_path / "ref.npz", candidate=candidate)
    checked = bisect_onnx.check(reference, candidate)
    assert_same_answer(checked, report)
    assert (checked.rtol, checked.atol) == (report.rtol, report.atol)
    assert checked.verdict == ("diverged" if which == "planted" else "parity")
    if which == "planted":
        assert culprit_node(checked) == PLANTED_NODE
    # Nothing a check of an ONNX reference leaves out needs PyTorch.
    assert "needs-pytorch" not in [getattr(warning, "code", None)
                                   for warning in checked.warnings]
    with zipfile.ZipFile(reference) as archive:
        manifest = json.loads(archive.read("manifest.json"))
    assert manifest["reference_kind"] == "onnx"
    assert manifest["onnx"] == {"path": str(candidate.resolve())}
    # The reference's own float32 values, under the candidate's names.
    recorded = np.load(reference, allow_pickle=False)
    assert {recorded[entry["member"].removesuffix(".npy")].dtype
            for entry in manifest["values"]} == {np.dtype(np.float32)}


def test_record_and_check_on_the_command_line(float16, tmp_path, capsys):
    planted, archive = float16["planted"], tmp_path / "ref.npz"
    status = main([str(RESNET), "--against", str(planted), "--input", str(RESNET_INPUT),
                   "--record", str(archive), "-q"])
    assert status == 1
    assert archive.is_file()
    capsys.readouterr()
    assert main(["check", str(archive), "--onnx", str(planted)]) == 1
    captured = capsys.readouterr()
    assert f"culprit ONNX node '{PLANTED_NODE}'" in captured.out
    assert "PyTorch" not in captured.err


def test_one_file_run_two_ways_records_every_value(tmp_path):
    x = np.load(RESNET_INPUT)
    runs = {"reference_runtime": bisect_onnx.RuntimeOptions(opt_level="disabled"),
            "candidate_runtime": bisect_onnx.RuntimeOptions(opt_level="all")}
    report = bisect_onnx.bisect_onnx_models(RESNET, None, x, **runs)
    reference = bisect_onnx.record(RESNET, x, path=tmp_path / "ref.npz", **runs)
    checked = bisect_onnx.check(reference, runtime=bisect_onnx.RuntimeOptions(opt_level="all"))
    assert_same_answer(checked, report)
    names = {output for node in onnx.load(str(RESNET)).graph.node for output in node.output}
    assert set(bisect_onnx.Reference.load(reference).value_names) == names


def test_a_parity_test_holds_a_candidate_to_a_recorded_onnx_reference(float16, tmp_path):
    x = np.load(RESNET_INPUT)
    clean = bisect_onnx.record(RESNET, x, path=tmp_path / "clean.npz",
                               candidate=float16["clean"])
    bisect_onnx.assert_parity(clean, None)
    planted = bisect_onnx.record(RESNET, x, path=tmp_path / "planted.npz",
                                 candidate=float16["planted"])
    with pytest.raises(bisect_onnx.ParityError) as raised:
        bisect_onnx.assert_parity(planted, None)
    assert culprit_node(raised.value.report) == PLANTED_NODE


def test_another_qdq_file_is_not_compared_to_values_recorded_converted(qdq_planted, tmp_path):
    """Recorded on the clean QDQ file, checked on another: its values compared only once
    converted are left out, not compared by name (a float against an int8)."""
    x = np.load(RESNET_INPUT)
    reference = bisect_onnx.record(RESNET, x, path=tmp_path / "ref.npz",
                                   candidate=qdq_planted.parent / "qdq.onnx")
    converted = set(bisect_onnx.Reference.load(reference).manifest.converted)

    checked = bisect_onnx.check(reference, qdq_planted, allow_other_file=True)

    assert converted
    assert bisect_onnx.Reference.load(reference).manifest.to_json()["version"] == 2
    assert not converted & {row.onnx_value for row in checked.comparisons}
    assert not any(row.figures.status == "dtype_mismatch" for row in checked.comparisons)


def test_a_diverged_onnx_reference_checked_on_a_file_that_passes(tmp_path):
    # A reference ONNX file's check takes its tolerance from the file's precision:
    # passing where the recording diverged says nothing of a wider tolerance.
    x = np.load(RESNET_INPUT)
    planted = tmp_path / "planted.onnx"
    plant(RESNET, planted, scale_initializer_input(PLANTED_NODE, 1, 1.5))
    reference = bisect_onnx.record(RESNET, x, path=tmp_path / "ref.npz", candidate=planted)
    assert bisect_onnx.check(reference, planted).diverged
    fixed = bisect_onnx.check(reference, RESNET, allow_other_file=True)
    assert not fixed.diverged
    assert "wider-than-recorded" not in [getattr(warning, "code", None)
                                         for warning in fixed.warnings]


def test_two_onnx_models_get_no_exporter_advice(tmp_path):
    # No torch op runs between two ONNX files: neither the exporter nor eval mode is
    # named, in the run or in a check of its recording.
    from bisect_onnx.report.advice import advice

    x = np.load(RESNET_INPUT)
    planted = tmp_path / "planted.onnx"
    plant(RESNET, planted, scale_initializer_input(PLANTED_NODE, 1, 1.5))
    report = bisect_onnx.bisect_onnx_models(RESNET, planted, x)
    reference = bisect_onnx.record(RESNET, x, path=tmp_path / "ref.npz", candidate=planted)
    for run in (report, bisect_onnx.check(reference, planted)):
        said = advice(run)
        assert "the reference is an ONNX model" in said and "tries the runtime's" in said
        assert "exporter" not in said and "eval mode" not in said
