"""The assembler holds a verdict's claims to the evidence the run checked."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bisect_onnx.judge.assembly import assemble
from bisect_onnx.judge.findings import (
    AttributionFindings,
    ComparisonFindings,
    Findings,
    LocalFigures,
    Refinement,
    RowRef,
)
from bisect_onnx.judge.reading import STRICT_ENV, InvariantError
from bisect_onnx.judge.record_parts import ComparisonFigures
from bisect_onnx.judge.records import Coverage, Record
from bisect_onnx.judge.report_parts import CulpritSegment


def row(index: int, status: str = "pass", module: str | None = None) -> Record:
    return Record(index=index, onnx_node=f"node_{index}", onnx_op="Add", onnx_value=f"v{index}",
                  torch_module=module or f"m{index}", torch_op=None, source=None, shape=[2],
                  dtype="float32", candidate_shape=[2], candidate_dtype="float32",
                  figures=ComparisonFigures(max_abs_error=0.5 if status == "fail" else 0.0,
                                            max_rel_error=0.1, mismatch_fraction=0.5,
                                            min_passing_atol=0.5 if status == "fail" else 0.0,
                                            nan_mismatch=0, status=status))


ROWS = (row(0), row(1, "fail"), row(2, "fail"))
OUTPUT = row(0, "fail", module="(output 0)")


def comparison(**changes) -> ComparisonFindings:
    fields = dict(verdict="diverged", rtol=1e-3, atol=1e-5, final_outputs=(OUTPUT,),
                  comparisons=ROWS, coverage=Coverage(3, 3, 3, 3), first_divergence=RowRef("v1"))
    return ComparisonFindings(**{**fields, **changes})


def figures(**changes) -> LocalFigures:
    fields = dict(introduced_here=True, local_max_abs_error=0.5, local_status="fail",
                  local_exceeds=True, compute_nodes=("node_1",), isolation="node")
    return LocalFigures(**{**fields, **changes})


def blamed(local: LocalFigures, **changes) -> Findings:
    attribution = AttributionFindings(checked={"v1": local}, culprits=(RowRef("v1"),))
    return Findings(comparison(), attribution=attribution, **changes)


def test_the_culprit_and_first_divergence_are_the_rows_themselves():
    report = assemble(blamed(figures()))
    assert report.culprit is report.comparisons[1] is report.first_divergence
    local = report.culprit.local
    assert local.introduced_here is True and local.max_abs_error == 0.5


@pytest.mark.parametrize(("local", "why"), [
    (figures(introduced_here=False), "did not fail"),
    (figures(local_exceeds=False, local_max_abs_error=0.0), "within its tolerance"),
    (figures(isolation=None, compute_nodes=("a", "b", "c")), "ran 3 nodes of several ops"),
])
def test_a_culprit_its_evidence_does_not_hold_is_an_error_in_strict_runs(local, why,
                                                                          monkeypatch):
    monkeypatch.setenv(STRICT_ENV, "1")
    with pytest.raises(InvariantError, match=why):
        assemble(blamed(local))
    monkeypatch.setenv(STRICT_ENV, "0")
    report = assemble(blamed(local))  # a user's run: weakened, and said why
    assert report.culprit is None
    codes = [getattr(warning, "code", None) for warning in report.warnings]
    assert codes == ["culprit-not-shown"] and why in report.warnings[0]


def test_a_node_found_inside_a_checked_segment_is_the_culprit():
    segment = {"from": ["v0"], "to": "v1", "nodes": ["node_t", "node_a", "node_1"],
               "ops": {"node_t": "Transpose", "node_a": "Mul", "node_1": "Add"},
               "local_max_abs_error": 0.5, "local_nan_mismatch": 0}
    attribution = AttributionFindings(
        checked={"v1": figures(isolation=None, compute_nodes=("node_a", "node_1"))},
        segment=segment)
    alone = assemble(Findings(comparison(), attribution=attribution))
    assert alone.culprit is None and alone.culprit_segment == CulpritSegment.from_dict(segment)
    inside_op = {"fx_node": "mul", "nodes": ["node_a", "node_1"], "node": "node_a",
                 "value": "v_a", "how": "by the op exported alone"}
    # The op's nodes; node_t only moves data.
    narrowed = assemble(Findings(comparison(), attribution=attribution, refinement=Refinement(
        inside_op=inside_op, node=("node_a", "Mul"))))
    assert narrowed.culprit_segment is None
    assert (narrowed.culprit.onnx_node, narrowed.culprit.onnx_op) == ("node_a", "Mul")
    assert narrowed.first_divergence is narrowed.culprit
    # Another compute node upstream of the op could have fed it wrong inputs: no culprit.
    upstream = replace(attribution, segment={**segment, "ops": {**segment["ops"],
                                                                "node_t": "MatMul"}})
    kept = assemble(Findings(comparison(), attribution=upstream, refinement=Refinement(
        inside_op=inside_op, node=("node_a", "Mul"))))
    assert kept.culprit is None and kept.culprit_segment is not None


def test_a_coverage_the_rows_do_not_hold_is_counted_from_the_rows(monkeypatch):
    findings = Findings(comparison(coverage=Coverage(3, 3, 5, 5)))
    monkeypatch.setenv(STRICT_ENV, "1")
    with pytest.raises(InvariantError, match="5 module calls compared, rows hold 3"):
        assemble(findings)
    monkeypatch.setenv(STRICT_ENV, "0")
    report = assemble(findings)
    assert report.coverage.aligned_modules == 3
    assert [warning.code for warning in report.warnings] == ["rows-disagree"]


def test_a_first_divergence_that_passes_is_an_error(monkeypatch):
    monkeypatch.setenv(STRICT_ENV, "1")
    with pytest.raises(InvariantError, match="no failing row"):
        assemble(Findings(comparison(first_divergence=RowRef("v0"))))
    with pytest.raises(InvariantError, match="disagrees with the final outputs"):
        assemble(Findings(comparison(verdict="parity", first_divergence=None)))
