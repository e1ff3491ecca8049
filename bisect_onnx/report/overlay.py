"""Per-node error for Google's Model Explorer ("node data" JSON, loaded beside the ONNX file).

The format is Model Explorer's ``ModelNodeData``: graph id -> ``{"results": {key:
{"value": ...}}, "thresholds": [...]}``. Model Explorer matches a key against a node's
id, or against a ``tensor_name`` in its outputs' metadata; its ONNX adapter
(``model-explorer-onnx``) writes no ``tensor_name`` and makes each ONNX node's name its
id, so the data is keyed by ONNX node name (output names would colour nothing), and
each graph output by the id of the adapter's output node, ``[value] NAME``. A node the
file leaves unnamed is keyed as the adapter names it (``node``, ``node_1``... in order,
onnx_ir's ``NameFixPass``); where the file can still be read, a key is kept only if it
is a node the adapter draws for it. Each node gets the smallest atol that would
let its worst compared output pass (with the report's rtol), so the colour says at a
glance how far each node is from passing; the first divergence has a colour of its own.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bisect_onnx.errors import InputError
from bisect_onnx.runtime.sides import JsonObject
from bisect_onnx.sources.output_paths import check_report_path

if TYPE_CHECKING:  # types only: records import the report formats to show themselves
    from bisect_onnx.judge.records import Record, Report

__all__ = ["model_explorer_data", "write_model_explorer", "OUTPUT_NODE_PREFIX"]

#: How the ONNX adapter names the node it draws for a graph input or output.
OUTPUT_NODE_PREFIX = "[value] "
# Stand-in for "no atol can pass" (NaN/Inf in different places, shape mismatch):
# JSON has no infinity, and any finite threshold must sit below it.
_NEVER_PASSES = 1e30
#: What the adapter (onnx_ir's NameFixPass) names an unnamed node, then ``node_1``...
_UNNAMED_NODE = "node"
_PASS, _NEAR, _FAIL, _CULPRIT = "#c8e6c9", "#fff59d", "#ef9a9a", "#d32f2f"


def model_explorer_data(report: Report) -> JsonObject:
    """The node-data structure for the report's candidate graph, keyed as the adapter names."""
    results: dict[str, dict[str, Any]] = {}
    culprit = report.first_divergence
    drawn = _drawn_ids(report.candidate.get("model"))
    for record in [*report.comparisons, *report.final_outputs]:
        entry = _entry(record, culprit)
        for key in _keys(record, final=record in report.final_outputs, drawn=drawn):
            kept = results.get(key)
            if kept is None or _worse(entry, kept):  # a node's worst output decides
                results[key] = entry
    atol = report.atol
    thresholds = [
        {"value": atol, "bgColor": _PASS},            # passes as the report was run
        {"value": max(10 * atol, 1e-12), "bgColor": _NEAR},  # within 10x of passing
        {"value": _NEVER_PASSES, "bgColor": _FAIL},
    ]
    # The adapter's graph id is the graph's name, as it is (empty too).
    graph = report.candidate.get("graph") or ""
    return {graph: {"results": results, "thresholds": thresholds}}


def _entry(record: Record, culprit: Record | None) -> JsonObject:
    """One record's value and, for the first divergence, its colour."""
    needed = record.figures.min_passing_atol
    value = _NEVER_PASSES if needed is None or not math.isfinite(needed) else needed
    entry: dict[str, Any] = {"value": value}
    if culprit is not None and record.onnx_value == culprit.onnx_value:
        entry.update(bgColor=_CULPRIT, textColor="#ffffff")
    return entry


def _keys(record: Record, *, final: bool, drawn: dict[str, str] | None) -> list[str]:
    """The adapter's ids of the nodes a record colours: its ONNX node; a graph output's too.

    ``drawn``: the report's node names (and output node ids) -> the ids the adapter
    draws; ``None`` when the model file is gone, and names are taken as they are.
    """
    keys = [record.onnx_node] if record.onnx_node else []
    if final:
        keys.append(OUTPUT_NODE_PREFIX + record.onnx_value)
    if drawn is None:
        return keys
    return [drawn[key] for key in keys if key in drawn]


def _drawn_ids(model: str | None) -> dict[str, str] | None:
    """The candidate file's nodes as the report names them -> as the adapter draws them.

    The report names an unnamed node ``OP_INDEX``; the adapter names each in turn
    ``node``, ``node_1``..., and a repeated name ``NAME_1``, ... A node with a subgraph
    makes it name the subgraph's nodes in the same count: such a graph's unnamed nodes
    are left out rather than keyed wrongly.
    """
    if not model or not Path(model).is_file():
        return None
    from bisect_onnx.runtime.onnx_files import load_onnx_model

    graph = load_onnx_model(Path(model)).graph  # the graph only, not external weights
    subgraphs = any(attribute.type in (attribute.GRAPH, attribute.GRAPHS)
                    for node in graph.node for attribute in node.attribute)
    drawn: dict[str, str] = {}
    used: set[str] = set()
    counts: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        preferred = node.name or _UNNAMED_NODE
        drawn_as = preferred
        while drawn_as in used:
            counts[preferred] = counts.get(preferred, 0) + 1
            drawn_as = f"{preferred}_{counts[preferred]}"
        used.add(drawn_as)
        if node.name or not subgraphs:
            drawn.setdefault(node.name or f"{node.op_type}_{index}", drawn_as)
    drawn.update({OUTPUT_NODE_PREFIX + value.name: OUTPUT_NODE_PREFIX + value.name
                  for value in graph.output})
    return drawn


def _worse(entry: dict[str, Any], kept: dict[str, Any]) -> bool:
    """Whether ``entry`` should colour the node instead of ``kept``: the culprit, or worse."""
    if "bgColor" in kept:
        return False
    return "bgColor" in entry or entry["value"] > kept["value"]


def write_model_explorer(report: Report, path: Path) -> None:
    """Write the node data to ``path``, a file the user named."""
    check_report_path(report, path, "--model-explorer")
    try:
        Path(path).write_text(json.dumps(model_explorer_data(report), indent=2) + "\n",
                              encoding="utf-8")
    except OSError as error:
        raise InputError(f"cannot write the Model Explorer data to {path}: {error.strerror}; "
                         "choose a writable path for --model-explorer") from error
