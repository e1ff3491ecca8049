"""What the reference offers the culprit search beyond its values: :class:`Evidence`."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from bisect_onnx.align.modules import CallIndex
    from bisect_onnx.graph.nodes import NodeInfo
    from bisect_onnx.judge.compare import ArrayComparison
    from bisect_onnx.pytorch.op_values import OpCapture
    from bisect_onnx.runtime.sides import Capture, CapturedValue
    from bisect_onnx.search.local import LocalCheck

__all__ = ["Evidence"]


@dataclass(frozen=True)
class Evidence:
    """What the reference offers beyond its values, to name and classify a finer culprit."""

    program: ExportedProgram | None = None
    """The program PyTorch ran (FX): an op rerun in float64."""
    ops: OpCapture | None = None
    """PyTorch's op values by FX node name: the values inside a fused kernel compared."""
    modules: tuple[Capture, CallIndex] | None = None
    """``(module capture, call index)``: for module rows what ``ops`` does for op rows."""
    compare: Callable[[str, np.ndarray], ArrayComparison] | None = None
    """Judges a local result where the reference needs converting
    (:func:`bisect_onnx.search.local.run_locally`)."""
    kernel_references: Mapping[str, CapturedValue] | None = None
    """The reference's values of the values ONNX Runtime fused away (ONNX against ONNX:
    the reference model computes them), by the candidate's names: the node that went
    wrong inside a fused kernel named as ``ops`` do."""
    torch_float64: Callable[[LocalCheck], np.ndarray | None] | None = None
    """PyTorch's float64 value of a checked segment where no program gives it (module
    level: its enclosing module call rerun)."""
    op_segments: Mapping[str, Sequence[NodeInfo]] | None = None
    """Op name -> its ONNX nodes: a check of one op's nodes told from one of several."""
    training: Collection[str] = ()
    """Module paths of mode-dependent modules left in training mode (a computation with
    no ONNX node there is PyTorch's mode)."""
    has_counterpart: Callable[[NodeInfo], bool] | None = None
    """Whether the reference has a node (default: the exporter made it)."""
