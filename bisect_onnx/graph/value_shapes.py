"""The shape and dtype of each value of an ONNX graph, as far as anything knows them.

Captured values say theirs exactly; the rest come from ONNX shape inference, which may
leave a dimension symbolic (``None``) or know nothing of a value at all (a Reshape to a
shape computed at run time): a value missing here has a shape nobody knows.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from bisect_onnx.runtime.sides import CapturedValue

__all__ = ["value_shapes"]

logger = logging.getLogger(__name__)


def value_shapes(model: Any, candidate_values: Mapping[str, CapturedValue],
                 ) -> dict[str, tuple[tuple[Any, ...], Any]]:
    """Value -> (shape, numpy dtype): captured values as they are, the rest inferred.

    A dimension shape inference leaves symbolic is ``None`` (it matches any size).
    """
    shapes: dict[str, tuple[tuple[Any, ...], Any]] = {}
    if model is not None:
        import onnx

        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception as error:  # a refinement: captured shapes still serve
            logger.info("no shape inference on the ONNX model: %s", error)
        else:
            for info in inferred.graph.value_info:
                tensor = info.type.tensor_type
                if not tensor.HasField("shape") or not tensor.elem_type:
                    continue
                dims = tuple(dim.dim_value if dim.HasField("dim_value") else None
                             for dim in tensor.shape.dim)
                dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
                shapes[info.name] = (dims, np.dtype(dtype))
    for name, value in candidate_values.items():
        shapes[name] = (value.array.shape, value.array.dtype)
    return shapes
