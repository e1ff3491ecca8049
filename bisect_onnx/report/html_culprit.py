"""The HTML report's culprit section: the first divergence's ONNX node in its graph.

Its op, torch module and source line, whether the local check found the error
introduced there and which side the float64 reruns blame, then its attributes, inputs
and outputs with where each value came from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bisect_onnx.graph.provenance import SourceLocation
from bisect_onnx.judge.report_parts import Attribution, CulpritNode, NodeValue
from bisect_onnx.report.formatting import format_number, format_shape, format_source
from bisect_onnx.report.html_markup import (
    ROOT_MODULE,
    breakable,
    definitions,
    element,
    escaped,
    module_label,
    section,
    table,
)

if TYPE_CHECKING:  # types only: records import the report formats to show themselves
    from bisect_onnx.judge.records import Record, Report

__all__ = ["culprit_section", "source_facts"]

_VALUE_SOURCES = {
    "reference": "compared against PyTorch",
    "initializer": "a weight stored in the ONNX file",
    "graph_input": "an input of the model",
    "candidate": "computed by the candidate's runtime only",
}


def culprit_section(report: Report) -> str:
    """The first divergence's ONNX node in its graph, or why there is none to show."""
    culprit = report.culprit_node
    if culprit is None:
        return section("culprit", element("p", escaped(_no_culprit_reason(report)),
                                          class_="muted"), id_="culprit")
    parts = [
        definitions(_culprit_facts(culprit, report.culprit or report.first_divergence,
                                   report.attribution)),
        element("h3", "attributes"),
        _attributes_table(culprit.attributes),
        element("h3", "inputs"),
        _values_table(culprit.inputs),
        element("h3", "outputs"),
        _values_table(culprit.outputs),
    ]
    return section("culprit: " + str(culprit.node), "".join(parts), id_="culprit")


def _no_culprit_reason(report: Report) -> str:
    """Why the report has no culprit neighbourhood."""
    if not report.diverged:
        return "No divergence in the final outputs, so there is no culprit."
    return ("The first divergence has no ONNX node to show (a final output that no node "
            "produces, or a node missing from the graph).")


def _culprit_facts(culprit: CulpritNode, first: Record | None,
                   attribution: Attribution | None) -> list[tuple[str, str]]:
    """Node, op, torch side and source of the culprit, as label and HTML pairs."""
    op = f"{culprit.op_type} ({culprit.domain})"
    module = culprit.torch_module
    if first is not None and first.onnx_node == culprit.node:
        module = module_label(first)
    elif module == "":
        module = ROOT_MODULE
    return [
        ("ONNX node", element("code", breakable(culprit.node))),
        ("op type", escaped(op)),
        ("torch module", element("code", breakable(module or "-"))),
        ("torch op", element("code", escaped(culprit.torch_op or "-"))),
        *source_facts(_source(culprit, first)),
        ("introduced here", escaped(_introduced(first))),
        ("classification", escaped(_classification(first, attribution))),
    ]


def _source(culprit: CulpritNode, first: Record | None) -> SourceLocation | None:
    """The culprit's source line: the record's (it keeps the call site), else the node's."""
    if first is not None and first.onnx_node == culprit.node and first.source:
        return first.source
    source = culprit.source
    return SourceLocation(source.file, source.line) if source else None


def source_facts(source: SourceLocation | None) -> list[tuple[str, str]]:
    """The model's line and, where it is elsewhere, the user's call site, as HTML pairs.

    The call site differs for a model defined in an installed package (``transformers``).
    """
    facts = [("source", element("code", breakable(format_source(source)) if source else "-"))]
    if source is not None and source.call_site is not None:
        facts.append(("called from", element("code", breakable(format_source(
            source.call_site)))))
    return facts


def _introduced(first: Record | None) -> str:
    """Whether the divergence starts at this node, as the local check found."""
    introduced = first.local.introduced_here if first is not None else None
    if introduced is None:
        return "not checked"
    if introduced:
        return (f"yes: fed PyTorch's inputs, it is still off by "
                f"{format_number(first.local.max_abs_error)}")
    return "no: fed PyTorch's inputs it is within tolerance; the error reaches it from upstream"


def _classification(first: Record | None, attribution: Attribution | None) -> str:
    """Which side is wrong, from the float64 reruns."""
    attribution = attribution or Attribution()
    found = attribution.classification
    culprit_values = {attribution.first_culprit,
                      (attribution.inside_kernel or {}).get("value")}
    if first is None or not found or first.onnx_value not in culprit_values:
        return "-"
    return f"{found['kind']}: {found['detail']}; {found['file_with']}"


def _attributes_table(attributes: Mapping[str, Any]) -> str:
    """The node's attributes, one row each."""
    if not attributes:
        return element("p", "(none)", class_="muted")
    rows = [[element("code", escaped(name)), element("code", escaped(value))]
            for name, value in attributes.items()]
    return table(["name", "value"], rows, class_="plain")


def _values_table(values: Sequence[NodeValue]) -> str:
    """Inputs or outputs of the node: name, shape, dtype and where the value came from."""
    if not values:
        return element("p", "(none)", class_="muted")
    rows = []
    for value in values:
        shape = value.shape
        source = str(value.source)
        meaning = _VALUE_SOURCES.get(source)
        rows.append([
            element("code", escaped(value.name)),
            escaped(format_shape(shape) if shape is not None else "-"),
            escaped(value.dtype or "-"),
            escaped(f"{source}: {meaning}" if meaning else source),
        ])
    return table(["name", "shape", "dtype", "source"], rows, class_="plain")
