"""Whether the export baked the shapes it was made at: checked, for a sample run at others.

A sample whose inputs are not shaped like those the export was made at (the first
input set of an export made here; a program's example inputs; unknown for a file with
free dimensions) and that diverges, or that the runtime refuses to run, may meet a
shape the export turned into a constant. The check: the same model exported here at
the sample's shapes with the same call (exporter, opset, dynamic axes or shapes) and
run; where that reaches parity, the nodes whose constants differ between the two
exports are the baked-in shapes (:mod:`bisect_onnx.graph.constant_diff`), named with
their module, source line and the tracer's warning for it.
"""

from __future__ import annotations

import logging
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.errors import RuntimeRefused
from bisect_onnx.fixes.trial import output_figures
from bisect_onnx.graph.constant_diff import GraphDifference, graph_difference
from bisect_onnx.graph.scopes import read_scopes
from bisect_onnx.judge.findings import AttributionFindings, Findings
from bisect_onnx.pipeline.prepare import dynamic_batch_options
from bisect_onnx.pytorch.reexport import (
    ExportCall,
    TracerNote,
    export_and_run,
    export_here,
    file_call,
    free_dims,
    inputs_at,
    shapes_of,
)
from bisect_onnx.pytorch.reference import MODULE, SCRIPT_MODULE
from bisect_onnx.search.baked_shapes import (
    BAKED_KIND,
    BakedNode,
    BakedShapes,
    input_shapes_differ,
)

if TYPE_CHECKING:
    from bisect_onnx.graph.nodes import NodeInfo
    from bisect_onnx.graph.provenance import SourceLocation
    from bisect_onnx.judge.records import Record
    from bisect_onnx.pipeline.torch_settings import Settings

__all__ = ["may_be_baked", "find_baked_shapes", "with_baked", "refused_error",
           "export_shapes", "export_call"]

logger = logging.getLogger(__name__)

#: A culprit's classifications a baked shape may be behind: none, or the graph's meaning.
_UNEXPLAINED = (None, "unclassified", "graph semantics")

#: How many sizes are tried to find the shapes a file of unknown shapes was exported at.
_SIZE_TRIES = 3

Shapes = tuple[tuple[int, ...], ...]


def may_be_baked(settings: Settings, arrays: Sequence[np.ndarray], *,
                 classified: str | None = None) -> bool:
    """Whether the sample's shapes may not be the export's, and the model can be exported.

    Where the export's shapes are not known (a file with free dimensions), a culprit
    ``classified`` by a check of another cause (a runtime's kernel, float rounding, the
    model's mode) is not checked again at the cost of an export.
    """
    prepared, reference = settings.prepared, settings.reference
    if reference.kind not in (MODULE, SCRIPT_MODULE):
        return False
    exporter = settings.export.exporter if prepared.source == "exported here" \
        else prepared.exporter
    if exporter not in ("dynamo", "torchscript") or (
            exporter == "dynamo" and reference.kind == SCRIPT_MODULE):
        return False
    known = export_shapes(settings)
    if known is None and (not free_dims(prepared.candidate.model)
                          or classified not in _UNEXPLAINED):
        return False  # every dimension fixed (the run's are the export's), or explained
    return input_shapes_differ(known, shapes_of(arrays))


def export_shapes(settings: Settings) -> Shapes | None:
    """The shapes the export was made at, where the run knows them: its own export's.

    (A program traced here to name a file's values is traced at the sample's shapes,
    and says nothing of the file's.)
    """
    prepared, reference = settings.prepared, settings.reference
    if prepared.capture_inputs is not None:
        return shapes_of(prepared.capture_inputs)
    if prepared.source == "exported here" and reference.example_inputs is not None:
        return tuple(tuple(tensor.shape) for tensor in reference.example_inputs)
    return None


def export_call(settings: Settings, arrays: Sequence[np.ndarray]) -> ExportCall:
    """The call the file was exported with: the options of an export made here, else the file's.

    A file's own call is read off it: its exporter, its opset, its free dimensions
    (``dynamic_axes`` for the TorchScript exporter, ``dynamic_shapes`` for dynamo).
    """
    prepared, export = settings.prepared, settings.export
    if prepared.source != "exported here":
        return file_call(prepared.candidate.model, prepared.exporter)
    options = dict(export.torch_kwargs)
    if export.dynamic_batch:
        options.update(dynamic_batch_options(export.exporter, settings.reference, arrays))
    return ExportCall(export.exporter or "dynamo", export.opset, options)


def find_baked_shapes(settings: Settings, arrays: Sequence[np.ndarray],
                      torch_outputs: Sequence[np.ndarray], *,
                      records: Sequence[Record] = ()) -> BakedShapes | None:
    """What the export baked in, where an export at the run's shapes reaches parity.

    ``None`` where that export fails, does not reach parity (the shapes are not the
    cause) or holds the same constants as the file.
    """
    prepared, tolerance = settings.prepared, settings.judge.base
    call = export_call(settings, arrays)
    folder = Path(tempfile.mkdtemp(prefix="baked-", dir=settings.workdir))
    again = export_and_run(settings.reference.exportable, arrays, call, folder / "run",
                           keywords=prepared.keywords)[0]
    if again.outputs is None:
        logger.info("baked-shape check: the export at the run's shapes failed: %s",
                    again.failure)
        return None
    figures = output_figures(torch_outputs, again.outputs, rtol=tolerance.rtol,
                             atol=tolerance.atol)
    if not figures.passes:
        logger.info("baked-shape check: the export at the run's shapes diverges too "
                    "(max abs %.3g): the shapes are not the cause", figures.max_abs)
        return None
    difference = graph_difference(prepared.candidate.model, again.model)
    if difference.empty:
        logger.info("baked-shape check: the export at the run's shapes reaches parity, yet "
                    "holds the file's constants")
        return None
    known = export_shapes(settings)
    shapes = known or _found_export_shapes(settings, arrays, difference, call, folder)
    if known is None and not _reproduced(settings, arrays, shapes, call, folder,
                                         torch_outputs):
        return None
    return BakedShapes(
        input_names=tuple(spec.name for spec in prepared.candidate.inputs),
        run_shapes=shapes_of(arrays), export_shapes=shapes, call=call, error=figures.max_abs,
        nodes=_baked_nodes(settings, difference, records, again.notes),
        counts=difference.counts, notes=again.notes,
        loop_source=_loop_source(settings, difference, records))


def _reproduced(settings: Settings, arrays: Sequence[np.ndarray], shapes: Shapes | None,
                call: ExportCall, folder: Path, torch_outputs: Sequence[np.ndarray]) -> bool:
    """Whether this model exported at the file's shapes diverges at the run's as the file does.

    A file given (not made here) may differ from this model's export in more than its
    shapes: a weight someone edited, a node inserted. Its divergence is put down to
    baked shapes only where an export at the shapes it was made at diverges too.
    """
    if shapes is None:
        logger.info("baked-shape check: no export of the model at the sizes tried holds the "
                    "file's constants: its divergence is not shown to come from its shapes")
        return False
    again = export_and_run(settings.reference.exportable, inputs_at(arrays, shapes), call,
                           folder / "verify", keywords=settings.prepared.keywords,
                           run_on=[arrays])[0]
    tolerance = settings.judge.base
    if again.outputs is not None and output_figures(
            torch_outputs, again.outputs, rtol=tolerance.rtol, atol=tolerance.atol).passes:
        logger.info("baked-shape check: the model exported at the file's shapes reaches parity "
                    "at the run's: the file differs from its export in more than its shapes")
        return False
    return True


def _found_export_shapes(settings: Settings, arrays: Sequence[np.ndarray],
                         difference: GraphDifference, call: ExportCall,
                         folder: Path) -> Shapes | None:
    """The shapes a file was exported at: those whose export holds its very constants.

    Tried first with each free dimension at the size the baked constants say it had (a
    divisor ``3.0`` in the file and ``5.0`` at the run's shapes: a size of 5 was 3), then
    at the sizes the constants hold, a loop's repeats, 1 and 2 (the usual example
    batch): one free dimension at a time (the others at the run's sizes, so that a
    dimension the graph does not hold is not said to have been another size), then
    every one; a few tries at most.
    """
    model = settings.prepared.candidate.model
    free = free_dims(model)
    run = shapes_of(arrays)
    pairs: dict[int, int] = {}
    for each in difference.constants:
        pairs.update(each.size_pairs())
    tried = {run[position][index] for position, dims in free.items() for index in dims}
    sizes = [size for each in difference.constants for size in each.sizes]
    sizes += [each.first for each in difference.counts]  # a loop unrolled once per element
    sizes = [size for size in dict.fromkeys([*sizes, 1, 2]) if size > 0 and size not in tried]
    tries = [pairs] if pairs else []
    for size in sizes:
        tries += [{each: size} for each in sorted(tried)] + [dict.fromkeys(tried, size)]
    tries = [dict(each) for each in dict.fromkeys(tuple(sorted(each.items())) for each in tries)]
    for sizes_now in tries[:_SIZE_TRIES]:
        shapes = tuple(tuple(sizes_now.get(dim, dim) if index in free.get(position, {})
                             else dim for index, dim in enumerate(shape))
                       for position, shape in enumerate(run))
        made = export_here(settings.reference.exportable, inputs_at(arrays, shapes), call,
                           folder / f"try-{len(list(folder.glob('try-*')))}",
                           keywords=settings.prepared.keywords)
        if made.graph is not None and graph_difference(model, made.graph).empty:
            return shapes
    return None


def _baked_nodes(settings: Settings, difference: GraphDifference, records: Sequence[Record],
                 notes: Sequence[TracerNote]) -> tuple[BakedNode, ...]:
    """The differing nodes with their modules, lines and the tracer's warnings."""
    nodes = settings.prepared.candidate.nodes
    modules = _modules(nodes, settings.reference.exportable)
    by_node = {record.onnx_node: record.source for record in records
               if record.onnx_node and record.source is not None}
    info = {node.name: node for node in nodes}
    lines = {(note.source.file, note.source.line): note for note in notes}
    only = next(iter(lines.values())) if len(lines) == 1 else None
    baked = []
    for each in difference.constants:
        node = info.get(each.node)
        source = (node.torch.source if node is not None and node.torch is not None
                  else None) or by_node.get(each.node)
        note = lines.get((source.file, source.line)) if source is not None else only
        if source is None and note is not None:
            source = note.source
        baked.append(BakedNode(each.node, each.op_type, each.part, each.first, each.second,
                               modules.get(each.node), source, note, each.values, each.feeds))
    return tuple(baked)


def _loop_source(settings: Settings, difference: GraphDifference,
                 records: Sequence[Record]) -> SourceLocation | None:
    """The line most nodes of the op types a loop repeats were computed at."""
    repeated = {each.op_type for each in difference.counts}
    if not repeated:
        return None
    by_node = {record.onnx_node: record.source for record in records
               if record.onnx_node and record.source is not None}
    found = [(node.torch.source if node.torch is not None else None) or by_node.get(node.name)
             for node in settings.prepared.candidate.nodes if node.op_type in repeated]
    found = [str(each) for each in found if each is not None]
    if not found:
        return None
    line = Counter(found).most_common(1)[0][0]
    return next(source for source in (
        (node.torch.source if node.torch is not None else None) or by_node.get(node.name)
        for node in settings.prepared.candidate.nodes) if str(source) == line)


def _modules(nodes: Sequence[NodeInfo], model: object) -> dict[str, str | None]:
    """Each node's innermost module path (``""``: the model's own forward)."""
    named = getattr(model, "named_modules", None)
    paths = [name for name, _ in named()] if callable(named) else []
    scopes = read_scopes(nodes, paths)
    return {node.name: (scope.modules[-1] if scope.modules else "") if scope else None
            for node, scope in zip(nodes, scopes, strict=True)}


def with_baked(findings: Findings, baked: BakedShapes) -> Findings:
    """The findings with the baked shapes said: a warning, and the culprit's classification."""
    findings = replace(findings, warnings=(*findings.warnings, baked.warning()))
    attribution = findings.attribution
    if attribution is None:  # no value checked (final outputs only): the cause is still said
        return replace(findings, attribution=AttributionFindings(
            checked={}, evidence={**_NOTHING_CHECKED, "baked_shapes": baked.to_dict()}))
    evidence = {**attribution.evidence, "baked_shapes": baked.to_dict()}
    checked, kernel_checked = dict(attribution.checked), dict(attribution.kernel_checked)
    if attribution.culprits:
        first = attribution.culprits[0].value
        evidence["classification"] = baked.classification()
        for figures in (checked, kernel_checked):
            if first in figures:
                figures[first] = replace(figures[first], classification=BAKED_KIND)
    return replace(findings, attribution=replace(attribution, evidence=evidence,
                                                 checked=checked,
                                                 kernel_checked=kernel_checked))


#: The evidence of an attribution that checked no value.
_NOTHING_CHECKED = {"noise": [], "drift": False, "largest_jump": None, "checked": 0,
                    "inputs": None, "nodes": None, "classification": None, "unchecked": {},
                    "narrowed": None, "passed_alone": None}


def refused_error(settings: Settings, arrays: Sequence[np.ndarray],
                  torch_outputs: Sequence[np.ndarray], error: RuntimeRefused) -> RuntimeRefused:
    """The runtime's refusal, naming its node's module and line, and any baked shape."""
    if error.node is None:
        return error
    candidate = settings.prepared.candidate
    node = next((each for each in candidate.nodes if each.name == error.node), None)
    module = _modules(candidate.nodes, settings.reference.exportable).get(error.node)
    source = node.torch.source if node is not None and node.torch is not None else None
    checkable = may_be_baked(settings, arrays)
    baked = find_baked_shapes(settings, arrays, torch_outputs) if checkable else None
    where = _where(module, source)
    message = (f"ONNX Runtime refused to run {candidate.path.name} on these inputs at node "
               f"{error.node!r} ({error.op_type}){where}: {error.reason}")
    if baked is not None:
        shown = "; ".join(node.describe() for node in baked.nodes[:3]) or baked.unrolled()
        message += (f"; {baked.advice()} (checked: the model exported here at this run's "
                    f"shapes with the same call runs and reaches parity; in the file {shown})")
        if settings.fixes.suggest:
            message += f"; {_symbolic_fix(settings, arrays, torch_outputs, baked)}"
    elif checkable:
        message += ("; this run's input shapes are not those of the export, and the model "
                    "exported here at them does not reach parity either, so a baked shape "
                    "is not shown to be the cause")
    return RuntimeRefused(message, node=error.node, op_type=error.op_type,
                          reason=error.reason, module=module, source=source, baked=baked)


def _symbolic_fix(settings: Settings, arrays: Sequence[np.ndarray],
                  torch_outputs: Sequence[np.ndarray], baked: BakedShapes) -> str:
    """The export call that keeps the sizes symbolic, checked at both shapes, in a line."""
    from bisect_onnx.fixes.baked_fix import check_symbolic_exports

    candidate = settings.prepared.candidate
    return check_symbolic_exports(
        settings.reference.exportable, arrays, torch_outputs, baked,
        names=[spec.name for spec in candidate.inputs], free=free_dims(candidate.model),
        tolerance=settings.judge.base, keywords=settings.prepared.keywords).summary()


def _where(module: str | None, source: SourceLocation | None) -> str:
    text = "" if module is None else (" in the model's own forward" if module == ""
                                      else f" in module {module}")
    return text + (f" at {source}" if source is not None else "")


def records_of(findings: Findings | None) -> list[Record]:
    """Every record the findings hold, for the sources of nodes (TorchScript files)."""
    if findings is None:
        return []
    comparison = findings.judged
    kernel = findings.attribution.kernel_values if findings.attribution is not None else ()
    return [*comparison.comparisons, *comparison.op_comparisons, *comparison.final_outputs,
            *kernel]


def outputs_of(values: Mapping[str, np.ndarray] | Sequence) -> list[np.ndarray]:
    """PyTorch's final outputs as arrays (``CapturedValue``s or arrays)."""
    return [getattr(value, "array", value) for value in values]
