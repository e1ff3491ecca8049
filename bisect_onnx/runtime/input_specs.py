"""The inputs an ONNX graph must be fed: names, dtypes, dimensions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

__all__ = ["InputSpec", "input_specs"]


@dataclass(frozen=True)
class InputSpec:
    """One graph input: name, numpy dtype, and dimensions (``None`` or a name when free)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...] | None

    def __str__(self) -> str:
        if self.shape is None:
            return f"{self.name}: {self.dtype}[?]"
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"


def input_specs(graph: onnx.GraphProto) -> list[InputSpec]:
    """The inputs a graph must be fed: its inputs that no initializer provides."""
    initializers = {init.name for init in graph.initializer}
    return [_input_spec(value) for value in graph.input if value.name not in initializers]


def _input_spec(value: onnx.ValueInfoProto) -> InputSpec:
    import onnx

    tensor_type = value.type.tensor_type
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
    if not tensor_type.HasField("shape"):
        return InputSpec(value.name, dtype, None)
    dims = [dim.dim_value if dim.HasField("dim_value") else dim.dim_param or None
            for dim in tensor_type.shape.dim]
    return InputSpec(value.name, dtype, tuple(dims))
