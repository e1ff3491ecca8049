"""Whether an ONNX file is this model's export: its modules and its weights checked.

A user who passes the export of another model (a file left from another experiment),
or of the same model before it was trained again, sees the outputs differ, and a run
that named a culprit would send them to the exporter. Two checks tell such a file
apart before any culprit is named:

- **modules**: the modules the file's nodes name (the dynamo exporter's scopes, the
  TorchScript exporter's ``/layer1/conv/Conv`` names), looked up among the model's;
- **weights**: each initializer named after a parameter or buffer of the model (both
  exporters keep the ``state_dict`` names) of its shape and dtype, compared bit for bit.

A planted or edited node changes one weight, and an exporter folds some weights into
others (a BatchNorm into its Conv, under new names): only a file most of whose named
modules or compared weights are not the model's, several of them, is said to be
another model's export.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.graph.scopes import read_scopes
from bisect_onnx.graph.weights import tensor_values

if TYPE_CHECKING:
    import onnx
    import torch
    from torch.export import ExportedProgram

__all__ = ["FileIdentity", "check_file_identity"]

logger = logging.getLogger(__name__)

#: Fewer differing modules or weights than this is an edit, not another model.
_AT_LEAST = 2
#: How many differing names a message lists.
_SHOWN = 3


@dataclass(frozen=True)
class FileIdentity:
    """What of an ONNX file was found in the model it is compared with."""

    modules_named: int
    """Distinct modules the file's nodes name."""
    modules_missing: tuple[str, ...]
    """Those the model has no module of that name (or path)."""
    weights_compared: int
    """Initializers named after a model weight of the same shape and dtype."""
    weights_differing: tuple[str, ...]
    """Those whose values are not the model's."""

    @property
    def another_model(self) -> str | None:
        """Why the file is not this model's export; ``None`` where nothing says so."""
        reasons = []
        missing = len(self.modules_missing)
        if _most(missing, self.modules_named) or 0 < missing == self.modules_named:
            reasons.append(f"{len(self.modules_missing)} of the {self.modules_named} modules "
                           f"its nodes name are not in the model ({_some(self.modules_missing)})")
        if _most(len(self.weights_differing), self.weights_compared):
            reasons.append(f"{len(self.weights_differing)} of its {self.weights_compared} "
                           "weights named after the model's hold other values "
                           f"({_some(self.weights_differing)})")
        return "; ".join(reasons) or None


def check_file_identity(exportable: torch.nn.Module | ExportedProgram, model: onnx.ModelProto,
                        nodes: Sequence[NodeInfo], base_dir: Path) -> FileIdentity:
    """The file's modules and weights looked up in ``exportable`` (the user's model)."""
    weights = _model_weights(exportable)
    paths = {name.rpartition(".")[0] for name in weights} | _module_paths(exportable)
    named, missing = _missing_modules(nodes, paths)
    compared, differing = _compare_weights(weights, model, nodes, base_dir)
    identity = FileIdentity(named, tuple(missing), compared, tuple(differing))
    logger.info("the file names %d modules (%d not in the model) and holds %d of its "
                "weights (%d differ)", named, len(missing), compared, len(differing))
    return identity


def _most(part: int, whole: int) -> bool:
    return part >= _AT_LEAST and part * 2 > whole


def _some(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (", ..." if len(names) > _SHOWN else "")


def _model_weights(exportable: torch.nn.Module | ExportedProgram) -> dict[str, np.ndarray]:
    """The model's parameters and buffers by ``state_dict`` name, as arrays."""
    import torch

    # An ExportedProgram keeps its weights in a dict; a module gives them.
    state = (exportable.state_dict() if isinstance(exportable, torch.nn.Module)
             else exportable.state_dict)
    return {name: value.detach().cpu().numpy() for name, value in state.items()
            if isinstance(value, torch.Tensor) and value.dtype not in (torch.bfloat16,)
            and not value.is_sparse}


def _module_paths(exportable: torch.nn.Module | ExportedProgram) -> set[str]:
    """Every module path of the model (``""`` for the model itself)."""
    import torch

    if isinstance(exportable, torch.nn.Module):
        return {name for name, _ in exportable.named_modules()}
    return set()


def _missing_modules(nodes: Sequence[NodeInfo], paths: set[str]) -> tuple[int, list[str]]:
    """How many modules the file's nodes name, and those the model does not have.

    A dynamo node names its innermost module's path; a TorchScript node's name is its
    scope (``/layer1/conv/Conv``), which names no module of the model where a component
    resolves to none of them.
    """
    named: set[str] = set()
    missing: set[str] = set()
    for node, scope in zip(nodes, read_scopes(nodes, paths), strict=True):
        if node.torch is not None:
            module = next((scope for scope in reversed(node.torch.scopes) if scope), None)
            if module is not None:
                named.add(module)
                if module.split("@")[0] not in paths:
                    missing.add(module)
        elif scope is not None:
            written = "/".join(node.name.split("/")[1:-1])
            if written:
                named.add(written)
                if not scope.complete:
                    missing.add(written)
    return len(named), sorted(missing)


def _compare_weights(weights: Mapping[str, np.ndarray], model: onnx.ModelProto,
                     nodes: Sequence[NodeInfo], base_dir: Path) -> tuple[int, list[str]]:
    """How many same-named weights the file holds, and which hold other values."""
    rewritten = {name for node in nodes if node.torch is not None and node.torch.rewrite_rule
                 for name in node.inputs}
    compared, differing = 0, []
    for tensor in model.graph.initializer:
        mine = weights.get(tensor.name)
        if mine is None or tuple(tensor.dims) != mine.shape:
            continue
        try:
            theirs = tensor_values(tensor, base_dir)
        except (OSError, ValueError) as error:  # external data gone: nothing to compare
            logger.debug("initializer %s not read: %s", tensor.name, error)
            continue
        if theirs.dtype != mine.dtype or tensor.name in rewritten:
            continue  # converted (float16), or a rewrite folded a BatchNorm into it
        compared += 1
        if not (np.array_equal(theirs, mine, equal_nan=True) or _folded(theirs, mine)):
            differing.append(tensor.name)
    return compared, differing


def _folded(theirs: np.ndarray, mine: np.ndarray) -> bool:
    """Whether ``theirs`` is ``mine`` scaled per output channel.

    A BatchNorm folded in by a tool that left no metadata: not another model's weight.
    """
    if mine.ndim < 2 or not np.issubdtype(mine.dtype, np.floating):
        return False
    flat_mine = mine.reshape(len(mine), -1).astype(np.float64)
    flat_theirs = theirs.reshape(len(theirs), -1).astype(np.float64)
    norms = np.einsum("ij,ij->i", flat_mine, flat_mine)
    scale = np.divide(np.einsum("ij,ij->i", flat_theirs, flat_mine), norms,
                      out=np.zeros_like(norms), where=norms > 0)
    return bool(np.allclose(flat_theirs, scale[:, None] * flat_mine, rtol=1e-4, atol=1e-7))
