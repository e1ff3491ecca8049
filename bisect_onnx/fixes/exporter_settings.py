"""How a model was exported, and the other exports worth trying for an exporter culprit.

An exporter culprit (classified "graph semantics": the graph means something else than
the torch op, even in float64) is the translation's fault, so another translation of the
same op may be right: the other exporter, another opset (an op's ONNX form changes with
the opset: AveragePool, Resize, LayerNormalization), or an export option that rewrites
the graph after translation (the dynamo exporter's onnxscript optimizer, ``optimize``;
the TorchScript exporter's ``do_constant_folding``). Other options (``input_names``,
``dynamic_shapes``, ``verbose``) do not change what an op computes at fixed shapes, so
they are kept as the user set them, not searched.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from bisect_onnx.pytorch.reexport import ExportCall

if TYPE_CHECKING:
    import onnx

__all__ = ["settings_of_model", "candidate_settings", "SUPPORTED_OPSETS"]

#: The opsets each exporter writes with torch 2.13: the dynamo exporter translates at 18
#: and later natively (17 through the ONNX version converter); the TorchScript exporter
#: stops at 20 (``torch.onnx._constants.ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET``).
SUPPORTED_OPSETS = {"dynamo": (18, 17, 20, 21, 23), "torchscript": (17, 18, 20, 14)}

#: The option of each exporter that rewrites the translated graph, and its default.
_REWRITING_OPTION = {"dynamo": ("optimize", True), "torchscript": ("do_constant_folding", True)}


def settings_of_model(model: onnx.ModelProto | None) -> ExportCall:
    """The settings an ONNX ``ModelProto`` was exported with, as far as the file says.

    The opset is the default domain's; the dynamo exporter marks its nodes with
    ``pkg.torch.onnx.*`` metadata, the TorchScript exporter names them
    ``/module/Op`` and writes no metadata. A file that is neither says ``None``.
    """
    opset = next((entry.version for entry in getattr(model, "opset_import", ())
                  if entry.domain in ("", "ai.onnx")), None)
    graph = getattr(model, "graph", None)
    nodes = list(graph.node) if graph is not None else []
    if getattr(model, "producer_name", "") != "pytorch":
        return ExportCall(None, opset)
    dynamo = any(entry.key.startswith("pkg.torch.onnx.") for node in nodes
                 for entry in node.metadata_props)
    scripted = any(node.name.startswith("/") for node in nodes)
    exporter = "dynamo" if dynamo else "torchscript" if scripted or nodes else None
    return ExportCall(exporter, opset)


def candidate_settings(used: ExportCall) -> list[ExportCall]:
    """The exports to try instead of ``used``, the likeliest and cheapest first.

    First the other exporter at the same opset (a different translation altogether),
    then the same translation without its rewriting pass, then other opsets of the same
    exporter, then of the other one. ``used`` itself is left out; where its exporter is
    unknown, both are tried.
    """
    kept = {name: value for name, value in used.options.items()
            if name not in ("optimize", "do_constant_folding", "dynamo", "opset_version")}
    exporters = ["dynamo", "torchscript"]
    if used.exporter in exporters:
        exporters.remove(used.exporter)
        exporters.insert(0, used.exporter)  # the same exporter's levers come second
    same, other = exporters[0], exporters[1]
    order: list[ExportCall] = []
    if used.exporter is not None:
        order.append(ExportCall(other, _supported(other, used.opset), kept))
        order.append(_without_rewriting(ExportCall(same, used.opset, kept)))
        order += [ExportCall(same, opset, kept) for opset in SUPPORTED_OPSETS[same]]
        order += [ExportCall(other, opset, kept) for opset in SUPPORTED_OPSETS[other]]
    else:
        for exporter in exporters:
            order.append(ExportCall(exporter, _supported(exporter, used.opset), kept))
            order.append(_without_rewriting(order[-1]))
        order += [ExportCall(exporter, opset, kept) for exporter in exporters
                  for opset in SUPPORTED_OPSETS[exporter]]
    return _distinct(order, used)


def _supported(exporter: str, opset: int | None) -> int | None:
    """``opset`` where ``exporter`` writes it, else that exporter's nearest one."""
    if opset is None or opset in SUPPORTED_OPSETS[exporter]:
        return opset
    return min(SUPPORTED_OPSETS[exporter], key=lambda each: (abs(each - opset), -each))


def _without_rewriting(settings: ExportCall) -> ExportCall:
    """``settings`` with its exporter's graph-rewriting pass turned off."""
    name, _ = _REWRITING_OPTION[settings.exporter]
    return replace(settings, options={**settings.options, name: False})


def _distinct(order: list[ExportCall], used: ExportCall) -> list[ExportCall]:
    """``order`` without repeats and without ``used`` (an opset of None is the default)."""
    def key(settings: ExportCall) -> tuple:
        name, default = _REWRITING_OPTION.get(settings.exporter or "", (None, None))
        rewriting = settings.options.get(name, default) if name else None
        return settings.exporter, settings.opset, rewriting

    seen = {key(used)} if used.exporter is not None else set()
    distinct = []
    for settings in order:
        if key(settings) not in seen:
            seen.add(key(settings))
            distinct.append(settings)
    return distinct
