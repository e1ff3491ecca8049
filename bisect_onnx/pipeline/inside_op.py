"""Inside a module-level culprit made from one multi-node op, without tracing the model.

A file exported elsewhere is compared at module level first. Where the culprit's
segment is the nodes of one ATen op (``aten.linear``: MatMul then Add, and only the
Add carries a module's value), the exporter's translation of that op is evaluated on
PyTorch's values (:mod:`bisect_onnx.search.translation_eval`: the file's metadata
names the op and what it read) and compared node by node with what the file's nodes
computed from PyTorch's inputs. The node where they part is named, as op level does
after tracing the module call, at a fraction of the cost.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from bisect_onnx.align.op_level import named_node
from bisect_onnx.graph.provenance import fx_node_text
from bisect_onnx.judge.findings import Refinement
from bisect_onnx.judge.reading import Reading
from bisect_onnx.judge.tolerances import Judge
from bisect_onnx.pipeline.call_ops import checked_segment
from bisect_onnx.search.decomposition import compare_segment, fresh_values_by_file_names
from bisect_onnx.search.translation_eval import (
    CannotEvaluate,
    evaluate_translation,
    parse_op_call,
)

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

    from bisect_onnx.runtime.runner import Runner

__all__ = ["look_inside_module_culprit", "inside_op_values", "name_the_ops"]

logger = logging.getLogger(__name__)

_WEIGHT_PREFIXES = {"p_": "named_parameters", "b_": "named_buffers"}


class _Op(NamedTuple):
    """The op, as :func:`~bisect_onnx.search.decomposition.compare_segment` names it."""

    name: str
    target: str


def look_inside_module_culprit(report: Reading, candidate: Runner,
                               model: torch.nn.Module | ExportedProgram,
                               references: Mapping[str, np.ndarray],
                               candidate_values: Mapping[str, np.ndarray], *,
                               tolerance: Judge) -> Refinement | None:
    """The node inside ``report``'s culprit's op that goes wrong first, if it can be told.

    ``references``: PyTorch's values by ONNX name; ``candidate_values``: what the
    file's nodes computed (from PyTorch's inputs, for the culprit's segment). ``None``
    where nothing can be said (the caller may trace the module call instead).
    """
    record = report.culprit
    if record is None or report.inside_op is not None:
        return None
    translated = _translated(report, candidate, model, references)
    if translated is None:
        return None
    compute, protos, op, fresh = translated
    fx_name = op.name
    finding = compare_segment(op, protos, fresh.nodes, fresh.values,
                              references, candidate_values,
                              rtol=tolerance.of(record).rtol, atol=tolerance.of(record).atol)
    logger.info("inside %s: %s", fx_name, finding.how)
    if finding.node is None:
        return None
    inside = {"fx_node": fx_name, "nodes": [node.name for node in compute],
              "node": finding.node, "value": finding.value, "how": finding.how,
              "compared": finding.compared}
    found = next((node for node in compute if finding.value in node.outputs), None)
    return Refinement(inside_op=inside, node=named_node(found))


def inside_op_values(report: Reading, candidate: Runner,
                     model: torch.nn.Module | ExportedProgram,
                     references: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What the look inside the culprit's op computes in PyTorch, by the file's value names.

    The exporter's translation of the op evaluated on PyTorch's values, each value
    paired with the file's node that computes the same (by structure): a recording
    keeps them, so that a check where PyTorch is not compares inside the op too. Empty
    where the look inside cannot be made.
    """
    if report.culprit is None:
        return {}
    translated = _translated(report, candidate, model, references)
    if translated is None:
        return {}
    _, protos, _, fresh = translated
    return fresh_values_by_file_names(protos, fresh)


def _translated(report: Reading, candidate: Runner, model: torch.nn.Module | ExportedProgram,
                references: Mapping[str, np.ndarray]):
    """The culprit's op (its nodes, their protos, the op) and its translation evaluated.

    ``None`` where the culprit's segment is not the nodes of one multi-node op, or its
    translation cannot be evaluated on PyTorch's values.
    """
    compute = [node for node in checked_segment(report, candidate.nodes)
               if node is None or node.op_type != "Constant"]
    if len(compute) < 2 or None in compute:
        return None
    made_from = {node.torch.fx_node if node.torch else None for node in compute}
    if len(made_from) != 1 or None in made_from:
        return None  # several ops (or unknown ones): only their module call, traced, tells
    fx_name = made_from.pop()
    protos = [candidate.model.graph.node[node.index] for node in compute]
    try:
        call = parse_op_call(fx_node_text(protos[-1]))
        arrays = {name: _value_of(name, model, references) for name in call.references()}
        fresh = evaluate_translation(call, arrays)
    except CannotEvaluate as error:
        logger.info("cannot look inside %s without a trace: %s", fx_name, error)
        return None
    return compute, protos, _Op(fx_name, call.target), fresh


def name_the_ops(report: Reading, candidate: Runner) -> dict[str, str]:
    """The op of the culprit's and the first divergence's value, where it is its output.

    A module-level value the file names after the FX node that computes it (``linear_4``,
    a Linear's output) is that op's value too: the verdict names the op, as op level does.
    Returns ONNX value -> FX node.
    """
    named = {}
    for record in (report.culprit, report.first_divergence):
        if record is None or record.fx_node is not None or record.onnx_node is None:
            continue  # already an op's, or a PyTorch computation with no ONNX node
        node = candidate.view.producer_of(record.onnx_value)
        if node is not None and node.torch and node.torch.fx_node == record.onnx_value:
            named[record.onnx_value] = record.onnx_value
    return named


def _value_of(name: str, model: torch.nn.Module | ExportedProgram,
              references: Mapping[str, np.ndarray]) -> np.ndarray:
    """PyTorch's value of what the op read: a weight by its FX placeholder, else by ONNX name."""
    if name in references:
        return np.asarray(references[name])
    for prefix, listing in _WEIGHT_PREFIXES.items():
        if name.startswith(prefix):
            # torch.export names a weight's placeholder after its path, dots as underscores.
            matches = [tensor for path, tensor in getattr(model, listing)()
                       if re.sub(r"\W", "_", path) == name[len(prefix):]]
            if len(matches) == 1:
                return matches[0].detach().numpy()
    raise CannotEvaluate(f"no PyTorch value of {name}")
