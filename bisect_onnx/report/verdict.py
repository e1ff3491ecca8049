"""The one-line verdict: the culprit first, then the first failing value and the search."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bisect_onnx.graph.provenance import short_op
from bisect_onnx.judge.report_parts import Attribution, CulpritSegment
from bisect_onnx.judge.vocabulary import Granularity
from bisect_onnx.report.advice import advice, another_model, baked_cause
from bisect_onnx.report.formatting import (
    format_number,
    format_rounded_up,
    format_shape,
    format_source,
)
from bisect_onnx.search.within_tolerance import said_entry

if TYPE_CHECKING:  # types only: records import this module to format themselves
    from bisect_onnx.judge.records import Coverage, Record, Report

__all__ = ["verdict_line", "describe_origin", "fed_description", "ops_scope"]


def verdict_line(report: Report) -> str:
    """``PARITY: ...`` or ``DIVERGED: first divergence at ...`` in one line."""
    coverage = report.coverage
    compared = f"{coverage.aligned_modules} of {coverage.torch_modules} module calls compared"
    if coverage.granularity == "op":
        compared = (f"{coverage.compared_ops} of {coverage.torch_ops} torch ops"
                    f"{ops_scope(coverage)} compared")
        if coverage.op_scope:
            compared += f", {coverage.aligned_modules} of {coverage.torch_modules} module calls"
    if coverage.granularity == "value":
        compared = f"{coverage.aligned_values} of {coverage.onnx_values} reference values compared"
    tolerance = f"rtol={report.rtol:g}, atol={report.atol:g}"
    if report.tolerance_basis:
        tolerance += f", {report.tolerance_basis}"
    if not report.diverged:
        if report.search.mode == "final outputs only":
            return (f"PARITY OF FINAL OUTPUTS ONLY ({tolerance}): {report.search.reason}; "
                    "with the outputs agreeing, no value was probed")
        if coverage.aligned_modules == 0 and coverage.compared_ops == 0 and (
                coverage.aligned_values == 0 or coverage.granularity != "value"):
            return (
                f"PARITY OF FINAL OUTPUTS ONLY ({tolerance}): no intermediate value could be "
                f"aligned (0 of {coverage.torch_modules} module calls), so nothing inside the "
                "model was checked"
            )
        hidden = len(report.hidden_divergences)
        extra = f"; {hidden} hidden intermediate divergence(s)" if hidden else ""
        if report.rounding_buildup:
            extra = (f"; {len(report.rounding_buildup)} intermediate value(s) out of tolerance "
                     "by float rounding that builds up: rerun on PyTorch's inputs, no node "
                     "is off beyond rounding")
        if hidden and report.culprit is not None:
            culprit = report.culprit
            extra += (f", introduced at ONNX node {culprit.onnx_node!r} ({culprit.onnx_op}) <- "
                      f"{describe_origin(culprit)}")
        if report.sweep is not None:
            extra += f"; {report.sweep.passing_text()}"
        return (
            f"PARITY: {len(report.final_outputs)} final output(s) within {tolerance} "
            f"({compared}{extra})"
        )
    return _diverged_line(report, f"({tolerance}; {compared})")


def _diverged_line(report: Report, basis: str) -> str:
    """A headline naming the culprit and what to do; then the evidence, a line each.

    The headline names the culprit (node, op, module, source line) and whom to file it
    with, or the segment the error is introduced in, or the first divergence; the local
    figures, the first failing value, the search and the tolerance follow.
    """
    record = report.first_divergence
    assert record is not None
    culprit, segment = report.culprit, report.culprit_segment
    if culprit is not None:
        lines = _culprit_lines(report, culprit, record)
    elif segment is not None:
        lines = [f"DIVERGED: {_segment_headline(segment)}",
                 f"fed {fed_description(report)} the segment is off by "
                 f"{_segment_error(segment)} on its own, and no node inside it could be shown "
                 "to introduce the error alone",
                 f"first failing value: {_where(report, record)} <- {describe_origin(record)}: "
                 f"{_describe_error(record)}"]
    else:
        lines = [f"DIVERGED: first divergence at {_where(report, record)} <- "
                 f"{describe_origin(record)}: {_describe_error(record)}"]
    baked = baked_cause(report) if culprit is None else None
    if baked:  # no node named, but the shapes the export baked in are the cause (checked)
        lines[0] += f"; {baked}"
    inside = _inside_op(report, culprit or record)
    if inside:
        lines.append(inside)
    layer = _executed_layer(report, culprit or record)
    if layer:
        lines.insert(1, layer)
    inner = _first_failing_op(report, record)
    if inner is not None:
        inner_source = f" at {format_source(inner.source)}" if inner.source else ""
        lines.append(f"first failing op inside: {_short_op(inner.torch_op)} ({inner.fx_node}) "
                     f"in {_module_name(inner.torch_module)}, ONNX node {inner.onnx_node!r} "
                     f"({inner.onnx_op}){inner_source}")
    if report.nan_origin is not None:
        nan = report.nan_origin
        lines.append(f"NaN/Inf first appears on one side only at {_where(report, nan)} <- "
                     f"{describe_origin(nan)} ({nan.figures.nan_mismatch} elements)")
    if culprit is None and segment is None and report.attribution is not None:
        lines.append(_no_culprit(report))
    if report.note:
        lines.append(report.note)
    search = _search_line(report)
    if search:
        lines.append(search)
    lines.append(f"tolerance: {basis.strip('()')}")
    another = another_model(report)
    if another is not None:  # said before any culprit: the file is the cause
        lines = [f"DIVERGED: {another}",
                 f"in the file: {lines[0].removeprefix('DIVERGED: ')}", *lines[1:]]
    return "\n  ".join(lines)


def _runtime(report: Report) -> str:
    """The candidate's runtime, by name."""
    from bisect_onnx.runtime.registry import display_name

    return display_name((report.environment or {}).get("runtime"))


def _executed_layer(report: Report, record: Record) -> str | None:
    """Where production ran the node: OpenVINO's executed layer, ONNX Runtime's kernel."""
    node = report.culprit_node
    if node is None or node.node != record.onnx_node:
        return None
    ran = node.ran_in or {}
    if ran.get("runtime") == "onnxruntime" and ran.get("kernel"):
        kernel = ran["kernel"]
        kind = ", ".join(part for part in (kernel["op_type"], kernel["precision"]) if part)
        how = (f"computed inside ONNX Runtime's kernel {kernel['name']!r} ({kind}), which "
               f"outputs {kernel['output']!r}," if kernel["fused"] else
               f"ran as ONNX Runtime's kernel {kernel['name']!r} ({kind})"
               if kernel["op_type"] == record.onnx_op else
               f"its value is output by ONNX Runtime's kernel {kernel['name']!r} ({kind})")
        return f"{how} on {ran['provider']}"
    layer = ran.get("layer")
    if not layer:
        return None
    others = [name for name in layer["nodes"] if name != record.onnx_node]
    fused = f", fused with {', '.join(others[:4])}{', …' if len(others) > 4 else ''}" if (
        others) else ""
    return (f"ran in {_runtime(report)}'s executed layer {layer['name']!r} ({layer['type']}, "
            f"runtime "
            f"precision {layer['runtime_precision']}, inference precision "
            f"{ran['inference_precision']}{fused})")


def _culprit_lines(report: Report, culprit: Record, record: Record) -> list[str]:
    """The headline naming the culprit, its evidence, and the first failing value."""
    attribution = report.attribution
    nodeless = attribution.nodeless if attribution is not None else None
    unpaired = attribution.unpaired if attribution is not None else None
    if nodeless:
        lines = [f"DIVERGED: culprit {describe_origin(culprit)}, which has no ONNX node: "
                 f"{advice(report)}",
                 f"it changes the value in PyTorch while ONNX hands its input on: ONNX value "
                 f"{culprit.onnx_value!r} equals PyTorch's {nodeless['before']!r} and is off "
                 f"by {format_number(culprit.figures.max_abs_error)} from PyTorch's output of it"]
        if culprit.onnx_value != record.onnx_value:
            lines.append(f"first failing value: {_where(report, record)} <- "
                         f"{describe_origin(record)}: {_describe_error(record)}")
    elif unpaired:
        reads = unpaired["reads"]
        fed = (f"the reference's value of {reads!r}"
               if unpaired.get("fed", "reference") == "reference" else
               f"{reads!r} as the segment computed it from the reference's values")
        lines = [f"DIVERGED: culprit ONNX node {culprit.onnx_node!r} ({culprit.onnx_op}), which "
                 f"has no counterpart in the reference (it reads value {reads!r}): "
                 f"{advice(report)}",
                 f"taken through (its output fed {fed}), the "
                 f"values after it agree; it changes that value by "
                 f"{format_number(culprit.figures.max_abs_error)}",
                 f"first failing value: {_where(report, record)} <- "
                 f"{describe_origin(record)}: {_describe_error(record)}"]
    else:
        lines = [f"DIVERGED: culprit ONNX node {culprit.onnx_node!r} ({culprit.onnx_op}) <- "
                 f"{describe_origin(culprit)}: {advice(report)}",
                 *_culprit_evidence(report, culprit)]
        if culprit.onnx_value == record.onnx_value:
            lines.append(f"its value {record.onnx_value!r}: {_describe_error(record)}")
        else:
            lines.append(f"its value {culprit.onnx_value!r}; first failing value: "
                         f"{_where(report, record)} <- "
                         f"{describe_origin(record)}: {_describe_error(record)}; "
                         f"{_carries_only(report, record)}")
    return lines


def _culprit_evidence(report: Report, culprit: Record) -> list[str]:
    """The culprit's own figures: what its node computed alone, and the classification."""
    attribution = report.attribution or Attribution()
    kind = attribution.classification or {}
    kernel = attribution.inside_kernel or {}
    lines = []
    if kernel and kernel.get("kernel_output") != culprit.onnx_value:
        lines.append(f"inside the kernel {_runtime(report)} fused up to value "
                     f"{kernel['kernel_output']!r}")
    alone = format_number(culprit.local.max_abs_error)
    if culprit.local.nan_mismatch:
        alone = (f"{alone} and holds NaN/Inf in {culprit.local.nan_mismatch} other places"
                 if culprit.local.max_abs_error else
                 f"NaN/Inf in {culprit.local.nan_mismatch} other places")
    classified = f" ({kind['kind']})" if kind else ""
    lines.append(f"introduces the error: fed {fed_description(report)} it is off by {alone} on "
                 f"its own{classified}")
    narrowed = attribution.narrowed or {}
    if narrowed.get("node") == culprit.onnx_node:
        together = narrowed.get("run_with") or {}
        others = ", ".join(
            f"{name!r}{_run_with(together.get(name))} off by {format_number(error)}"
            for name, error in narrowed["alone"].items() if name != culprit.onnx_node)
        lines.append(f"narrowed from a segment of {len(narrowed['segment'])} nodes, each run "
                     f"alone on the reference's values: "
                     f"{others or 'no other node could run alone'}")
    return lines


def _run_with(nodes: list[str] | None) -> str:
    """How a node was run with the nodes that make an input the reference has no value of."""
    return f" (with {', '.join(map(repr, nodes))})" if nodes else ""


def _segment_headline(segment: CulpritSegment) -> str:
    """``introduced between value A and value B, in these N nodes: ...``."""
    entering = segment.from_values
    start = (f"value {entering[0]!r}" if len(entering) == 1 else
             f"values {', '.join(repr(name) for name in entering[:3])}"
             f"{', …' if len(entering) > 3 else ''}" if entering else "the graph's inputs")
    nodes = segment.nodes
    listed = ", ".join(nodes[:6]) + (", …" if len(nodes) > 6 else "")
    return (f"introduced between {start} and value {segment.to!r}, in these "
            f"{len(nodes)} nodes: {listed}")


def _segment_error(segment: CulpritSegment) -> str:
    error = format_number(segment.local_max_abs_error)
    nan = segment.local_nan_mismatch
    return f"{error} (NaN/Inf in {nan} other places)" if nan else error


def _search_line(report: Report) -> str | None:
    """How the first divergence was found, for the verdict; ``None`` for a full capture."""
    search = report.search
    if search.mode != "bisection":
        return None
    probes = len(search.probes)
    first, last = search.first_failing, search.last_passing
    if first and last:
        found = f"first failing value {first!r}, after {last!r}, which passes"
    elif first:
        found = f"first failing value {first!r}, the first checkpoint compared"
    elif last:
        found = (f"every checkpoint compared passes, the last {last!r}: only the final "
                 "outputs fail")
    else:
        found = "no checkpoint could be compared"
    return (f"Found by bisection ({probes} probe(s) of the production graph over "
            f"{search.checkpoints} checkpoints: {found}) because {search.reason}")


def _where(report: Report, record: Record) -> str:
    return f"ONNX node {record.onnx_node!r} ({record.onnx_op}), value {record.onnx_value!r}"


def _inside_op(report: Report, record: Record) -> str | None:
    """Where a record was narrowed to a node inside its op: how that node was found."""
    inside = report.inside_op
    if inside is None or inside.node != record.onnx_node:
        return None
    return (f"ONNX node {record.onnx_node!r} is the first of the {len(inside.nodes)} nodes "
            f"of its op to disagree with the op exported alone (value {inside.value!r}; "
            f"the op's output {record.onnx_value!r})")


def describe_origin(record: Record) -> str:
    """Where a record's value comes from: op, module and source line, or reference node."""
    source = f" at {format_source(record.source)}" if record.source else ""
    if record.match.reference_node is not None:  # ONNX against ONNX
        module = f" in torch module {record.torch_module}" if record.torch_module else ""
        op = f" [{record.torch_op}]" if record.torch_op else ""
        return f"reference node {record.match.reference_node!r}{module}{op}{source}"
    if record.fx_node is not None:
        return (f"{_short_op(record.torch_op)} ({record.fx_node}) in "
                f"{_module_name(record.torch_module)}{source}")
    # An empty module is the model's own forward (a root row, a recorded reference value
    # whose node no module scope names): never "torch module " with nothing after it.
    origin = ("a final output" if record.torch_module is None
              else f"torch module {record.torch_module}" if record.torch_module
              else "the model's own forward")
    return origin + (f" [{record.torch_op}]" if record.torch_op else "") + source


def ops_scope(coverage: Coverage) -> str:
    """`` of layer3.4 (...)`` where only one module call's ops were traced, else nothing."""
    return (f" of {coverage.op_scope} (the call traced alone; other rows are module calls)"
            if coverage.op_scope else "")


def fed_description(report: Report) -> str:
    """What a node is fed when checked on its own: PyTorch's values, or the reference's."""
    if report.coverage.granularity == Granularity.VALUE:
        return "the reference model's values"
    return "PyTorch's inputs"


def _carries_only(report: Report, first: Record) -> str:
    """Why the first failing value is not the culprit."""
    attribution = report.attribution or Attribution()
    if (attribution.inside_kernel or {}).get("kernel_output") == first.onnx_value:
        return f"it is the output of the kernel {_runtime(report)} fused the culprit into"
    how = ("fails by float rounding only" if first.onnx_value in attribution.noise
           else "is within tolerance" if first.local.introduced_here is False
           else "was not checked")
    return f"it only carries the error (fed {fed_description(report)} it {how})"


def _optimized(report: Report) -> bool:
    """Whether the candidate ran with ONNX Runtime's graph optimizations on."""
    candidate = report.candidate or {}
    return candidate.get("opt_level") not in (None, "disabled")


def _no_culprit(report: Report) -> str:
    """Why no node is named as the culprit."""
    attribution = report.attribution or Attribution()
    if (entry := _entry(report, attribution)) is not None:
        return entry
    if attribution.drift:
        jump = attribution.largest_jump
        rounding = " (all of it float rounding)" if attribution.noise else ""
        if report.search.mode == "bisection" and _optimized(report):
            # The capture session, whose kernels run the nodes apart, did not compute
            # production's outputs: the checks alone cannot show a gradual build-up.
            return (f"No node run alone introduces the error beyond float rounding{rounding} "
                    f"({attribution.checked} failing values rerun on the reference's "
                    "values); production's fused kernels compute them otherwise (the capture "
                    "session did not reproduce its outputs): an optimization may be the cause "
                    "(a run with the candidate's optimizations off shows it; --suggest-fix finds "
                    "the optimizer)")
        # Only the failing values' own nodes were checked: an error that passes within
        # tolerance where a node introduces it (then grows) is not ruled out.
        return (f"No failing value's own nodes introduce the error beyond float rounding"
                f"{rounding}: it builds up gradually over {attribution.checked} failing "
                f"values, or comes in through values that pass within tolerance (a tighter "
                f"--atol/--rtol shows where it starts); the largest local jump is at value "
                f"{jump!r}")
    return "No single node could be shown to introduce the error"


def _entry(report: Report, attribution: Attribution) -> str | None:
    """With drift: the node the error comes in at, within tolerance, where one shows it."""
    entry = attribution.within_tolerance
    if not attribution.drift or not entry:
        return None
    record = next((row for row in report.comparisons if row.onnx_value == entry["value"]), None)
    return said_entry(entry, describe_origin(record) if record else None, fed_description(report))


def _first_failing_op(report: Report, record: Record) -> Record | None:
    """At module granularity: the op record a module row's first failure points to."""
    if record.match.first_failing_op is None:
        return None
    return next((op for op in report.op_comparisons if op.fx_node == record.match.first_failing_op),
                None)


def _short_op(op: str | None) -> str:
    return short_op(op) if op else "an op"


def _module_name(module: str | None) -> str:
    return f"module {module}" if module else "the model's own forward"


def _describe_error(record: Record) -> str:
    if record.figures.status == "shape_mismatch":
        return (f"shape {format_shape(record.shape)} in torch, "
                f"{format_shape(record.candidate_shape)} in ONNX")
    if record.figures.status == "dtype_mismatch":
        return f"dtype {record.dtype} in torch, {record.candidate_dtype} in ONNX"
    parts = [f"max abs {format_number(record.figures.max_abs_error)}",
             f"max rel {format_number(record.figures.max_rel_error)}"]
    if record.figures.mismatch_fraction is not None:
        parts.append(f"{record.figures.mismatch_fraction:.1%} of elements out of tolerance")
    if record.figures.nan_mismatch:
        parts.append(f"{record.figures.nan_mismatch} NaN/Inf in different places")
    elif record.figures.min_passing_atol is not None:
        parts.append(f"atol >= {format_rounded_up(record.figures.min_passing_atol)} would pass")
    return ", ".join(parts)
