"""Random inputs made from the ONNX graph's input specification, when none are given.

Inputs are reproducible: sample ``k`` of seed ``s`` is the same array on every
run and machine, and different samples differ. Free dimensions come from
``--dim NAME=VALUE``; integer inputs stay inside the range their use allows
(an embedding's vocabulary, 0/1 for masks), because an out-of-range token id
is an error in PyTorch and undefined behaviour in ONNX Runtime, not a divergence.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.errors import InputError, UsageError
from bisect_onnx.sources.input_sizes import Budget, array_bytes, input_budget

if TYPE_CHECKING:
    import onnx

    from bisect_onnx.runtime.input_specs import InputSpec

__all__ = ["synthesize_inputs", "parse_dim_options", "vocabulary_limits"]

# Upper bound (exclusive) for integer inputs whose range the graph does not reveal:
# token ids must stay below the vocabulary size, and 100 is below any real vocabulary
# while still giving varied ids. vocabulary_limits finds the real bound when it can.
DEFAULT_INT_HIGH = 100
# Attention masks and segment ids are 0/1 in every model that takes them.
BINARY_INT_HIGH = 2
_BINARY_NAMES = ("token_type_ids",)

# Ops that move or copy index values without changing them, between a graph input
# and the Gather that looks them up (a Cast to int64, an Unsqueeze for a batch axis).
_INDEX_PRESERVING = frozenset({"Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze",
                               "Flatten", "Expand", "Transpose"})
_ONNX_DOMAINS = ("", "ai.onnx")


def synthesize_inputs(
    specs: Sequence[InputSpec],
    *,
    seed: int = 0,
    dims: Mapping[str, int] | None = None,
    sample: int = 0,
    int_high: Mapping[str, int] | None = None,
    budget: Budget | None = None,
) -> list[np.ndarray]:
    """One random array per graph input, in the graph's order.

    Floats are standard normal, booleans fair coin flips, integers uniform in
    ``[0, high)`` with ``high`` from ``int_high[name]`` or a default by name
    (2 for ``token_type_ids``, else ``DEFAULT_INT_HIGH``); a mask (by name) is ones for a
    random length of at least one, then zeros, as a padded batch's. Free
    dimensions take their value from ``dims[dim_param]``. The arrays' size is checked
    against ``budget`` (by default most of the memory available) before any is made.
    """
    dims = dict(dims or {})
    int_high = dict(int_high or {})
    for label, value in (("seed", seed), ("sample", sample)):
        if not _is_int(value) or value < 0:
            raise UsageError(f"{label} is {value!r}; it must be a non-negative integer")
    for name, value in dims.items():
        if not _is_int(value) or value < 1:
            raise UsageError(f"--dim {name}={value!r}: the value must be a positive integer")
    for name, value in int_high.items():
        if not _is_int(value) or value < 1:
            raise UsageError(f"the integer range of input {name!r} is {value!r}; "
                             "it must be a positive integer (the exclusive upper bound)")
    _check_dim_names(specs, dims)
    unset = list(dict.fromkeys(name for _, _, name in _free_dims(specs)
                               if name and name not in dims))
    shapes = [_concrete_shape(spec, dims, unset) for spec in specs]
    _check_size(specs, shapes, dims, budget or input_budget())
    # One generator per (seed, sample): sample k is reproducible on its own.
    rng = np.random.default_rng([seed, sample])
    return [_random_array(rng, spec, shape, int_high) for spec, shape in zip(specs, shapes,
                                                                             strict=True)]


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _free_dims(specs: Sequence[InputSpec]) -> Iterator[tuple[InputSpec, int, str | None]]:
    for spec in specs:
        for axis, dim in enumerate(spec.shape or ()):
            if not isinstance(dim, int):
                yield spec, axis, dim


def _check_dim_names(specs: Sequence[InputSpec], dims: Mapping[str, int]) -> None:
    """Refuse a ``--dim`` that names no free dimension: most likely a typo."""
    named = list(dict.fromkeys(name for _, _, name in _free_dims(specs) if name))
    unknown = [name for name in dims if name not in named]
    if unknown:
        choices = ", ".join(named) if named else "none: every dimension is fixed"
        raise UsageError(f"--dim {', '.join(unknown)} names no free dimension of the ONNX "
                         f"inputs; the free dimensions are: {choices}")


def _concrete_shape(spec: InputSpec, dims: Mapping[str, int],
                    unset: Sequence[str]) -> tuple[int, ...]:
    if spec.shape is None:
        raise InputError(f"input {spec.name!r} has no shape in the ONNX graph, so no random "
                         "input can be made for it; pass --input with real data")
    shape = []
    for axis, dim in enumerate(spec.shape):
        if isinstance(dim, int):
            shape.append(dim)
        elif dim is None:
            raise InputError(f"input {spec.name!r} axis {axis} is a free dimension without a "
                             "name, so --dim cannot set it; pass --input with real data")
        elif dim in dims:
            shape.append(dims[dim])
        else:
            others = [name for name in unset if name != dim]
            also = f" (also unset: {', '.join(others)})" if others else ""
            raise InputError(f"input {spec.name!r} axis {axis} is the free dimension {dim!r}; "
                             f"set it with --dim {dim}=VALUE{also}")
    return tuple(shape)


def _check_size(specs: Sequence[InputSpec], shapes: Sequence[tuple[int, ...]],
                dims: Mapping[str, int], budget: Budget) -> None:
    """Refuse inputs that would not fit, from their shapes alone.

    Floats are drawn as float64 and then cast, so the largest draw counts as well.
    """
    sizes = [array_bytes(shape, spec.dtype) for spec, shape in zip(specs, shapes, strict=True)]
    drawing = [array_bytes(shape, np.float64) if np.dtype(spec.dtype).kind in "fcb" else 0
               for spec, shape in zip(specs, shapes, strict=True)]
    if not sizes:
        return
    largest = max(range(len(sizes)), key=sizes.__getitem__)
    spec, shape = specs[largest], shapes[largest]
    given = " ".join(f"--dim {name}={value}" for name, value in dims.items())
    budget.check(sum(sizes) + max(drawing),
                 f"random inputs of these shapes ({spec.name!r} is {np.dtype(spec.dtype)} "
                 f"{list(shape)}{', from ' + given if given else ''})",
                 "choose smaller --dim values, or pass --input with real data")


def _random_array(rng: np.random.Generator, spec: InputSpec, shape: tuple[int, ...],
                  int_high: Mapping[str, int]) -> np.ndarray:
    dtype = np.dtype(spec.dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if _is_mask(spec.name, shape) and spec.name not in int_high and dtype.kind in "biu":
        return _padding_mask(rng, shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        high = min(int_high.get(spec.name, _default_int_high(spec.name)),
                   int(np.iinfo(dtype).max) + 1)
        return rng.integers(0, high, size=shape, dtype=dtype)
    raise InputError(f"input {spec.name!r} has dtype {dtype}, for which no random input is "
                     "made; pass --input with real data")


def _is_mask(name: str, shape: tuple[int, ...]) -> bool:
    return "mask" in name.lower() and len(shape) >= 1 and shape[-1] > 0


def _padding_mask(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Ones for a random length of at least one, then zeros: a padded batch's mask.

    Coin flips would mask every key of some query (the first position masked, with a
    causal mask): a softmax over nothing, which PyTorch and ONNX Runtime fill in
    differently, a divergence no real input has.
    """
    lengths = rng.integers(1, shape[-1] + 1, size=shape[:-1])
    return np.arange(shape[-1]) < np.asarray(lengths)[..., None]


def _default_int_high(name: str) -> int:
    lowered = name.lower()
    if "mask" in lowered or lowered in _BINARY_NAMES:
        return BINARY_INT_HIGH
    return DEFAULT_INT_HIGH


def parse_dim_options(items: Sequence[str]) -> dict[str, int]:
    """``["batch=2", "seq=16"]`` -> ``{"batch": 2, "seq": 16}``; the CLI's ``--dim``."""
    dims: dict[str, int] = {}
    for item in items:
        name, equals, text = (part.strip() for part in item.partition("="))
        if not equals or not name:
            raise UsageError(f"--dim {item!r} is not NAME=VALUE (for example --dim batch=2)")
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise UsageError(f"--dim {item!r}: VALUE must be a positive integer, "
                             f"got {text!r}")
        if dims.get(name, value) != value:
            raise UsageError(f"--dim {name} is given twice, as {dims[name]} and {value}; "
                             "give it once")
        dims[name] = value
    return dims


def vocabulary_limits(model: onnx.ModelProto) -> dict[str, int]:
    """Exclusive upper bounds for integer graph inputs used as embedding indices.

    An embedding lookup exports as ``Gather(table, ids)`` with the table an
    initializer (or a Constant); ids must be below the table's size along the
    gather axis. Inputs reaching the indices through index-preserving ops (a
    Cast, an Unsqueeze) count; with several lookups, the smallest table wins.
    Only the top-level graph is read.
    """
    import onnx

    graph = model.graph
    tables = {tensor.name: tuple(tensor.dims) for tensor in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            for attribute in node.attribute:
                if attribute.name == "value" and attribute.type == onnx.AttributeProto.TENSOR:
                    tables[node.output[0]] = tuple(attribute.t.dims)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    limits = {}
    for value in graph.input:
        if value.name in tables or not _is_integer_input(value):
            continue
        bounds = list(_gather_bounds(value.name, consumers, tables))
        if bounds:
            limits[value.name] = min(bounds)
    return limits


def _is_integer_input(value: onnx.ValueInfoProto) -> bool:
    import onnx

    if not value.type.HasField("tensor_type"):
        return False
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
    except (KeyError, ValueError, TypeError):
        return False
    return dtype.kind in "iu"


def _gather_bounds(start: str, consumers: Mapping[str, list[onnx.NodeProto]],
                   tables: Mapping[str, tuple[int, ...]]) -> Iterator[int]:
    """Table sizes of the Gathers whose indices are ``start``'s values."""
    seen = {start}
    pending = [start]
    while pending:
        name = pending.pop()
        for node in consumers.get(name, ()):
            if node.domain not in _ONNX_DOMAINS:
                continue
            if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == name:
                table = tables.get(node.input[0])
                if table:
                    axis = _gather_axis(node)
                    if -len(table) <= axis < len(table) and table[axis] > 0:
                        yield table[axis]
            elif (node.op_type in _INDEX_PRESERVING and node.input[0] == name
                  and node.output and node.output[0] not in seen):
                seen.add(node.output[0])
                pending.append(node.output[0])


def _gather_axis(node: onnx.NodeProto) -> int:
    for attribute in node.attribute:
        if attribute.name == "axis":
            return attribute.i
    return 0
