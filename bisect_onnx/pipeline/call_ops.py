"""Op level for one module call: a divergence in a file exported elsewhere, traced cheaply.

A dynamo file given with ``--onnx`` names its values after the FX nodes of a program
that is not at hand; tracing the whole model again for it takes seconds. Once the
module-level comparison and attribution have found the culprit (or the first
divergence), only the innermost module call that holds its nodes and what feeds them
is traced (:mod:`bisect_onnx.pytorch.call_program`), and its ops are compared at op
level while the rest of the model stays at module level. Where the call's ops cannot
be named exactly as the file names them, the whole model is traced as before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.align.modules import Pair, nodes_of_calls
from bisect_onnx.errors import BisectOnnxError
from bisect_onnx.events import CAPTURE_STARTED, emit
from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.graph.provenance import Provenance, fx_node_text, in_installed_package
from bisect_onnx.graph.view import GraphView
from bisect_onnx.judge.reading import Reading
from bisect_onnx.pipeline.torch_comparison import OpScope
from bisect_onnx.pytorch.call_names import MadeFrom, made_from, split_name
from bisect_onnx.pytorch.call_program import (
    CallOpCapture,
    InputsUnnamed,
    record_call,
    trace_call,
)
from bisect_onnx.pytorch.calls import call_name, split_call_name
from bisect_onnx.pytorch.reference import MODULE, TorchReference
from bisect_onnx.runtime.sides import Capture, CapturedValue
from bisect_onnx.search.classify import Kind

if TYPE_CHECKING:
    import onnx

    from bisect_onnx.pipeline.prepare import PreparedCandidate
    from bisect_onnx.pipeline.torch_settings import Settings
    from bisect_onnx.pytorch.op_values import OpCapture

__all__ = ["traces_one_call", "exact_at_module_level", "checked_segment", "culprit_call_ops",
           "alignment_inputs", "op_scope"]

logger = logging.getLogger(__name__)

def traces_one_call(settings: Settings) -> bool:
    """Whether a divergence may trace only the culprit's module call.

    At default granularity, for a dynamo file exported elsewhere from this ``nn.Module``,
    looking for the first culprit (``all_culprits`` wants every culprit's ops).
    """
    prepared = settings.prepared
    return (settings.granularity is None and not settings.all_culprits
            and prepared.wants_program and prepared.exporter == "dynamo"
            and settings.reference.kind == MODULE)


def exact_at_module_level(report: Reading, nodes: Sequence[NodeInfo]) -> bool:
    """Whether op level would name nothing finer than module level's classified culprit.

    The culprit's node reads nothing its checked segment computes: every value before
    it was PyTorch's, fed. Op level cannot split one ONNX node (a Conv the exporter
    folded a BatchNorm into has no values of its own inside), so the call traced for op
    level would name the same node, and the module call's float64 rerun
    (:mod:`bisect_onnx.pipeline.module_float64`) has already classified it.
    """
    culprit = report.culprit
    if culprit is None or culprit.local.classification in (None, Kind.UNCLASSIFIED):
        return False
    segment = checked_segment(report, nodes)
    node = next((each for each in segment if each is not None
                 and each.name == culprit.onnx_node), None)
    if node is None or None in segment:
        return False
    computed = {output for each in segment for output in each.outputs}
    return not computed & set(node.inputs)


def checked_segment(report: Reading, nodes: Sequence[NodeInfo]) -> list[NodeInfo | None]:
    """The culprit's nodes as its attribution checked them, in order; ``[]`` without one.

    A name the graph does not hold (a rebuilt node) is ``None`` in its place.
    """
    if report.culprit is None:
        return []
    by_name = {node.name or f"{node.op_type}_{node.index}": node for node in nodes}
    nodes = report.attribution.nodes if report.attribution is not None else None
    return [by_name.get(name) for name in nodes or ()]


def culprit_call_ops(prepared: PreparedCandidate, reference: TorchReference,
                     arrays: Sequence[np.ndarray], report: Reading,
                     captures: tuple[Capture, Capture],
                     references: Mapping[str, np.ndarray]) -> CallOpCapture | None:
    """The op values of the module call holding ``report``'s culprit (module level).

    ``None`` where that call cannot be traced alone exactly (the reason is logged).
    ``references``: PyTorch's values by ONNX name (the module-level pairs'). The
    innermost call holding the culprit's nodes is tried first, then the calls around
    it while what enters the call is not a value the file computes (a Conv folded into
    the BatchNorm whose call it is).
    """
    candidate, (torch_capture, onnx_capture) = prepared.candidate, captures
    references = {**references, **dict(zip((spec.name for spec in candidate.inputs), arrays,
                                           strict=True))}
    groups = nodes_of_calls(torch_capture, candidate.nodes, call_index=prepared.call_index)
    wanted = _nodes_in_question(report, candidate.nodes,
                                bool(candidate.layer_boundaries))
    holding = [key for key, group in groups.items()
               if wanted and wanted <= {node.index for node in group}]
    key = min(holding, key=lambda item: (len(groups[item]), -len(item[0])), default=None)
    # Only what was captured: a call read from a value no capture holds (OpenVINO's
    # residual input, a Conv folded into its BatchNorm) would be checked back past its
    # own ops, where it holds no PyTorch value, and its first op blamed for what
    # entered it.
    known_values = {*onnx_capture.values, *(spec.name for spec in candidate.inputs)}
    while key is not None and key in groups:
        try:
            return _call_ops(prepared, reference, arrays, key, groups[key], onnx_capture,
                             known_values, references)
        except _Outer as outer:
            logger.info("%s; trying the call around it", outer)
            key = outer.key
        except BisectOnnxError as error:
            logger.info("module call %s cannot be traced alone exactly (%s)",
                        call_name(*key), error)
            break
    logger.info("no module call holding the divergence traced alone: tracing the whole model")
    return None


class _Outer(Exception):
    """The call reads a value the file does not compute: try the call around it."""

    def __init__(self, message: str, key: tuple[str, int] | None) -> None:
        super().__init__(message)
        self.key = key


def _call_ops(prepared: PreparedCandidate, reference: TorchReference, arrays: Sequence[np.ndarray],
              key: tuple[str, int], group: list[NodeInfo], onnx_capture: Capture,
              known_values: set[str], references: Mapping[str, np.ndarray]) -> CallOpCapture:
    """One call traced alone, mapped and captured; raises where that is not exact."""
    candidate, (path, call) = prepared.candidate, key
    name = call_name(path, call)
    arguments = record_call(reference.exportable, arrays, prepared.keywords, path, call)
    if arguments is None:
        raise BisectOnnxError(f"module call {name} did not run")
    outer = split_call_name(arguments.scopes[-2]) if len(arguments.scopes) > 1 else None
    inside = {node.index for node in group}
    made_inside = {output for node in group for output in node.outputs}
    entering = {value: references[value] for node in group for value in node.inputs
                if value not in made_inside and value in references}
    elsewhere = {node.torch.fx_node for node in candidate.nodes
                 if node.index not in inside and node.torch and node.torch.fx_node}
    logger.info("tracing module call %s alone for op-level alignment", name)
    emit(CAPTURE_STARTED, f"pytorch ops of {name}")
    try:
        ops = trace_call(reference.exportable, path, arguments,
                         _made_from(candidate.model, group), elsewhere, entering)
    except InputsUnnamed as error:
        raise _Outer(f"module call {name}: {error}", outer) from error
    unknown = sorted(set(ops.graph_inputs) - known_values)
    if unknown:
        raise _Outer(f"module call {name} reads {unknown[0]}, which the file does not "
                     "compute", outer)
    _check_shapes(ops, onnx_capture.values)
    ops.nodes = group + _rebuilt_nodes(candidate.nodes, inside, ops)
    _sources_from_file(ops, group)
    return ops


def _sources_from_file(ops: CallOpCapture, group: Sequence[NodeInfo]) -> None:
    """Source lines as the whole model's trace gives them, the user's call site included.

    The call traced alone has no frames above its own ``forward``: the file's stack
    traces (of the whole model's export) give each op's line and call site; an op with no
    node of its own gets the call site the call's nodes share.
    """
    sources = {node.torch.fx_node: node.torch.source for node in group
               if node.torch and node.torch.fx_node and node.torch.source}
    sites = {source.call_site for source in sources.values()}
    site = next(iter(sites)) if len(sites) == 1 else None
    for name, value in ops.values.items():
        source = sources.get(name, value.provenance.source)
        if (name not in sources and source is not None and source.call_site is None
                and site is not None and in_installed_package(source)):
            source = replace(source, call_site=site)
        ops.values[name] = replace(value, provenance=replace(value.provenance, source=source))


def _nodes_in_question(report: Reading, nodes: Sequence[NodeInfo],
                       boundaries: bool = False) -> set[int]:
    """The culprit's segment (else the first divergence's node).

    ``boundaries``: the capture leaves out values between the runtime's layers
    (OpenVINO hands out no residual input), so a segment checked at module level may
    run far back past the culprit, through a whole residual trunk: where the culprit
    was named inside a fused layer, that node says where.
    """
    record = (report.culprit or report.first_divergence
              or next(iter(report.hidden_divergences), None))  # at parity, a hidden one
    if record is None:
        return set()
    # The segment the attribution checked is the culprit's; without a culprit it may
    # span calls (a hidden divergence's drift), and the first failing node says where.
    producers = GraphView.of(nodes).producer_nodes
    inside = (report.attribution.inside_kernel if report.attribution else None) or {}
    chosen = [node for node in nodes if boundaries and node.name == inside.get("node")] or [
        node for node in checked_segment(report, nodes) if node is not None]
    if not chosen and record.onnx_value in producers:
        chosen = [producers[record.onnx_value]]
    return {node.index for node in chosen}


def _made_from(model: onnx.ModelProto, group: Sequence[NodeInfo]) -> dict[str, MadeFrom]:
    """What the call's ONNX nodes say they were made from, by FX node."""
    known: dict[str, MadeFrom] = {}
    for node in group:
        meta = node.torch
        if meta is None or not meta.fx_node or meta.fx_node in known:
            continue
        origin = made_from(fx_node_text(model.graph.node[node.index]), meta.torch_op)
        if origin is not None:
            known[meta.fx_node] = origin
    # A tuple-valued op's outputs (an LSTM's) are named after the getitems taking them,
    # FX nodes no ONNX node is made from: where nothing in the call reads them, only
    # these names say which of the call's getitems is which.
    for node in group:
        for output in node.outputs:
            if split_name(output)[0] == "getitem" and output not in known:
                known[output] = MadeFrom(op=None, reads=None)
    return known


def _check_shapes(ops: CallOpCapture, values: Mapping[str, CapturedValue]) -> None:
    """An ONNX value named after one of the call's ops holds a tensor of its shape and dtype."""
    for name, value in ops.values.items():
        onnx_value = values.get(name)
        if onnx_value is not None and (onnx_value.array.shape != value.array.shape
                                       or onnx_value.array.dtype != value.array.dtype):
            raise BisectOnnxError(f"{name} is shaped {list(value.array.shape)} "
                                  f"{value.array.dtype} in the call, "
                                  f"{list(onnx_value.array.shape)} {onnx_value.array.dtype} "
                                  "in the file")


def _rebuilt_nodes(nodes: Sequence[NodeInfo], inside: set[int],
                   ops: CallOpCapture) -> list[NodeInfo]:
    """Nodes the optimizer rebuilt without metadata, named after one of the call's ops."""
    return [node for node in nodes if node.index not in inside and node.torch is None
            and node.outputs and any(all(output.startswith(name + "_") for output in node.outputs)
                                     for name in ops.op_names)]


def alignment_inputs(ops: OpCapture, nodes: Sequence[NodeInfo], values: Mapping[str, CapturedValue]
                     ) -> tuple[Sequence[NodeInfo], Mapping[str, CapturedValue]]:
    """The nodes and values op values are aligned with: the call's own, for one call."""
    if not isinstance(ops, CallOpCapture):
        return nodes, values
    produced = {output for node in ops.nodes for output in node.outputs}
    return ops.nodes, {name: value for name, value in values.items() if name in produced}


def op_scope(ops: OpCapture, values: Mapping[str, CapturedValue]) -> OpScope | None:
    """For one call's ops: which values they stand for, and the values entering the call."""
    if not isinstance(ops, CallOpCapture):
        return None
    boundary = [Pair(CapturedValue(name, np.asarray(array), Provenance(
        position=0, module=ops.call, fx_node=name)), values[name])
        for name, array in ops.graph_inputs.items() if name in values]
    return OpScope(call=ops.call, values=frozenset(
        output for node in ops.nodes for output in node.outputs), boundary=boundary)
