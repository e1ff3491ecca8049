"""ONNX against ONNX: float16 and QDQ conversions, optimization levels, the reference
evaluator, per-value tolerances, and the CLI forms (issue 11).

Every candidate is made here from the checked-in ``resnet_like`` export, with the
converters that ship in onnxruntime; planted edits change one node of the candidate.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import bisect_onnx
from bisect_onnx.align.onnx_pairs import Quantization
from bisect_onnx.cli.command import main
from bisect_onnx.errors import InputError, UsageError
from bisect_onnx.judge.report_parts import Search
from bisect_onnx.judge.tolerances import (
    PRECISION_DEFAULTS,
    QUANTIZED,
    precision_of,
    read_tolerance_file,
)
from fixtures.registry import FIXTURES, repo_path
from tests.conftest import tree_digest
from tests.planting import (
    fx_segment,
    plant,
    quantize_qdq,
    scale_initializer_input,
    scale_quantized_weight,
)

EVERY_CULPRIT = bisect_onnx.SearchOptions(all_culprits=True)

RESNET = repo_path(FIXTURES["resnet_like"].onnx_file)
RESNET_INPUT = repo_path(FIXTURES["resnet_like"].input_file)
PLANTED_NODE = "node_Conv_140"  # layer1.conv1 (its BatchNorm folded in), output getitem_3


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The float16 and QDQ conversions of resnet_like, and a planted copy of each."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    folder = tmp_path_factory.mktemp("onnx_vs_onnx")
    x = np.load(RESNET_INPUT)
    paths = {"x": x}
    paths["fp16"] = folder / "fp16.onnx"
    onnx.save(convert_float_to_float16(onnx.load(str(RESNET)), keep_io_types=True),
              str(paths["fp16"]))

    paths["qdq"] = quantize_qdq(RESNET, folder / "qdq.onnx", x)
    paths["fp16_planted"] = folder / "fp16_planted.onnx"
    plant(paths["fp16"], paths["fp16_planted"], scale_initializer_input(PLANTED_NODE, 1, 1.5))
    paths["qdq_planted"] = folder / "qdq_planted.onnx"
    plant(paths["qdq"], paths["qdq_planted"], scale_quantized_weight(PLANTED_NODE, -1.0))
    paths["fp32_planted"] = folder / "fp32_planted.onnx"
    plant(RESNET, paths["fp32_planted"], scale_initializer_input(PLANTED_NODE, 1, 1.5))
    return paths


# float16 --------------------------------------------------------------------------------

def test_float16_conversion_aligns_through_its_casts_with_parity(made):
    report = bisect_onnx.bisect_onnx_models(RESNET, made["fp16"], made["x"])
    assert report.verdict == "parity"
    assert not report.unaligned  # every value, the Cast-wrapped output included
    assert report.coverage.aligned_values == report.coverage.onnx_values == 23
    fp16 = PRECISION_DEFAULTS["float16"]
    assert (report.rtol, report.atol) == (fp16.rtol, fp16.atol)
    assert "float16 defaults" in report.summary()
    output = report.final_outputs[0]
    assert output.onnx_node == "node_linear"  # the Gemm, not the Cast the converter added
    assert output.figures.sqnr_db is not None and output.figures.sqnr_db > 50
    # Every value computed in float16; the graph output is the converter's Cast back.
    assert {record.candidate_dtype for record in report.comparisons[:-1]} == {"float16"}
    # float32 tolerances would flag float16 rounding: the default is what passes it.
    strict = bisect_onnx.bisect_onnx_models(RESNET, made["fp16"], made["x"],
                                            tolerance=(1e-3, 1e-5))
    assert strict.diverged


def test_planted_error_in_float16_candidate_is_reported_at_the_planted_node(made):
    report = bisect_onnx.bisect_onnx_models(RESNET, made["fp16_planted"], made["x"])
    assert report.diverged
    first = report.first_divergence
    assert (first.onnx_node, first.match.reference_value) == (PLANTED_NODE, "getitem_3")
    assert all(not record.failed for record in report.comparisons[:first.index])
    assert f"ONNX node '{PLANTED_NODE}'" in report.summary()


# QDQ ------------------------------------------------------------------------------------

def test_qdq_model_aligns_its_dequantized_values_with_sqnr(made):
    report = bisect_onnx.bisect_onnx_models(RESNET, made["qdq"], made["x"])
    assert report.verdict == "parity", report.summary()
    relu = next(record for record in report.comparisons if record.match.reference_value == "relu")
    # The DequantizeLinear output stands for the float tensor; the Conv computed it.
    assert relu.onnx_value == "relu_DequantizeLinear_Output"
    assert relu.onnx_node == "node_Conv_138"
    # Steps of its own scale.
    assert relu.figures.atol is not None and relu.figures.atol > report.atol
    assert all(record.figures.sqnr_db is not None and 20 < record.figures.sqnr_db < 80
               for record in report.comparisons)
    assert "SQNR dB" in report.table()
    assert precision_of(onnx.load(str(made["qdq"]))) == QUANTIZED


def test_planted_error_in_qdq_candidate_is_reported_at_the_planted_node(made):
    report = bisect_onnx.bisect_onnx_models(RESNET, made["qdq_planted"], made["x"])
    # Average pooling and the output's own quantization steps absorb the error by the
    # final logits (16 steps of their scale), so it shows as a hidden divergence.
    failing = report.first_divergence or report.hidden_divergences[0]
    assert report.diverged or "hidden intermediate divergence" in report.summary()
    first = failing
    assert (first.onnx_node, first.match.reference_value) == (PLANTED_NODE, "relu_1")
    assert first.figures.sqnr_db is not None and first.figures.sqnr_db < 20


@pytest.mark.parametrize("level", ["basic", "all"])
def test_qdq_model_against_itself_pairs_each_value_with_its_namesake(made, level):
    report = bisect_onnx.bisect_onnx_models(
        made["qdq"], None, made["x"],
        reference_runtime=bisect_onnx.RuntimeOptions(opt_level="disabled"),
        candidate_runtime=bisect_onnx.RuntimeOptions(opt_level=level))
    assert report.verdict == "parity" and not report.hidden_divergences, report.summary()
    assert not [record.figures.status for record in report.comparisons
                if record.figures.status != "pass"]
    # The reference holds the same Q/DQ pairs: the float before a pair (here the Conv's,
    # its Relu dropped), its integers and its DequantizeLinear output are three tensors.
    names = {record.match.reference_value: record.onnx_value for record in report.comparisons}
    assert names["relu"] == "relu"
    assert names["relu_QuantizeLinear_Output"] == "relu_QuantizeLinear_Output"
    assert report.coverage.aligned_values > 30


def _two_pairs_model(scales: tuple[float, float], order: tuple[int, ...]) -> onnx.ModelProto:
    """``a = Relu(x)`` read by two consumers, each through its own Q/DQ pair and scale.

    ``order`` arranges the nodes Q1, Q2, DQ1, DQ2 (indices 0-3) in the graph.
    """
    from onnx import TensorProto, helper

    nodes = [helper.make_node("QuantizeLinear", ["a", f"s{k}", "zero"], [f"a_q{k}"],
                              name=f"q{k}") for k in (1, 2)]
    nodes += [helper.make_node("DequantizeLinear", [f"a_q{k}", f"s{k}", "zero"],
                               [f"a_dq{k}"], name=f"dq{k}") for k in (1, 2)]
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"], name="relu"),
         *(nodes[index] for index in order),
         helper.make_node("Add", ["a_dq1", "a_dq2"], ["y"], name="add")],
        "two_pairs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.array(scale, np.float32), f"s{k}")
         for k, scale in enumerate(scales, start=1)]
        + [numpy_helper.from_array(np.array(0, np.int8), "zero")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("captured", "how"), [
    ({"a_dq2": np.zeros(4, np.float32)}, "qdq"),
    ({"a_q2": np.zeros(4, np.int8)}, "dequantized"),  # both DequantizeLinear fused away
])
def test_each_qdq_pair_dequantizes_with_its_own_scale(captured, how):
    from onnx import TensorProto, helper

    from bisect_onnx.align.onnx_pairs import CandidateGroups, pair_graphs

    # One pair per consumer (DedicatedQDQPair), the second pair's members first.
    candidate = _two_pairs_model((0.5, 0.01), order=(0, 1, 3, 2))
    reference = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Add", ["a", "a"], ["y"])],
        "float", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])]))
    pairing = pair_graphs(reference, CandidateGroups(candidate, "."),
                          {"a": np.zeros(4, np.float32)}, captured)
    (pair,) = pairing.pairs
    assert (pair.reference, pair.how) == ("a", how)
    assert pair.candidate in {"a_q2", "a_dq2"}
    assert float(pair.quantization.scale) == pytest.approx(0.01)  # the second pair's


def test_a_cast_the_reference_holds_too_does_not_stand_in_for_its_input():
    """OpenVINO fused an int64 Where with its float Cast: the Cast's value is its own."""
    from onnx import TensorProto, helper

    from bisect_onnx.align.onnx_pairs import CandidateGroups, pair_graphs

    model = helper.make_model(helper.make_graph(
        [helper.make_node("Cast", ["x"], ["shifted"], to=TensorProto.INT64),
         helper.make_node("Cast", ["shifted"], ["as_float"], to=TensorProto.FLOAT)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("as_float", TensorProto.FLOAT, [4])]))
    pairing = pair_graphs(model, CandidateGroups(model, "."),
                          {"shifted": np.zeros(4, np.int64), "as_float": np.zeros(4, np.float32)},
                          {"as_float": np.zeros(4, np.float32)})
    assert [(pair.reference, pair.candidate) for pair in pairing.pairs] == [
        ("as_float", "as_float")]
    assert [item.name for item in pairing.unpaired] == ["shifted"]


def test_captured_quantized_integers_are_dequantized_like_dequantizelinear():
    quantization = Quantization(np.array([0.5, 2.0], np.float32), np.array([1, 0], np.uint8),
                                axis=1)
    values = np.array([[[1, 3]], [[0, 4]]], np.uint8).reshape(1, 2, 2)
    assert quantization.dequantize(values).tolist() == [[[0.0, 1.0], [0.0, 8.0]]]


# optimization levels and the reference evaluator -----------------------------------------

def test_optimization_level_pair_has_parity_and_finds_a_planted_edit(made):
    levels = {"reference_runtime": bisect_onnx.RuntimeOptions(opt_level="disabled"),
              "candidate_runtime": bisect_onnx.RuntimeOptions(opt_level="all")}
    same = bisect_onnx.bisect_onnx_models(RESNET, None, made["x"], **levels)
    assert same.verdict == "parity" and not same.hidden_divergences
    assert same.coverage.aligned_values > 10
    assert same.environment["reference_opt_level"] == "disabled"
    assert same.environment["opt_level"] == "all"
    planted = bisect_onnx.bisect_onnx_models(RESNET, made["fp32_planted"], made["x"], **levels)
    assert planted.diverged
    # At level all the Conv's output is fused with its Relu: the Relu's value is the
    # first captured, and it carries the planted Conv's error.
    assert planted.first_divergence.match.reference_value in {"getitem_3", "relu_1"}
    assert planted.first_divergence.torch_module == "layer1.relu" or (
        planted.first_divergence.onnx_node == PLANTED_NODE)


def test_reference_evaluator_agrees_with_onnx_runtime_on_a_small_model():
    from bisect_onnx.events import listening

    events = []
    with listening(events.append):
        report = bisect_onnx.bisect_onnx_models(RESNET, reference_runtime="onnx.reference",
                                                inputs=np.load(RESNET_INPUT))
    assert report.verdict == "parity" and not report.hidden_divergences
    assert report.reference["kind"] == "onnx-reference-evaluator"
    assert (report.environment["reference_runtime"], report.environment["reference_provider"],
            report.environment["reference_opt_level"]) == ("onnx.reference", None, None)
    captures = [event.detail for event in events if event.kind == "capture_started"]
    assert captures[:2] == ["onnx.reference", "ONNX Runtime"]
    assert report.coverage.aligned_values >= 13
    assert max(record.figures.max_abs_error for record in report.comparisons) < 1e-5


def test_reference_evaluator_refuses_a_contrib_op_by_name(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft", name="gelu")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    path = tmp_path / "contrib.onnx"
    onnx.save(model, str(path))
    with pytest.raises(UsageError, match=r"com\.microsoft\.FastGelu.*'gelu'.*ONNX Runtime"):
        bisect_onnx.bisect_onnx_models(path, reference_runtime="onnx.reference")


# names that do not survive: the structural fallback ---------------------------------------

def _renamed(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every intermediate value renamed: no name survives to pair by."""
    renames = {}
    for index, node in enumerate(model.graph.node):
        del node.metadata_props[:]
        for position, output in enumerate(node.output):
            if output not in {value.name for value in model.graph.output}:
                renames[output] = f"t{index}_{position}"
                node.output[position] = renames[output]
    for node in model.graph.node:
        node.input[:] = [renames.get(name, name) for name in node.input]
    return model


def test_renamed_candidate_is_matched_by_structure(tmp_path):
    model = _renamed(onnx.load(str(RESNET)))
    path = tmp_path / "renamed.onnx"
    onnx.save(model, str(path))
    report = bisect_onnx.bisect_onnx_models(RESNET, path, np.load(RESNET_INPUT),
                                            candidate_runtime=bisect_onnx.RuntimeOptions(
                                                opt_level="disabled", promote="all"))
    assert report.verdict == "parity"
    assert any("matched by structure" in warning for warning in report.warnings)
    matched = [record for record in report.comparisons if record.match.matched_by]
    assert len(matched) >= 20
    assert matched[0].onnx_value.startswith("t") and matched[0].match.reference_value == "getitem"


def test_structural_pairing_reads_the_reference_external_data_beside_its_file(tmp_path):
    # Seed 72 of the corpus: the reference's weights live in a .data file beside it, not
    # in the working folder; reading them from there raised a raw ValidationError.
    reference = tmp_path / "reference" / "model.onnx"
    reference.parent.mkdir()
    onnx.save(onnx.load(str(RESNET)), str(reference), save_as_external_data=True,
              location="model.onnx.data")  # small tensors stay inline, as ORT needs
    candidate = tmp_path / "renamed.onnx"
    onnx.save(_renamed(onnx.load(str(RESNET))), str(candidate))
    report = bisect_onnx.bisect_onnx_models(reference, candidate, np.load(RESNET_INPUT),
                                            candidate_runtime=bisect_onnx.RuntimeOptions(
                                                opt_level="disabled", promote="all"))
    assert report.verdict == "parity"
    assert any(record.match.matched_by for record in report.comparisons)


# tolerances ---------------------------------------------------------------------------

def test_a_tolerance_file_pattern_loosens_one_value(made, tmp_path):
    levels = {"reference_runtime": bisect_onnx.RuntimeOptions(opt_level="disabled"),
              "candidate_runtime": bisect_onnx.RuntimeOptions(opt_level="disabled",
                                                             promote="all")}
    strict = bisect_onnx.bisect_onnx_models(RESNET, made["fp32_planted"], made["x"], **levels)
    assert strict.first_divergence.match.reference_value == "getitem_3"
    rules = tmp_path / "tolerances.txt"
    rules.write_text("# value   rtol  atol\ngetitem_3  0  1e3  # the planted Conv\n"
                     "nothing_*  0 0\n")
    loose = bisect_onnx.bisect_onnx_models(RESNET, made["fp32_planted"], made["x"],
                                           tolerance=bisect_onnx.Tolerance(rules=rules), **levels)
    loosened = next(r for r in loose.comparisons if r.match.reference_value == "getitem_3")
    assert loosened.figures.status == "pass" and loosened.figures.atol == 1e3
    assert loose.first_divergence.match.reference_value == "relu_1"  # the next value still fails
    assert any("nothing_*" in warning for warning in loose.warnings)


@pytest.mark.parametrize(("text", "message"), [
    ("relu 1e-3\n", r"rules\.txt:1: expected 'PATTERN RTOL ATOL'"),
    ("# ok\nrelu 1e-3 abc\n", r"rules\.txt:2: atol 'abc' is not a finite number"),
    ("relu -1 0\n", r"rules\.txt:1: rtol '-1'"),
])
def test_malformed_tolerance_file_is_one_line_naming_file_and_line(tmp_path, text, message):
    path = tmp_path / "rules.txt"
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        read_tolerance_file(path)


# production's verdict, bisection, culprits, repros, samples ------------------------------

def _output(path: Path, x: np.ndarray, *, promote: str) -> np.ndarray:
    """The final output of a session: production's (``fused``, read back) or a capture's."""
    from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner

    side = OnnxRuntimeRunner(path, promote=promote)
    ran = side.run([x])
    return np.asarray(ran.production.outputs[0] if promote == "fused"
                      else ran.capture.outputs[0].array)


def test_float16_fallback_takes_its_verdict_from_the_production_session(made):
    report = bisect_onnx.bisect_onnx_models(RESNET, made["fp16"], made["x"])
    assert report.capture["mode"] == "all values"  # the promote-all fallback
    reference = _output(RESNET, made["x"], promote="all").astype(np.float64)
    production = _output(made["fp16"], made["x"], promote="fused").astype(np.float64)
    captured = _output(made["fp16"], made["x"], promote="all").astype(np.float64)
    assert not np.array_equal(production, captured)  # other kernels: the check can fail
    output = report.final_outputs[0]
    assert output.figures.max_abs_error == float(np.max(np.abs(production - reference)))
    assert output.figures.max_abs_error != float(np.max(np.abs(captured - reference)))
    assert report.search == Search()  # parity: nothing to search


def test_planted_float16_error_is_found_from_a_faithful_capture(made):
    # The promote-all fallback rounds otherwise than production, by well under a tenth of
    # the float16 tolerance: its values stand, and nothing is probed.
    report = bisect_onnx.bisect_onnx_models(RESNET, made["fp16_planted"], made["x"])
    assert report.search.mode == "full capture"
    assert report.first_divergence.onnx_node == PLANTED_NODE
    assert report.culprit.onnx_node == PLANTED_NODE


def test_planted_float16_error_is_found_by_probing_production(made, monkeypatch):
    from bisect_onnx.search import modes as search_modes

    # Trusting the capture only when bitwise production's makes the same run probe.
    monkeypatch.setattr(search_modes, "FAITHFUL_SHARE", 0.0)
    report = bisect_onnx.bisect_onnx_models(RESNET, made["fp16_planted"], made["x"])
    search = report.search
    assert (search.mode, search.reason) == ("bisection", search_modes.CAPTURE_DIFFERS)
    assert (search.last_passing, search.first_failing) == ("relu", "getitem_3")
    assert search.graphs_match_production and len(search.probes) <= 5
    first = report.first_divergence
    assert (first.onnx_node, first.match.reference_value, first.candidate_dtype) == (
        PLANTED_NODE, "getitem_3", "float16")
    # The probe's own figures.
    assert first.figures.sqnr_db is not None and first.figures.sqnr_db < 20
    assert "Found by bisection" in report.summary()


def test_float16_culprit_is_the_planted_node_and_later_values_only_inherit(made):
    report = bisect_onnx.bisect_onnx_models(RESNET, made["fp16_planted"], made["x"],
                                            search=EVERY_CULPRIT)
    culprit = report.culprit
    assert (culprit.onnx_node, culprit.onnx_value) == (PLANTED_NODE, "getitem_3")
    assert culprit.local.introduced_here is True and culprit.local.max_abs_error > 0.1
    assert report.attribution.inputs == {"relu": "reference"}
    later = [record for record in report.comparisons[culprit.index + 1:] if record.failed]
    assert len(later) >= 10
    assert all(record.local.introduced_here is False for record in later)
    assert [record.onnx_value for record in report.culprits] == ["getitem_3"]


def test_qdq_culprit_is_judged_through_its_quantization_pair(made):
    report = bisect_onnx.bisect_onnx_models(RESNET, made["qdq_planted"], made["x"],
                                            search=EVERY_CULPRIT)
    assert report.culprit.onnx_node == PLANTED_NODE
    checked = [record for record in report.comparisons if record.local.introduced_here is not None]
    assert len(checked) >= 5
    # Downstream values whose Relu the quantization pair replaced are put through the
    # pair when rerun, as their rows are: none of them is blamed.
    assert [record.onnx_node for record in checked if record.local.introduced_here] == [
        PLANTED_NODE]


def test_repro_of_a_float16_culprit_feeds_float16_reference_values(made, tmp_path):
    report = bisect_onnx.bisect_onnx_models(
        RESNET, made["fp16_planted"], made["x"],
        output=bisect_onnx.OutputOptions(repro_dir=tmp_path / "repro"))
    repro = report.repro
    assert repro.reproduces is True
    assert (repro.nodes, repro.inputs) == ((PLANTED_NODE,), {"relu": "reference"})
    folder = Path(repro.folder)
    with np.load(folder / "inputs.npz") as inputs, np.load(folder / "expected.npz") as expected:
        assert inputs["relu"].dtype == expected["getitem_3"].dtype == np.float16
    assert "disagrees with the reference model" in (folder / "README.txt").read_text()
    import subprocess
    import sys

    run = subprocess.run([sys.executable, str(folder / "repro.py")], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 1 and "still disagrees with the reference model" in run.stdout


def test_samples_keep_the_worst_report_and_write_a_repro_per_sample(made, tmp_path):
    from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner
    from bisect_onnx.sources.random_inputs import synthesize_inputs

    report = bisect_onnx.bisect_onnx_models(
        RESNET, made["fp16_planted"], inputs=bisect_onnx.RandomInputs(seed=3, samples=3),
        output=bisect_onnx.OutputOptions(repro_dir=tmp_path))
    assert report.diverged and "worst of 3 random samples (3 diverged)" in report.note
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "sample-1", "sample-2", "sample-3"]
    specs = OnnxRuntimeRunner(RESNET).inputs
    needed = [bisect_onnx.bisect_onnx_models(
        RESNET, made["fp16_planted"], synthesize_inputs(specs, seed=3, sample=sample),
        ).final_outputs[0].figures.min_passing_atol for sample in range(3)]
    worst = int(np.argmax(needed))
    assert report.reference["inputs"] == f"random (seed 3, sample {worst + 1} of 3)"
    assert report.final_outputs[0].figures.min_passing_atol == needed[worst]


def test_reference_evaluator_loads_the_model_once_for_every_sample(monkeypatch):
    import onnx.reference

    made_evaluators = []

    class Counting(onnx.reference.ReferenceEvaluator):
        def __init__(self, *args, **kwargs):
            made_evaluators.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(onnx.reference, "ReferenceEvaluator", Counting)
    report = bisect_onnx.bisect_onnx_models(
        RESNET, reference_runtime="onnx.reference", inputs=bisect_onnx.RandomInputs(samples=2))
    assert report.verdict == "parity"
    assert len(made_evaluators) == 1


@pytest.mark.parametrize(("reference", "candidate", "message"), [
    ({"max_memory": "1GB"}, {}, "drop it from reference_runtime"),
    ({}, {"max_memory": 10**9}, "drop it from candidate_runtime"),
    ({"promote": "all"}, {}, "always all promoted; drop promote from reference_runtime"),
])
def test_runtime_options_it_cannot_honour_are_refused(made, reference, candidate, message):
    with pytest.raises(UsageError, match=message):
        bisect_onnx.bisect_onnx_models(
            RESNET, None, made["x"], reference_runtime=bisect_onnx.RuntimeOptions(**reference),
            candidate_runtime=bisect_onnx.RuntimeOptions(opt_level="basic", **candidate))


def test_a_model_proto_without_its_external_weights_is_one_line_input_error(made, tmp_path,
                                                                            monkeypatch):
    folder = tmp_path / "external"
    folder.mkdir()
    onnx.save_model(onnx.load(str(RESNET)), str(folder / "model.onnx"),
                    save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    bare = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    for reference, candidate in ((bare, made["fp16"]), (RESNET, bare)):
        with pytest.raises(InputError, match="external weights.*load_external_data=False"):
            bisect_onnx.bisect_onnx_models(reference, candidate, made["x"])
    from bisect_onnx.pipeline import prepare as api

    monkeypatch.setattr(api, "_PROTO_LIMIT", 1000)  # resnet_like stands in for a 2 GB proto
    with pytest.raises(InputError, match="over 2 GB.*save_as_external_data=True"):
        bisect_onnx.bisect_onnx_models(onnx.load(str(RESNET)), made["fp16"], made["x"])


def test_random_input_settings_are_refused_with_given_inputs_and_below_one(made, capsys):
    # The same refusal as the PyTorch form's: seed and dims cannot change given inputs
    # (at the API RandomInputs is passed as the inputs, so both cannot be given).
    for option in (["--samples", "2"], ["--seed", "7"]):
        assert main([str(RESNET), "--against", str(made["fp16"]), "--input",
                     str(RESNET_INPUT), *option]) == 2
        assert "apply to random inputs" in capsys.readouterr().err
    with pytest.raises(UsageError, match="whole number >= 1, got 0"):
        bisect_onnx.bisect_onnx_models(RESNET, made["fp16"],
                                       inputs=bisect_onnx.RandomInputs(samples=0))


def test_a_matmul_fused_into_its_bias_add_is_named_inside_the_kernel(fixture_case, tmp_path):
    # ONNX Runtime fuses each Linear's MatMul with its bias Add: the candidate shows only
    # the Add's output, yet the culprit is the planted MatMul, which the reference computes.
    _, inputs, exported = fixture_case("tiny_transformer")
    matmul = fx_segment(onnx.load(str(exported), load_external_data=False), "linear_4")[0]
    planted = tmp_path / "planted.onnx"
    plant(exported, planted, scale_initializer_input(matmul.name, 1, 1.01))
    report = bisect_onnx.bisect_onnx_models(exported, planted, inputs)
    assert report.diverged
    assert report.culprit.onnx_node == matmul.name and report.culprit.onnx_op == "MatMul"
    assert report.culprit.match.reference_node == matmul.name  # shown as the rows are
    assert report.first_divergence.onnx_op == "Add"
    summary = report.summary()
    assert summary.startswith(f"DIVERGED: culprit ONNX node {matmul.name!r} (MatMul)")
    assert "PyTorch" not in summary and "the reference model's values" in summary


# the command line -----------------------------------------------------------------------

def test_cli_float16_candidate_parity_then_planted_divergence(made, capsys, tmp_path):
    status = main([str(RESNET), "--against", str(made["fp16"]), "--input", str(RESNET_INPUT),
                   "-q"])
    assert status == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith("PARITY")
    report_path = tmp_path / "report.json"
    status = main([str(RESNET), "--against", str(made["fp16_planted"]), "--input",
                   str(RESNET_INPUT), "--json", str(report_path)])
    out = capsys.readouterr().out
    assert status == 1
    assert ">>  2    getitem_3" in out
    data = json.loads(report_path.read_text())
    assert data["first_divergence"]["onnx_node"] == PLANTED_NODE
    assert data["tolerance_basis"] == "float16 defaults"


def test_cli_optimization_levels_and_reference_evaluator(capsys):
    assert main([str(RESNET), "--opt-level", "disabled", "--against-opt-level", "all",
                 "--input", str(RESNET_INPUT), "-q"]) == 0
    assert main([str(RESNET), "--against-reference-evaluator", "-q"]) == 0  # random inputs
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all(line.startswith("PARITY") for line in out)


def test_cli_tolerances_file_and_html(made, tmp_path, capsys):
    rules = tmp_path / "rules.txt"
    rules.write_text("*  0.5  1.0\n")
    html = tmp_path / "report.html"
    status = main([str(RESNET), "--against", str(made["fp32_planted"]), "--input",
                   str(RESNET_INPUT), "--tolerances", str(rules), "--html", str(html), "-q"])
    assert status == 0, capsys.readouterr().err
    assert "rule(s) from" in capsys.readouterr().out
    assert "<html" in html.read_text()


def test_cli_repro_dir_and_samples_with_a_candidate(made, tmp_path, capsys):
    status = main([str(RESNET), "--against", str(made["fp16_planted"]), "--input",
                   str(RESNET_INPUT), "--repro-dir", str(tmp_path / "repro"), "-q"])
    assert status == 1, capsys.readouterr().err
    assert (tmp_path / "repro" / "model.onnx").is_file()
    report_path = tmp_path / "report.json"
    assert main([str(RESNET), "--against", str(made["fp16"]), "--samples", "2", "--json",
                 str(report_path), "-q"]) == 0
    assert "worst of 2 random samples (0 diverged)" in json.loads(report_path.read_text())[
        "note"]


@pytest.mark.parametrize(("argv", "message"), [
    (["missing.onnx", "--against", "{fp16}"], "MODEL file missing.onnx does not exist"),
    (["{resnet}", "--against", "missing.onnx"], "candidate file missing.onnx does not exist"),
    (["fixtures/models.py:tiny_mlp", "--against", "{fp16}"], "is not an ONNX file"),
    (["{input}", "--against", "{fp16}"], "is not an ONNX file"),
    (["{resnet}", "--against", "{input}"], "is not an ONNX model"),
    (["{resnet}", "--against", "{fp16}", "--tolerances", "{bad_rules}"],
     r"rules\.txt:1: expected"),
    (["{resnet}", "--against", "{fp16}", "--exporter", "dynamo"],
     "--exporter applies to a PyTorch MODEL"),
    (["{resnet}"], "is an ONNX model; pass it with --onnx"),
    (["{resnet}", "--against-provider", "NoSuchProvider"], "NoSuchProvider"),
    (["{resnet}", "--against-opt-level", "all"], "same model run the same way"),
    (["{resnet}", "--against", "{resnet}"], "is the reference's file"),
])
def test_cli_bad_input_is_one_line_with_status_2(made, tmp_path, capsys, argv, message,
                                                 fixtures_untouched):
    bad_rules = tmp_path / "rules.txt"
    bad_rules.write_text("relu\n")
    names = {"fp16": made["fp16"], "resnet": RESNET, "input": RESNET_INPUT,
             "bad_rules": bad_rules}
    before = tree_digest(made["fp16"].parent)
    status = main([item.format(**names) for item in argv])
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("bisect-onnx: error: ")
    assert re.search(message, err), err
    assert tree_digest(made["fp16"].parent) == before  # nothing written beside the models


def test_no_temporary_files_are_left_behind(made, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    model = onnx.load(str(made["fp16"]))
    bisect_onnx.bisect_onnx_models(onnx.load(str(RESNET)), model, np.load(RESNET_INPUT))
    assert list(tmp_path.iterdir()) == []


def test_the_quantized_weight_edit_changes_one_scale(made):
    original = {init.name: numpy_helper.to_array(init)
                for init in onnx.load(str(made["qdq"])).graph.initializer}
    edited = onnx.load(str(made["qdq_planted"]))
    changed = [init.name for init in edited.graph.initializer
               if init.name not in original
               or not np.array_equal(numpy_helper.to_array(init), original[init.name])]
    assert changed == ["layer1.conv1.weight_scale_planted"]
    assert Path(made["qdq_planted"]).exists()


def test_a_tolerance_file_saved_with_a_byte_order_mark_reads_alike(tmp_path):
    from bisect_onnx.judge.tolerances import read_tolerance_file

    path = tmp_path / "tolerances.txt"
    path.write_bytes(b"\xef\xbb\xbffc*\t1e-2\t1e-3\n")
    (rule,) = read_tolerance_file(path)
    assert rule.pattern == "fc*"


def _relu_graph(path, *, flattened: bool):
    """x -> Relu (named r) -> ReduceSum; ``flattened`` computes r as [8, 8], then back."""
    from onnx import TensorProto, helper, numpy_helper

    nodes, initializers = [], []
    source = "x"
    if flattened:  # as a simplifier might, with the same value name for another shape
        initializers += [numpy_helper.from_array(np.array([8, 8], np.int64), "flat"),
                         numpy_helper.from_array(np.array([2, 4, 8], np.int64), "back")]
        nodes.append(helper.make_node("Reshape", ["x", "flat"], ["x_flat"], name="to_flat"))
        source = "x_flat"
    nodes.append(helper.make_node("Relu", [source], ["r"], name="relu"))
    relu = "r"
    if flattened:
        nodes.append(helper.make_node("Reshape", ["r", "back"], ["r_back"], name="to_back"))
        relu = "r_back"
    nodes.append(helper.make_node("ReduceSum", [relu], ["out"], name="sum", keepdims=0))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [])], initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_a_name_kept_for_another_shape_is_not_compared(tmp_path):
    reference, candidate = tmp_path / "reference.onnx", tmp_path / "candidate.onnx"
    _relu_graph(reference, flattened=False)
    _relu_graph(candidate, flattened=True)
    x = np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32)
    report = bisect_onnx.bisect_onnx_models(reference, candidate, x)
    assert report.verdict == "parity" and not report.hidden_divergences
    (declined,) = [item for item in report.unaligned if item.name == "r"]
    assert "another shape ([8, 8] against [2, 4, 8])" in declined.reason


def test_the_promote_all_fallback_is_made_once_and_said_in_every_sample(made, monkeypatch):
    from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner

    promotions = []
    original = OnnxRuntimeRunner.with_promotion

    def counting(self, promote):
        promotions.append(promote)
        return original(self, promote)

    monkeypatch.setattr(OnnxRuntimeRunner, "with_promotion", counting)
    report = bisect_onnx.bisect_onnx_models(
        RESNET, made["fp16_planted"], inputs=bisect_onnx.RandomInputs(seed=3, samples=3))
    assert promotions == ["all"]  # the first sample falls back; the next ones keep it
    assert any("candidate values survive ONNX Runtime's optimized graph" in warning
               for warning in report.warnings)


def test_a_hard_link_of_the_reference_run_alike_is_refused(tmp_path, capsys):
    import os
    import shutil

    reference = tmp_path / "resnet.onnx"
    shutil.copyfile(RESNET, reference)
    os.link(reference, tmp_path / "same.onnx")
    argv = [str(reference), "--against", str(tmp_path / "same.onnx"), "--input",
            str(RESNET_INPUT)]
    assert main(argv) == 2
    assert "is the reference's file" in capsys.readouterr().err
    # Run another way, the same file is a comparison worth making.
    assert main([*argv, "--against-opt-level", "disabled"]) in (0, 1)
