"""The decoder file's inputs and outputs, read off its graph without its weights.

A decode run steps PyTorch to the end before ONNX Runtime's session exists (so that
PyTorch's weights can be parked on disk while the session holds its copy: the weights
once, not twice). What the steps need from the file beforehand (the cache's names in
it, their heads and head size, the vocabulary a random prompt is drawn from) is read
off the graph alone (:func:`~bisect_onnx.graph.skeleton.load_skeleton`), as a session
would list its inputs and outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.decode.layout import CacheLayout, layout_of_names
from bisect_onnx.errors import InputError, UsageError, one_line

if TYPE_CHECKING:
    import onnx

    from bisect_onnx.decode.flat_cache import DecoderStep
    from bisect_onnx.decode.options import DecodeOptions

__all__ = ["Shapes", "FileGraph", "read_file_graph", "file_layout", "empty_cache",
           "static_dim"]

#: Each input's and output's shape as ONNX Runtime lists it: an int for a fixed size,
#: a name for a symbolic one, ``None`` for one the file leaves unsaid.
Shapes = dict[str, list]


@dataclass(frozen=True)
class FileGraph:
    """The file's graph without its weights' bytes, and what a session would list."""

    skeleton: onnx.ModelProto
    """The graph, its initializers without data: where the external ones lie (parking
    points PyTorch's tensors at them), never their values."""
    inputs: tuple[str, ...]
    """The inputs a session takes, in order (an initializer is not one)."""
    outputs: tuple[str, ...]
    shapes: Shapes


def read_file_graph(path: Path) -> FileGraph:
    """``path``'s inputs, outputs and shapes, its weights left unread.

    A file whose graph cannot be read (truncated, not ONNX) is refused in one line
    before PyTorch runs, as the one-forward comparison refuses it.
    """
    from bisect_onnx.graph.skeleton import load_skeleton

    try:
        skeleton = load_skeleton(path)
    except Exception as error:  # not an ONNX file: a protobuf error, say
        raise InputError(f"--onnx {path} is not a readable ONNX model ({type(error).__name__}: "
                         f"{one_line(error)}); pass the decoder's ONNX export") from error
    graph = skeleton.graph
    stored = {tensor.name for tensor in graph.initializer}
    inputs = [value for value in graph.input if value.name not in stored]
    return FileGraph(skeleton, tuple(value.name for value in inputs),
                     tuple(value.name for value in graph.output),
                     {value.name: _shape(value) for value in [*inputs, *graph.output]})


def _shape(value: onnx.ValueInfoProto) -> list:
    """As ``onnxruntime.NodeArg.shape`` gives it."""
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return []
    return [dim.dim_value if dim.HasField("dim_value")
            else dim.dim_param if dim.HasField("dim_param") else None
            for dim in tensor.shape.dim]


def file_layout(step: DecoderStep, graph: FileGraph, decode: DecodeOptions) -> CacheLayout:
    """The cache's layout in a file exported elsewhere, read off its names."""
    layout = layout_of_names(list(graph.inputs), list(graph.outputs), decode.cache_names)
    if step.cache_tails is not None and len(step.cache_tails) != layout.layers:
        raise UsageError(f"the ONNX file carries the cache of {layout.layers} layers and "
                         f"{step.name} that of {len(step.cache_tails)}; pass the export of "
                         "this model (or map its names with --cache-name)")
    if step.cache_tails is not None:
        _check_cache_shapes(step, layout, graph.shapes)
    return layout


def _check_cache_shapes(step: DecoderStep, layout: CacheLayout, shapes: Shapes) -> None:
    """Refuse a file whose cache has other heads or head size than the model's.

    Another model's export, which ONNX Runtime would refuse at the first step, naming
    only the indices of the input's shape.
    """
    for layer, (names, tails) in enumerate(zip(layout.past, step.cache_tails or (),
                                               strict=True)):
        for name, tail in zip(names, tails, strict=True):
            found = (static_dim(shapes, name, 1), *(static_dim(shapes, name, axis)
                                                     for axis in range(3, 2 + len(tail))))
            if None not in found and found != tuple(tail):
                raise UsageError(
                    f"the ONNX file's {name} is [batch, {found[0]}, past, "
                    f"{', '.join(map(str, found[1:]))}] and {step.name}'s layer {layer} "
                    f"cache is [batch, {tail[0]}, past, {', '.join(map(str, tail[1:]))}]; "
                    "pass the export of this model")


def empty_cache(step: DecoderStep, shapes: Shapes, layout: CacheLayout,
                batch: int) -> tuple[np.ndarray, ...]:
    """Each layer's key and value with no positions yet, for the prefill."""
    tails = step.cache_tails
    if tails is None:
        tails = tuple((_tail_of(shapes, key), _tail_of(shapes, value))
                      for key, value in layout.past)
    return tuple(np.zeros((batch, tail[0], 0, *tail[1:]), dtype=np.float32)
                 for pair in tails for tail in pair)


def _tail_of(shapes: Shapes, name: str) -> tuple[int, ...]:
    heads, dim = static_dim(shapes, name, 1), static_dim(shapes, name, 3)
    if heads is None or dim is None:
        raise UsageError(f"the ONNX input {name} has no fixed heads and head size; pass "
                         "cache_shape=(layers, heads, head_dim) (--cache-shape L,H,D)")
    return (heads, dim)


def static_dim(shapes: Shapes, name: str, axis: int) -> int | None:
    """A fixed size of the file's input or output ``name`` (``None``: symbolic)."""
    shape = shapes.get(name) or []
    size = shape[axis] if -len(shape) <= axis < len(shape) else None
    return size if isinstance(size, int) and size > 0 else None
