"""What a fix search is handed: the run it tries to fix, and the culprit it starts from.

Every search is a function ``search(context: FixContext) -> Sequence[FixResult]``,
registered for culprit classes in :mod:`bisect_onnx.fixes.registry` with one line::

    register("float16", search_float16)

What a search gets (all read-only: it works on copies, never on these objects):

- ``culprit_class``: the culprit's class, one of :data:`CULPRIT_CLASSES` (the
  ``search/classify.py`` kinds, ``search/nodeless.py``'s "pytorch mode" and "missing in
  the export", ``search/inserted.py``'s "graph edit", ``search/baked_shapes.py``'s
  "baked shape", and for ONNX against ONNX the candidate's precision: "float16",
  "bfloat16", "qdq").
- ``reference`` / ``candidate``: the two sides as ``onnx.ModelProto`` where the side is
  an ONNX model (``reference`` is ``None`` for PyTorch against ONNX); ``reference_path``
  / ``candidate_path``: the user's files where they came from files. Never write these.
- ``inputs``: the sample, ONNX input name -> array, exactly as the run fed it.
- ``reference_outputs``: the reference's final outputs, in the candidate's output
  order; a rerun is compared with them through ``output_figures``.
- ``candidate_outputs``: the candidate's final outputs as the run computed them (a
  fix on the reference side, such as ``model.eval()``, is compared with these).
- ``before``: the run's own figures (``OutputFigures``), the ``FixResult.before`` of
  every result.
- ``tolerance``: the run's judge's ``.base`` (a ``Tolerance``: ``rtol``, ``atol``);
  ``output_figures(..., rtol=tolerance.rtol, atol=tolerance.atol)``.
- ``torch_model``: the user's ``nn.Module`` where there is one (never modify it: deep
  copy it, or restore its state); ``torch_inputs``: its positional inputs
  (tensors) and ``torch_keywords`` its keyword inputs.
- ``culprit_nodes``: the ONNX node names the culprit names (first culprit first);
  ``culprit_module``: its PyTorch module path where known.
- ``session_keywords``: the keyword arguments the run made its ORT sessions with
  (providers, opt level); a rerun uses them except what the fix changes.
- ``opt_level``: the candidate's ``--opt-level`` (``runtime/sessions.py`` names).
- ``memory_budget``: bytes a search may use for copies (``None``: no limit); a search
  that needs more raises :class:`FixUnavailable` with a one-line reason.

A search that cannot run raises :class:`FixUnavailable` (or any ``BisectOnnxError``):
the dispatcher shows its one-line message ("no fix search: no float32 reference"),
never a traceback.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.fixes.trial import OutputFigures

if TYPE_CHECKING:
    import onnx
    import torch

    from bisect_onnx.judge.tolerances import Tolerance

__all__ = ["CULPRIT_CLASSES", "FixContext", "FixUnavailable"]

#: Every culprit class a search may be registered for.
CULPRIT_CLASSES = ("pytorch mode", "missing in the export", "graph edit", "exporter",
                   "runtime kernel", "float16", "bfloat16", "qdq", "optimization",
                   "baked shape")


class FixUnavailable(Exception):
    """A fix search cannot run here; its message is the one line the report shows."""


@dataclass(frozen=True)
class FixContext:
    """The run a fix search tries to fix (see the module docstring for each field)."""

    culprit_class: str
    candidate: onnx.ModelProto | None
    inputs: Mapping[str, np.ndarray]
    reference_outputs: Sequence[np.ndarray]
    before: OutputFigures
    tolerance: Tolerance
    reference: onnx.ModelProto | None = None
    candidate_outputs: Sequence[np.ndarray] = ()
    reference_path: Path | None = None
    candidate_path: Path | None = None
    torch_model: torch.nn.Module | torch.export.ExportedProgram | None = None
    torch_inputs: tuple[torch.Tensor, ...] = ()
    torch_keywords: Mapping[str, torch.Tensor] = field(default_factory=dict)
    culprit_nodes: tuple[str, ...] = ()
    culprit_module: str | None = None
    session_keywords: Mapping[str, str] = field(default_factory=dict)
    opt_level: str | None = None
    memory_budget: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Anything a pipeline has that a search may use and the fields above do not hold."""

    def user_paths(self) -> tuple[Path, ...]:
        """The user's files: what ``--write-fixed`` must never overwrite."""
        return tuple(path for path in (self.reference_path, self.candidate_path) if path)
