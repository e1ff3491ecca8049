"""The driver of culprit attribution: local checks, classification, the report's fields.

:mod:`bisect_onnx.search.attribution` decides from local results; this module produces them
(:mod:`bisect_onnx.search.local` runs the failing values' nodes on PyTorch's inputs,
:mod:`bisect_onnx.search.classify` reruns a locally failing node in float64 on both sides)
and writes what was found into the report: ``introduced_here`` and the local figures
on each checked record, ``report.culprit`` and ``report.attribution``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from bisect_onnx.align.modules import Pair
from bisect_onnx.errors import BisectOnnxError
from bisect_onnx.graph.provenance import Provenance
from bisect_onnx.graph.segments import embed_external_data, segment_model
from bisect_onnx.judge.compare import ArrayComparison, Status, compare_arrays
from bisect_onnx.judge.records import Record, Report, make_record
from bisect_onnx.pytorch.op_values import OpCapture
from bisect_onnx.runtime.sides import CapturedValue
from bisect_onnx.search.attribution import Attribution, CulpritSearch, LocalResult
from bisect_onnx.search.classify import Kind
from bisect_onnx.search.local import LocalCheck, run_locally

__all__ = ["attribute_divergence"]

logger = logging.getLogger(__name__)


def attribute_divergence(
    report: Report,
    candidate: Any,
    reference_values: Mapping[str, np.ndarray],
    candidate_values: Mapping[str, np.ndarray],
    graph_inputs: Mapping[str, np.ndarray],
    *,
    program: Any = None,
    ops: OpCapture | None = None,
    modules: Any = None,
    everything: bool = False,
    compare: Callable[[str, np.ndarray], ArrayComparison] | None = None,
    kernel_references: Mapping[str, CapturedValue] | None = None,
    torch_float64: Callable[[LocalCheck], np.ndarray | None] | None = None,
) -> dict[str, np.ndarray]:
    """Find which failing values were introduced where they fail, and classify them.

    ``reference_values`` are PyTorch's values by ONNX value name; ``program`` and
    ``ops`` (PyTorch's op values by FX node name) let an op be rerun in float64, and
    the values inside a fused kernel be compared. Returns the values the first
    culprit's nodes computed from exact inputs (for looking inside a multi-node op).
    ``modules`` (``(module capture, call index)``) does for module rows what ``ops``
    does for op rows. ``compare`` judges a local result where the reference needs
    converting (see :func:`bisect_onnx.search.local.run_locally`).
    ``kernel_references`` are the reference's values of the values ONNX Runtime fused
    away (ONNX against ONNX: the reference model computes them), by the candidate's
    names, to name the node that went wrong inside a fused kernel as ``ops`` do.
    ``torch_float64`` gives PyTorch's float64 value of a checked segment where no
    program does (module level: its enclosing module call rerun).
    """
    failing = [record for record in report.comparisons if record.failed]
    if (report.search or {}).get("first_failing") and report.first_divergence in failing:
        # Found by probing production: earlier rows failed in the capture session only.
        failing = failing[failing.index(report.first_divergence):]
    if not failing:
        return {}
    torch_values = ({**{name: value.array for name, value in ops.values.items()},
                     **ops.graph_inputs} if ops else {})
    checker = _LocalChecker(report, candidate, failing, reference_values, candidate_values,
                            graph_inputs, program=program, torch_values=torch_values,
                            everything=everything, compare=compare,
                            torch_float64=torch_float64)
    attribution = CulpritSearch([record.onnx_value for record in failing], checker).run(
        everything=everything)
    _write_back(report, attribution, checker.checks, checker.kinds, everything=everything)
    first = attribution.culprit
    if first is None:
        return {}
    if ops is not None or modules is not None or kernel_references is not None:
        inner_references = (dict(ops.values) if ops is not None
                            else dict(kernel_references) if kernel_references is not None
                            else _module_references(modules, checker.checks, candidate,
                                                    candidate_values))
        _name_inside_kernels(report, first, checker.checks, candidate, inner_references)
    return checker.checks[first].values


class _LocalChecker:
    """The checker :class:`CulpritSearch` calls: local runs, then float64 classification.

    It keeps every value's local check and classification, for writing into the report.
    """

    def __init__(self, report: Report, candidate: Any, failing: Sequence[Record],
                 reference_values: Mapping[str, np.ndarray],
                 candidate_values: Mapping[str, np.ndarray],
                 graph_inputs: Mapping[str, np.ndarray], *, program: Any,
                 torch_values: Mapping[str, np.ndarray], everything: bool,
                 compare: Callable[[str, np.ndarray], ArrayComparison] | None,
                 torch_float64: Callable[[LocalCheck], np.ndarray | None] | None) -> None:
        self.report, self.candidate, self.program = report, candidate, program
        self.torch_float64 = torch_float64
        self.reference_values, self.candidate_values = reference_values, candidate_values
        self.graph_inputs, self.torch_values = graph_inputs, torch_values
        self.everything, self.compare = everything, compare
        self.by_value = {record.onnx_value: record for record in failing}
        # The torch side of a segment stops where the ONNX side does: at its inputs, under
        # the FX names they were paired with (renamed or structurally matched values too).
        self.fx_names = {record.onnx_value: record.fx_node for record in report.comparisons
                         if record.fx_node}
        self.checks: dict[str, LocalCheck] = {}
        self.kinds: dict[str, Any] = {}
        self.found: list[str] = []  # culprits beyond rounding classified so far

    def __call__(self, names: Sequence[str]) -> dict[str, LocalResult | None]:
        """Run ``names`` locally in one session, and say how each fares."""
        report, candidate = self.report, self.candidate
        self.checks.update(run_locally(
            candidate.model, candidate.path.resolve().parent, names,
            reference_values=self.reference_values, candidate_values=self.candidate_values,
            graph_inputs=self.graph_inputs, rtol=report.rtol, atol=report.atol,
            provider=candidate.provider, opt_level=candidate.opt_level, compare=self.compare))
        # In order: whether one is classified depends on the culprits found before it.
        return {name: self._result(name) for name in names}

    def _result(self, name: str) -> LocalResult | None:
        local = self.checks[name].comparison
        if local is None:
            return None
        fails = local.status != Status.PASS
        # The float64 reruns cost: past the first real culprit only with everything.
        if fails and (self.everything or not self.found):
            self.kinds[name] = _classify(self.checks[name], self.by_value[name], self.candidate,
                                         self.reference_values, self.program, self.torch_values,
                                         self.fx_names, self.report, self.torch_float64)
        noise = fails and name in self.kinds and self.kinds[name].kind == Kind.FLOAT_PRECISION
        if fails and not noise:
            self.found.append(name)
        # A record judged by a tolerance of its own (ONNX against ONNX) counts by it.
        record_atol = self.by_value[name].atol
        atol = self.report.atol if record_atol is None else record_atol
        return LocalResult(fails=fails, excess=_excess(local.min_passing_atol, atol),
                           noise=noise)


def _name_inside_kernels(report: Report, first: str, checks: Mapping[str, LocalCheck],
                         candidate: Any, references: Mapping[str, CapturedValue]) -> None:
    """Where a culprit's segment holds a fused kernel, name the failing value inside it."""
    refined = {record.onnx_value: _inside_kernel(record, checks[record.onnx_value],
                                                 candidate, references, report)
               for record in (report.culprits or [report.culprit])}
    if report.culprits is not None:
        report.culprits = [refined[record.onnx_value] or record for record in report.culprits]
    inner = refined.get(first)
    if inner is not None:
        report.attribution["inside_kernel"] = {
            "value": inner.onnx_value, "node": inner.onnx_node, "kernel_output": first}
        report.culprit = inner


def _classify(check: LocalCheck, record: Record, candidate: Any,
              reference_values: Mapping[str, np.ndarray], program: Any,
              torch_values: Mapping[str, np.ndarray], fx_names: Mapping[str, str],
              report: Report, torch_float64: Callable[[LocalCheck], Any] | None) -> Any:
    """Which side is wrong: the culprit rerun in float64 on both sides."""
    from bisect_onnx.search.classify import classify

    try:
        torch64, onnx64 = _float64_reruns(check, record, candidate, program, torch_values,
                                          fx_names)
        if torch64 is None and torch_float64 is not None and onnx64 is not None:
            torch64 = torch_float64(check)
    except BisectOnnxError as error:  # a refinement must not cost the report
        logger.info("no float64 rerun of %s: %s", check.value, error)
        torch64 = onnx64 = None
    return classify(torch64=torch64, onnx64=onnx64,
                    torch32=np.asarray(reference_values[check.value]),
                    ort32=np.asarray(check.local), rtol=report.rtol, atol=report.atol)


def _float64_reruns(check: LocalCheck, record: Record, candidate: Any, program: Any,
                    torch_values: Mapping[str, np.ndarray], fx_names: Mapping[str, str]):
    """The culprit's segment in float64: the same ops in torch, the nodes in onnx.reference."""
    from bisect_onnx.search.float64_reruns import onnx_segment_in_float64, torch_op_in_float64

    torch64 = None
    if program is not None and record.fx_node is not None and check.segment is not None:
        frontier = {fx_names.get(name, name) for name in check.segment.inputs}
        span = _fx_span(program, record.fx_node, frontier)
        values64 = dict(torch_values)
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


#: Past this many ops the torch side of a segment is not rerun (unclassified instead):
#: a segment that long is a module call or a cut, not a culprit worth a float64 rerun.
_MAX_SPAN = 64


def _fx_span(program: Any, output: str, frontier: set[str]) -> list[Any] | None:
    """The ops that compute ``output`` from the segment's inputs, in graph order.

    The ONNX segment may hold several ops (a kernel ONNX Runtime fused, a Conv the
    exporter folded a BatchNorm into): the torch side must compute the same span, not
    the last op alone, for the two float64 results to be comparable.
    """
    nodes = {node.name: node for node in program.graph.nodes}
    order = {name: index for index, name in enumerate(nodes)}
    span: set[str] = set()
    stack = [output]
    while stack:
        name = stack.pop()
        if name in span or (name in frontier and name != output):
            continue
        node = nodes.get(name)
        if node is None:
            return None
        if node.op != "call_function":
            continue  # an input or a weight: the rerun reads it directly
        span.add(name)
        if len(span) > _MAX_SPAN:
            return None
        stack.extend(source.name for source in node.all_input_nodes)
    return sorted((nodes[name] for name in span), key=lambda node: order[node.name])


def _module_references(modules: Any, checks: Mapping[str, LocalCheck], candidate: Any,
                       candidate_values: Mapping[str, np.ndarray]) -> dict[str, CapturedValue]:
    """PyTorch's module outputs by the ONNX values they align to, fused ones included.

    The module alignment is run again as if every value the culprits' nodes computed
    had been captured, so a module whose output lives inside a fused kernel is paired.
    """
    from bisect_onnx.align.modules import align_modules
    from bisect_onnx.runtime.onnx_side import node_provenance

    capture, call_index = modules
    virtual = {name: CapturedValue(name, np.asarray(array), Provenance(position=0))
               for name, array in candidate_values.items()}
    for check in checks.values():
        for index in (check.segment.nodes if check.segment else ()):
            node = candidate.nodes[index]
            for output in node.outputs:
                if output in check.values and output not in virtual:
                    virtual[output] = CapturedValue(output, check.values[output],
                                                    node_provenance(node, 0))
    alignment = align_modules(capture, candidate.nodes, virtual, call_index=call_index)
    return {pair.candidate.name: pair.reference for pair in alignment.pairs}


def _inside_kernel(record: Record, check: LocalCheck, candidate: Any,
                   references: Mapping[str, CapturedValue], report: Report) -> Record | None:
    """The first value inside the culprit's segment that PyTorch has and that fails.

    The segment reaches back through values ONNX Runtime fused away (a Conv's output
    inside a FusedConv); PyTorch still has them, so the node that went wrong inside
    the kernel can be named, with its own op, module and source line.
    """
    from bisect_onnx.runtime.onnx_side import node_provenance

    if check.segment is None:
        return None
    for index in check.segment.nodes:
        node = candidate.nodes[index]
        for output in node.outputs:
            if output == check.value:
                return None
            reference, local = references.get(output), check.values.get(output)
            if (reference is None or local is None
                    or reference.array.shape != local.shape):
                continue
            comparison = compare_arrays(reference.array, local, rtol=report.rtol,
                                        atol=report.atol)
            if comparison.status != Status.PASS:
                value = CapturedValue(output, local, node_provenance(node, record.index))
                inner = make_record(record.index, Pair(reference, value), comparison)
                return replace(inner, introduced_here=True,
                               local_max_abs_error=comparison.max_abs_error,
                               local_status=comparison.status,
                               classification=record.classification)
    return None


def _excess(min_passing_atol: float | None, atol: float) -> float:
    if min_passing_atol is None:
        return math.inf
    return min_passing_atol / atol if atol > 0 else min_passing_atol


def _write_back(report: Report, attribution: Attribution, checks: Mapping[str, LocalCheck],
                kinds: Mapping[str, Any], *, everything: bool) -> None:
    """Local figures onto the checked records; the culprits and a summary onto the report."""
    # Several records may share one ONNX value (a module passing its input through):
    # each gets the value's local figures, and the first of them stands for the value.
    records = {}
    for record in report.comparisons:
        records.setdefault(record.onnx_value, record)

    def with_local(record: Record) -> Record:
        name = record.onnx_value
        result, check, kind = attribution.checked[name], checks.get(name), kinds.get(name)
        local = check.comparison if check else None
        return replace(
            record,
            introduced_here=None if result is None else result.fails,
            local_max_abs_error=local.max_abs_error if local else None,
            local_status=local.status if local else None,
            error_growth=_growth(record, check, records),
            classification=kind.kind if kind else None,
        )

    report.comparisons = [with_local(record) if record.onnx_value in attribution.checked
                          else record for record in report.comparisons]
    updated = {}
    for record in report.comparisons:
        if record.onnx_value in attribution.checked:
            updated.setdefault(record.onnx_value, record)
    if report.first_divergence is not None and report.first_divergence.onnx_value in updated:
        report.first_divergence = report.comparisons[report.first_divergence.index]
    culprits = [updated[name] for name in attribution.culprits]
    report.culprit = culprits[0] if culprits else None
    first = attribution.culprit
    report.attribution = {
        "first_culprit": first,
        "culprits": [record.onnx_value for record in culprits] if everything else None,
        "noise": attribution.noise,
        "drift": attribution.drift,
        "largest_jump": attribution.largest_jump,
        "checked": len(attribution.checked),
        "inputs": dict(checks[first].segment.inputs) if first and checks[first].segment
        else None,
        "nodes": checks[first].nodes if first else None,
        "classification": _describe(kinds.get(first)) if first else None,
        "unchecked": {name: checks[name].reason for name, result in attribution.checked.items()
                      if result is None and name in checks},
    }
    if everything:
        report.culprits = culprits


def _growth(record: Record, check: LocalCheck | None,
            records: Mapping[str, Record]) -> float | None:
    """How much the error grew from the node's inputs to its output (max abs, as a ratio)."""
    if check is None or check.segment is None or record.max_abs_error is None:
        return None
    upstream = [records[name].max_abs_error for name in check.segment.inputs
                if name in records and records[name].max_abs_error is not None]
    worst = max(upstream, default=0.0)
    return None if worst == 0 else record.max_abs_error / worst


def _describe(kind: Any) -> dict[str, Any] | None:
    return asdict(kind) if kind is not None else None
