"""The exporter fix search as the fix stage runs it: a :class:`FixContext` in, results out.

For an exporter culprit (classified "graph semantics" against PyTorch), other exports
are tried (:func:`~bisect_onnx.fixes.exporter_fix.find_export_fix`). Where none
reaches parity, the culprit's op is written as a standalone torch script
(:mod:`bisect_onnx.fixes.exporter_repro`), run once to check that it shows the
mismatch, and attached to every result as ``details["exporter_repro"]`` (and written
to ``extra["repro_dir"]`` where the pipeline names one). Where no export even improves
things, there is no result to attach it to, so the search says so in its one line.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from bisect_onnx.fixes.context import FixContext, FixUnavailable
from bisect_onnx.fixes.exporter_fix import DEFAULT_TIME_BUDGET_S, Baseline, find_export_fix
from bisect_onnx.fixes.exporter_op import CannotIsolate, locate_culprit_op
from bisect_onnx.fixes.exporter_repro import check_repro_script, exporter_repro_script
from bisect_onnx.fixes.exporter_settings import settings_of_model
from bisect_onnx.fixes.registry import register
from bisect_onnx.fixes.trial import FixResult
from bisect_onnx.pytorch.reexport import ExportCall

__all__ = ["search_exporter", "used_settings", "REPRO_NAME"]

logger = logging.getLogger(__name__)

#: The script's file name in the repro folder.
REPRO_NAME = "exporter_repro.py"


def search_exporter(context: FixContext) -> list[FixResult]:
    """Other exports of the user's model; the standalone script where none fixes it."""
    import torch

    model = context.torch_model
    if not isinstance(model, torch.nn.Module):
        raise FixUnavailable("no PyTorch module to export again")
    if isinstance(model, torch.jit.ScriptModule):
        raise FixUnavailable("a TorchScript model has one exporter; no other export to try")
    used = used_settings(context)
    search = find_export_fix(
        model, context.torch_inputs, context.torch_keywords, used=used,
        tolerance=context.tolerance,
        baseline=Baseline(list(context.reference_outputs), context.before),
        time_budget_s=float(context.extra.get("time_budget_s", DEFAULT_TIME_BUDGET_S)))
    logger.info("exporter fix search: %s", search.summary())
    if search.fixed:
        return list(search.results)
    repro, line = _exporter_repro(context, used, attached=bool(search.results))
    if not search.results:
        raise FixUnavailable(f"no other export reaches parity or improves on the culprit "
                             f"({search.summary()}); {line}")
    return [FixResult(result.kind, result.change, result.before, result.after,
                      details={**result.details, **repro}, seconds=result.seconds)
            for result in search.results]


def used_settings(context: FixContext) -> ExportCall:
    """How the failing file was exported: ``extra["export"]`` (an ExportOptions) or the file."""
    given = context.extra.get("export")
    from_file = settings_of_model(context.candidate)
    if given is None:
        return from_file
    return ExportCall(getattr(given, "exporter", None) or from_file.exporter,
                          getattr(given, "opset", None) or from_file.opset,
                          dict(getattr(given, "torch_kwargs", None) or {}))


def _exporter_repro(context: FixContext, used: ExportCall, *,
                    attached: bool) -> tuple[dict[str, Any], str]:
    """The checked script as ``details`` entries, and one line on it for the report.

    ``attached``: whether the entries reach a result; where not, only a repro folder
    keeps the script, and the line says so.
    """
    value, torch_op = _culprit_value(context)
    try:
        op = locate_culprit_op(context.torch_model, context.torch_inputs,
                               context.torch_keywords, value_name=value, torch_op=torch_op,
                               module=context.culprit_module)
    except CannotIsolate as error:
        return {}, f"no standalone exporter repro: {error}"
    node = context.culprit_nodes[0] if context.culprit_nodes else op.fx_name
    text = exporter_repro_script(op, used, rtol=context.tolerance.rtol,
                                 atol=context.tolerance.atol, culprit=f"node {node!r}")
    check = check_repro_script(text)
    details: dict[str, Any] = {"exporter_repro": text, "exporter_repro_reproduces":
                               check.reproduces, "culprit_op": op.target}
    folder = context.extra.get("repro_dir")
    where = ("in the fixes' details['exporter_repro']" if attached else
             "not kept (a repro folder, --repro-dir, keeps it)")
    if folder is not None and Path(folder).is_dir():
        path = Path(folder) / REPRO_NAME
        path.write_text(text)
        details["exporter_repro_path"] = str(path)
        where = f"written to {path}"
    if check.reproduces:
        return details, (f"{op.target} exported alone shows the mismatch: a standalone "
                         f"script for the exporter's issue tracker is {where}")
    return details, (f"{op.target} exported alone does not show the mismatch (exit "
                     f"{check.returncode}); the script is {where}, the ONNX repro is the "
                     "one to file")


def _culprit_value(context: FixContext) -> tuple[str | None, str | None]:
    """The culprit node's first output and torch op target, from the candidate's graph.

    A dynamo export names a node's output after its FX node and keeps the target in
    ``pkg.torch.onnx.fx_node`` (``call_function[target=torch.ops.aten.x.default]``).
    """
    graph = getattr(context.candidate, "graph", None)
    if graph is None or not context.culprit_nodes:
        return None, context.extra.get("torch_op")
    node = next((node for node in graph.node if node.name == context.culprit_nodes[0]), None)
    if node is None:
        return None, context.extra.get("torch_op")
    target = context.extra.get("torch_op")
    for entry in node.metadata_props:
        if entry.key == "pkg.torch.onnx.fx_node" and "target=torch.ops." in entry.value:
            target = entry.value.split("target=torch.ops.", 1)[1].split("]", 1)[0]
    return (node.output[0] if node.output else None), target


register("exporter", search_exporter)
