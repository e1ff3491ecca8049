"""The driver of culprit attribution: local checks, classification, their findings.

:mod:`bisect_onnx.search.attribution` decides from local results; this module produces them
(:mod:`bisect_onnx.search.local` runs the failing values' nodes on PyTorch's inputs,
:mod:`bisect_onnx.search.classify` reruns a locally failing node in float64 on both sides)
and returns what was found as :class:`~bisect_onnx.judge.findings.AttributionFindings`
(:mod:`bisect_onnx.search.claims` says what each check shows).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from bisect_onnx.errors import BisectOnnxError
from bisect_onnx.graph.reach import feeding
from bisect_onnx.graph.segments import InputSource, Segment, embed_external_data, segment_model
from bisect_onnx.judge.compare import Status
from bisect_onnx.judge.findings import AttributionFindings
from bisect_onnx.judge.reading import Reading
from bisect_onnx.judge.records import Record
from bisect_onnx.judge.tolerances import Judge, Tolerance
from bisect_onnx.judge.verdict import identical_values
from bisect_onnx.runtime.runner import Runner
from bisect_onnx.runtime.sides import CapturedValue, SampleArrays
from bisect_onnx.search.alone import narrow_to_failing_node
from bisect_onnx.search.attribution import CulpritSearch, LocalResult
from bisect_onnx.search.claims import TorchOps, attribution_findings, with_nodeless
from bisect_onnx.search.classify import Kind
from bisect_onnx.search.evidence import Evidence
from bisect_onnx.search.inner_values import inner_references
from bisect_onnx.search.inserted import exporters_node, narrow_to_unpaired
from bisect_onnx.search.inside_kernel import InsideKernels, name_inside_kernels
from bisect_onnx.search.local import LocalCheck, LocalRerun, boundary_references, run_locally
from bisect_onnx.search.nodeless import fx_span, nodeless_classification, nodeless_culprit
from bisect_onnx.search.within_tolerance import entering_within_tolerance

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from bisect_onnx.search.classify import Classification

__all__ = ["attribute_divergence", "Evidence"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


def attribute_divergence(report: Reading, candidate: Runner, values: SampleArrays, *,
                         tolerance: Judge, everything: bool = False,
                         evidence: Evidence = Evidence(),  # noqa: B008 (frozen)
                         ) -> tuple[AttributionFindings | None, dict[str, np.ndarray]]:
    """Find which failing values were introduced where they fail, and classify them.

    Returns the values the first culprit's nodes computed from exact inputs (for
    looking inside a multi-node op), with the findings (``None`` when nothing fails).
    ``tolerance`` is the run's judge: each value is checked and classified at the
    tolerance its row was judged by. ``everything``: every culprit, not only the first.
    """
    reference_values, candidate_values = values.reference, values.candidate
    ops, program, op_segments = evidence.ops, evidence.program, evidence.op_segments
    failing = [record for record in report.comparisons if record.failed]
    upstream = feeding(candidate.view, [record.onnx_value for record in report.final_outputs
                                         if record.failed],
                       candidate.model, identical_values(report.comparisons)
                       ) if report.diverged else None
    if upstream is not None:  # what feeds no failing output is not why they fail
        failing = [record for record in failing if record.onnx_value in upstream]
    if report.search.first_failing and report.first_divergence in failing:
        # Found by probing production: earlier rows failed in the capture session only.
        failing = failing[failing.index(report.first_divergence):]
    if not failing:
        return None, {}
    torch_values = ({**{name: value.array for name, value in ops.values.items()},
                     **ops.graph_inputs} if ops else {})
    checker = _LocalChecker(report, candidate, failing, values, evidence,
                            torch_values=torch_values, everything=everything,
                            tolerance=tolerance)
    attribution = CulpritSearch([record.onnx_value for record in failing], checker).run(
        everything=everything)
    findings = attribution_findings(
        report.comparisons, attribution, checker.checks, checker.kinds, candidate.nodes,
        atol=tolerance.base.atol, everything=everything,
        torch_ops=TorchOps(op_segments, checker.torch_ops if program else None))
    nodeless = _safely(None, "a computation with no ONNX node", partial(
        nodeless_culprit, failing[0], checker.checks.get(failing[0].onnx_value),
        checker.torch_side.fx_names, candidate_values, evidence,
        tolerance=tolerance.of(failing[0]), nodes=candidate.nodes))
    if nodeless is not None:  # the first failing value's check was fed the wrong value
        return with_nodeless(findings, nodeless, failing[0], nodeless_classification(nodeless),
                             atol=tolerance.of(failing[0]).atol), {}
    first = attribution.culprit
    if first is None:
        return _with_entry(findings, report, failing[0], candidate, checker), {}
    inner = inner_references(ops, evidence.kernel_references, evidence.modules,
                             checker.checks, candidate, candidate_values)
    findings = _narrowed(findings, report, checker, first, inner, evidence,
                         (reference_values, failing[0].index))
    return findings, checker.checks[first].values


def _with_entry(findings: AttributionFindings, report: Reading, first: Record,
                candidate: Runner, checker: _LocalChecker) -> AttributionFindings:
    """With drift: where the error comes in within tolerance, if a node alone shows it."""
    if not findings.evidence.get("drift"):
        return findings
    upstream = feeding(candidate.view, [first.onnx_value], candidate.model)
    entry = _safely(None, "where the error comes in within tolerance", partial(
        entering_within_tolerance, report.comparisons, first,
        upstream if upstream is not None else frozenset(), candidate,
        reference=checker.reference_values, candidate_values=checker.candidate_values,
        graph_inputs=checker.graph_inputs, tolerance=checker.tolerance.of(first)))
    if entry is None:
        return findings
    return replace(findings, evidence={**findings.evidence, "within_tolerance": entry})


def _narrowed(findings: AttributionFindings, report: Reading, checker: _LocalChecker,
              first: str, inner: Mapping[str, CapturedValue], evidence: Evidence,
              first_failing: tuple[Mapping[str, np.ndarray], int]) -> AttributionFindings:
    """The culprit narrowed inside its segment, each step of which may decline.

    A value inside a fused kernel, a node with no counterpart, or the one node that
    fails alone. ``inner``: the reference's values inside fused kernels, by the
    candidate's names. ``first_failing``: PyTorch's values by ONNX name, and the first
    failing row's index.
    """
    references, first_index = first_failing
    candidate, tolerance, compare = checker.candidate, checker.tolerance, checker.compare
    row, graph_inputs = checker.by_value[first], checker.graph_inputs
    candidate_values = checker.candidate_values
    findings = _safely(findings, "the value inside a kernel", partial(
        name_inside_kernels, report, findings, first,
        InsideKernels(candidate, checker.checks, inner), evidence.op_segments, tolerance,
        partial(_classify_inside, checker, candidate, inner)))
    findings = _safely(findings, "a node with no counterpart", partial(
        narrow_to_unpaired, findings, checker.checks[first],
        {**{name: value.array for name, value in inner.items()},
         **references}, candidate_values,
        LocalRerun(candidate, graph_inputs, tolerance.base, compare), first_index,
        evidence.has_counterpart or exporters_node))
    return _safely(findings, "the node of a segment that fails alone", partial(
        narrow_to_failing_node, findings, checker.checks[first], row=row, inner=inner,
        references=checker.reference_values, candidate_values=candidate_values,
        rerun=LocalRerun(candidate, graph_inputs, tolerance.of(row)), judge_row=compare))


def _safely(fallback: _T, what: str, step: Callable[[], _T]) -> _T:
    """A refinement's result, or ``fallback`` where it fails: it must not cost the report."""
    try:
        return step()
    except Exception:  # any failure of a refinement leaves the findings as they were
        logger.info("could not look for %s", what, exc_info=True)
        return fallback


@dataclass(frozen=True)
class _TorchSide:
    """What PyTorch offers a culprit's float64 rerun (all empty against an ONNX reference)."""

    program: ExportedProgram | None = None
    """The program whose ops over the culprit's segment are rerun."""
    values: Mapping[str, np.ndarray] = field(default_factory=dict)
    """PyTorch's values by FX name: what those ops read."""
    fx_names: Mapping[str, str] = field(default_factory=dict)
    """ONNX value -> the FX name it was paired with: where those ops start."""
    float64: Callable[[LocalCheck], np.ndarray | None] | None = None
    """Else PyTorch's float64 value of a checked segment (its module call rerun)."""


class _LocalChecker:
    """The checker :class:`CulpritSearch` calls: local runs, then float64 classification.

    It keeps every value's local check and classification, for writing into the report.
    """

    def __init__(self, report: Reading, candidate: Runner, failing: Sequence[Record],
                 values: SampleArrays, evidence: Evidence, *,
                 torch_values: Mapping[str, np.ndarray], everything: bool,
                 tolerance: Judge) -> None:
        self.candidate, self.tolerance = candidate, tolerance
        self.reference_values, self.candidate_values = (
            boundary_references(candidate, values.reference, torch_values), values.candidate)
        self.graph_inputs = values.graph_inputs
        self.everything, self.compare = everything, evidence.compare
        self.by_value = {record.onnx_value: record for record in failing}
        # The torch side of a segment stops where the ONNX side does: at its inputs, under
        # the FX names they were paired with (renamed or structurally matched values too).
        fx_names = {record.onnx_value: record.fx_node for record in report.comparisons
                    if record.fx_node}
        self.torch_side = _TorchSide(evidence.program, torch_values, fx_names,
                                     evidence.torch_float64)
        self.checks: dict[str, LocalCheck] = {}
        self.kinds: dict[str, Classification] = {}
        self.found: list[str] = []  # culprits beyond rounding classified so far

    def __call__(self, names: Sequence[str]) -> dict[str, LocalResult | None]:
        """Run ``names`` locally in one session, and say how each fares."""
        candidate = self.candidate
        self.checks.update(run_locally(
            candidate, names, reference_values=self.reference_values,
            candidate_values=self.candidate_values, graph_inputs=self.graph_inputs,
            tolerance=self.tolerance.base, compare=self.compare))
        # In order: whether one is classified depends on the culprits found before it.
        return {name: self._result(name) for name in names}

    def torch_ops(self, name: str) -> int | None:
        """How many torch ops compute ``name`` from its checked segment's inputs."""
        record, check = self.by_value.get(name), self.checks.get(name)
        if (record is None or record.fx_node is None or check is None
                or check.segment is None):
            return None
        torch_side = self.torch_side
        frontier = {torch_side.fx_names.get(value, value) for value in check.segment.inputs}
        span = fx_span(torch_side.program, record.fx_node, frontier)
        return None if span is None else len(span)

    def _result(self, name: str) -> LocalResult | None:
        local = self.checks[name].comparison
        if local is None:
            return None
        fails = local.status != Status.PASS
        # The float64 reruns cost: past the first real culprit only with everything.
        if fails and (self.everything or not self.found):
            self.kinds[name] = _classify(self.checks[name], self.by_value[name], self.candidate,
                                         self.reference_values, self.torch_side,
                                         self.tolerance.of(self.by_value[name]))
        noise = fails and name in self.kinds and self.kinds[name].kind == Kind.FLOAT_PRECISION
        if fails and not noise:
            self.found.append(name)
        # A record judged by a tolerance of its own (ONNX against ONNX) counts by it.
        atol = self.tolerance.of(self.by_value[name]).atol
        return LocalResult(fails=fails, excess=_excess(local.min_passing_atol, atol),
                           noise=noise)


def _classify_inside(checker: _LocalChecker, candidate: Runner,
                     references: Mapping[str, CapturedValue], inner: Record,
                     nodes: Sequence[int], check: LocalCheck,
                     tolerance: Tolerance) -> Classification | None:
    """The value named inside a kernel, classified on the nodes that compute it alone.

    Module level (PyTorch's side a module call rerun in float64), on a runtime whose
    capture leaves values between its layers out (OpenVINO): a kernel's segment that
    reaches back past such values (a residual input) stays unclassified, while the
    nodes inside it that compute ``inner`` (one node or one op) may read only values
    the check was fed from PyTorch. Those nodes are rerun in float64 on both sides from
    those very inputs. There op level would name the same node at the cost of tracing
    the whole model (the call around it reads a value no capture holds); elsewhere the
    call is traced and its op rows say more (where NaN starts), so nothing is done.
    ``None`` also where a node reads a value the check computed or took from the
    candidate: PyTorch's rerun could not start from what the nodes read.
    """
    if (checker.torch_side.float64 is None or check.segment is None
            or not candidate.layer_boundaries):
        return None
    graph = candidate.model.graph
    computed = {output for index in nodes for output in graph.node[index].output}
    read = [name for index in nodes for name in graph.node[index].input if name]
    entering = [name for name in dict.fromkeys(read)
                if name not in computed and name not in check.segment.initializers]
    fed = (InputSource.REFERENCE, InputSource.GRAPH_INPUT)
    local = check.values.get(inner.onnx_value)
    if (local is None or inner.onnx_value not in references
            or any(check.segment.inputs.get(name) not in fed for name in entering)):
        return None
    segment = Segment(nodes=list(nodes),
                      initializers={name for name in read if name in check.segment.initializers},
                      inputs={name: check.segment.inputs[name] for name in entering})
    alone = LocalCheck(inner.onnx_value, segment=segment,
                       nodes=[graph.node[index].name for index in nodes],
                       feeds={name: check.feeds[name] for name in entering}, local=local)
    return _classify(alone, inner, candidate,
                     {inner.onnx_value: references[inner.onnx_value].array},
                     _TorchSide(float64=partial(checker.torch_side.float64, known=references)),
                     tolerance)


def _classify(check: LocalCheck, record: Record, candidate: Runner,
              reference_values: Mapping[str, np.ndarray], torch_side: _TorchSide,
              tolerance: Tolerance) -> Classification:
    """Which side is wrong: the culprit rerun in float64 on both sides, at its tolerance."""
    from bisect_onnx.search.classify import classify, kernel_runtime
    try:
        torch64, onnx64 = _float64_reruns(check, record, candidate, torch_side)
        if torch64 is None and torch_side.float64 is not None and onnx64 is not None:
            torch64 = torch_side.float64(check)
    except BisectOnnxError as error:  # a refinement must not cost the report
        logger.info("no float64 rerun of %s: %s", check.value, error)
        torch64 = onnx64 = None
    return classify(torch64=torch64, onnx64=onnx64, runtime=kernel_runtime(candidate),
                    torch32=np.asarray(reference_values[check.value]),
                    ort32=np.asarray(check.local), rtol=tolerance.rtol, atol=tolerance.atol)


def _float64_reruns(check: LocalCheck, record: Record, candidate: Runner,
                    torch_side: _TorchSide):
    """The culprit's segment in float64: the same ops in torch, the nodes in onnx.reference."""
    from bisect_onnx.search.float64_reruns import onnx_segment_in_float64, torch_op_in_float64

    torch64 = None
    program = torch_side.program
    if program is not None and record.fx_node is not None and check.segment is not None:
        frontier = {torch_side.fx_names.get(name, name) for name in check.segment.inputs}
        span = fx_span(program, record.fx_node, frontier)
        values64 = dict(torch_side.values)
        for node in span or ():
            if isinstance(node.meta.get("val"), (tuple, list)):
                continue  # a tuple-valued op: its getitem reruns it
            computed = torch_op_in_float64(node, program, values64)
            if computed is None:
                break
            values64[node.name] = computed
        else:
            torch64 = values64.get(record.fx_node) if span else None
    onnx64 = None
    if check.segment is not None and check.local is not None:
        model = segment_model(candidate.model, check.segment, check.feeds, check.value,
                              check.local)
        for tensor in model.graph.initializer:
            embed_external_data(tensor, candidate.path.resolve().parent)
        onnx64 = onnx_segment_in_float64(model, check.feeds, check.value)
    return torch64, onnx64


def _excess(min_passing_atol: float | None, atol: float) -> float:
    if min_passing_atol is None:
        return math.inf
    return min_passing_atol / atol if atol > 0 else min_passing_atol
