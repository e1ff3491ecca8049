"""The memory budget: how big a full capture would be, and how much may be used.

A full capture holds every compared value twice (PyTorch's and ONNX Runtime's). Its
size is known before anything runs: ONNX shape inference with the actual input
shapes gives every value's shape and dtype. When both sides would not fit in the
budget (``--max-memory``, by default most of the memory available now), values are
probed a few at a time instead (:mod:`bisect_onnx.search.probes`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.errors import UsageError

if TYPE_CHECKING:
    import onnx

__all__ = ["parse_size", "available_memory", "default_budget", "estimate_values_bytes",
           "format_size"]

logger = logging.getLogger(__name__)

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 10**3, "kib": 1 << 10, "m": 1 << 20,
          "mb": 10**6, "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30,
          "t": 1 << 40, "tb": 10**12, "tib": 1 << 40}
# Of the memory available when the capture starts, the share a capture may take: the
# rest is left to ONNX Runtime's arenas and the process around it.
_AVAILABLE_SHARE = 0.8


def parse_size(text: str | int) -> int:
    """``"2GB"``, ``"512MiB"``, ``"1.5g"`` or a number of bytes, as bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise UsageError(f"a memory size must be positive, got {text}")
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise UsageError(f"cannot read {text!r} as a memory size; write bytes or a number "
                         "with a unit, such as 512MB or 2GiB")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise UsageError(f"a memory size must be at least one byte, got {text!r}")
    return size


def format_size(size: int) -> str:
    """Bytes for people: ``1.5 GiB``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def available_memory() -> int | None:
    """Memory available to new allocations now (Linux ``MemAvailable``), if known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_budget() -> int | None:
    """Most of the memory available now; ``None`` (no limit) where it cannot be read."""
    available = available_memory()
    return int(available * _AVAILABLE_SHARE) if available is not None else None


def estimate_values_bytes(model: onnx.ModelProto, inputs: Sequence[np.ndarray]) -> int | None:
    """Bytes of every node output of ``model`` on inputs of these shapes (one side).

    Shape inference runs on a skeleton of the graph (weights as typed inputs, not
    copied), so a model of any size costs only its nodes. Values whose shape stays
    unknown count as the median of the known ones, not their mean: a decoder's known
    values include its tied embedding transposed (262 MB beside activations of
    256 KB), and a mean made a 3-billion-parameter decoder's 1 GB look like 42 GB.
    ``None`` when no shape is known.
    """
    import onnx

    graph = model.graph
    initializers = {tensor.name for tensor in graph.initializer}
    graph_inputs = [value for value in graph.input if value.name not in initializers]
    fixed = [onnx.helper.make_tensor_value_info(value.name,
                                                value.type.tensor_type.elem_type,
                                                list(array.shape))
             for value, array in zip(graph_inputs, inputs, strict=False)]
    weights = [onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type,
                                                  list(tensor.dims))
               for tensor in graph.initializer]
    # The outputs' declared shapes are the export's, not these inputs': left to inference.
    outputs = [onnx.helper.make_tensor_value_info(value.name,
                                                  value.type.tensor_type.elem_type, None)
               for value in graph.output]
    skeleton = onnx.helper.make_model(
        onnx.helper.make_graph(graph.node, graph.name or "graph", fixed + weights, outputs),
        opset_imports=model.opset_import, ir_version=model.ir_version)
    skeleton.functions.extend(model.functions)
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, data_prop=True)
    except Exception as error:  # an op shape inference does not know, say
        logger.info("shape inference failed (%s): estimating from the graph's own shapes",
                    error)
        inferred = model
    sizes = {value.name: _bytes(value) for value in [*inferred.graph.value_info,
                                                     *inferred.graph.output]}
    names = [name for node in graph.node if node.op_type != "Constant"
             for name in node.output if name]
    known = [sizes[name] for name in names if sizes.get(name) is not None]
    if not known:
        return None
    return sum(known) + round(float(np.median(known))) * (len(names) - len(known))


def _bytes(value: onnx.ValueInfoProto) -> int | None:
    import onnx

    tensor = value.type.tensor_type
    if not tensor.HasField("shape") or not tensor.elem_type:
        return None
    dims = [dim.dim_value if dim.HasField("dim_value") else None for dim in tensor.shape.dim]
    if any(dim is None for dim in dims):
        return None
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    return int(np.prod(dims, dtype=np.int64)) * itemsize
