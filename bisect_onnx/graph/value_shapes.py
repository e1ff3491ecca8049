"""The shape and dtype of each value of an ONNX graph, as far as anything knows them.

Captured values say theirs exactly; the rest come from ONNX shape inference (with data
propagation, which computes a Reshape's target from ``Shape`` nodes), which may still
leave a dimension symbolic (``None``) or know nothing of a value at all (a shape it
cannot propagate): a value missing here has a shape nobody knows.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.runtime.sides import CapturedValue

if TYPE_CHECKING:
    import onnx

__all__ = ["value_shapes"]

logger = logging.getLogger(__name__)


def value_shapes(model: onnx.ModelProto | None, candidate_values: Mapping[str, CapturedValue],
                 ) -> dict[str, tuple[tuple[int | None, ...], np.dtype]]:
    """Value -> (shape, numpy dtype): captured values as they are, the rest inferred.

    A dimension shape inference leaves symbolic is ``None`` (it matches any size).
    """
    shapes: dict[str, tuple[tuple[int | None, ...], np.dtype]] = {}
    if model is not None:
        import onnx

        inferred = _inferred(model)
        if inferred is not None:
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


def _inferred(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """``model`` with ONNX shape inference's value infos, or ``None`` where it fails.

    With data propagation first: a TorchScript export reshapes by shapes it computes
    from ``Shape`` nodes, which plain inference leaves unknown (Swin's attention: 405 of
    499 values known, 435 with it), and a value of unknown shape may pair with any op
    (a capture that holds few values, as OpenVINO's, leaves many to inference).
    """
    import onnx

    for data_prop in (True, False):
        try:
            return onnx.shape_inference.infer_shapes(model, data_prop=data_prop)
        except Exception as error:  # a refinement: captured shapes still serve
            logger.info("no shape inference on the ONNX model (data_prop=%s): %s",
                        data_prop, error)
    return None
