"""The driver of culprit attribution: local checks, classification, the report's fields.

:mod:`bisect_onnx.attribution` decides from local results; this module produces them
(:mod:`bisect_onnx.local` runs the failing values' nodes on PyTorch's inputs,
:mod:`bisect_onnx.classify` reruns a locally failing node in float64 on both sides)
and writes what was found into the report: ``introduced_here`` and the local figures
on each checked record, ``report.first_culprit`` and ``report.attribution``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from bisect_onnx.attribution import Attribution, CulpritSearch, LocalResult
from bisect_onnx.classify import Kind
from bisect_onnx.compare import Status
from bisect_onnx.local import LocalCheck, run_locally
from bisect_onnx.records import Record, Report

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
    torch_values: Mapping[str, np.ndarray] | None = None,
    everything: bool = False,
) -> None:
    """Find which failing values were introduced where they fail, and classify them.

    ``reference_values`` are PyTorch's values by ONNX value name; ``program`` and
    ``torch_values`` (by FX node name) let an op be rerun in float64 at op level.
    """
    failing = [record for record in report.comparisons if record.failed]
    if not failing:
        return
    by_value = {record.onnx_value: record for record in failing}
    checks: dict[str, LocalCheck] = {}
    kinds: dict[str, Any] = {}

    def check(names: Sequence[str]) -> dict[str, LocalResult | None]:
        checks.update(run_locally(
            candidate.model, candidate.path.resolve().parent, names,
            reference_values=reference_values, candidate_values=candidate_values,
            graph_inputs=graph_inputs, rtol=report.rtol, atol=report.atol,
            provider=candidate.provider, opt_level=candidate.opt_level))
        results = {}
        for name in names:
            local = checks[name].comparison
            if local is None:
                results[name] = None
                continue
            fails = local.status != Status.PASS
            if fails:
                kinds[name] = _classify(checks[name], by_value[name], candidate, reference_values,
                                        program, torch_values or {}, report)
            results[name] = LocalResult(
                fails=fails, excess=_excess(local.min_passing_atol, report.atol),
                noise=fails and kinds[name].kind == Kind.FLOAT_PRECISION)
        return results

    attribution = CulpritSearch([record.onnx_value for record in failing], check).run(
        everything=everything)
    _write_back(report, attribution, checks, kinds, everything=everything)


def _classify(check: LocalCheck, record: Record, candidate: Any,
              reference_values: Mapping[str, np.ndarray], program: Any,
              torch_values: Mapping[str, np.ndarray], report: Report) -> Any:
    """Which side is wrong: the culprit rerun in float64 on both sides."""
    from bisect_onnx.classify import classify, onnx_segment_in_float64, torch_op_in_float64
    from bisect_onnx.report.repro import _embed_external_data, segment_model

    torch64 = None
    if program is not None and record.fx_node is not None:
        fx_node = next((node for node in program.graph.nodes if node.name == record.fx_node),
                       None)
        if fx_node is not None:
            torch64 = torch_op_in_float64(fx_node, program, torch_values)
    onnx64 = None
    if check.segment is not None and check.local is not None:
        model = segment_model(candidate.model, check.segment, check.feeds, check.value,
                              check.local)
        for tensor in model.graph.initializer:
            _embed_external_data(tensor, candidate.path.resolve().parent)
        onnx64 = onnx_segment_in_float64(model, check.feeds, check.value)
    return classify(torch64=torch64, onnx64=onnx64,
                    torch32=np.asarray(reference_values[check.value]),
                    ort32=np.asarray(check.local), rtol=report.rtol, atol=report.atol)


def _excess(min_passing_atol: float | None, atol: float) -> float:
    if min_passing_atol is None:
        return math.inf
    return min_passing_atol / atol if atol > 0 else min_passing_atol


def _write_back(report: Report, attribution: Attribution, checks: Mapping[str, LocalCheck],
                kinds: Mapping[str, Any], *, everything: bool) -> None:
    """Local figures onto the checked records; the culprits and a summary onto the report."""
    records = {record.onnx_value: record for record in report.comparisons}
    updated = {}
    for name, result in attribution.checked.items():
        record, check = records[name], checks.get(name)
        local = check.comparison if check else None
        kind = kinds.get(name)
        updated[name] = replace(
            record,
            introduced_here=None if result is None else result.fails,
            local_max_abs_error=local.max_abs_error if local else None,
            local_status=local.status if local else None,
            error_growth=_growth(record, check, records),
            classification=kind.kind if kind else None,
        )
    report.comparisons = [updated.get(record.onnx_value, record)
                          for record in report.comparisons]
    if report.first_divergence is not None and report.first_divergence.onnx_value in updated:
        report.first_divergence = updated[report.first_divergence.onnx_value]
    culprits = [updated[name] for name in attribution.culprits]
    report.first_culprit = culprits[0] if culprits else None
    first = attribution.first_culprit
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
    if kind is None:
        return None
    return {"kind": kind.kind, "detail": kind.detail, "file_with": kind.file_with,
            "torch_vs_onnx64": kind.torch_vs_onnx64, "ort_error": kind.ort_error,
            "torch_error": kind.torch_error}
