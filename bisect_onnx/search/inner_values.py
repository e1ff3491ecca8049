"""PyTorch's values of what failing segments compute inside them, by ONNX value name.

A segment's local check computes values the capture never had (inside a kernel ONNX
Runtime fused, between a TorchScript Linear's MatMul and Add); where the reference has
them, a node inside the segment can be checked on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.graph.provenance import Provenance
from bisect_onnx.pytorch.op_values import OpCapture
from bisect_onnx.runtime.sides import CapturedValue
from bisect_onnx.search.local import LocalCheck

if TYPE_CHECKING:
    from bisect_onnx.align.modules import CallIndex
    from bisect_onnx.runtime.runner import Runner
    from bisect_onnx.runtime.sides import Capture

__all__ = ["inner_references", "module_references"]


def inner_references(ops: OpCapture | None,
                     kernel_references: Mapping[str, CapturedValue] | None,
                     modules: tuple[Capture, CallIndex] | None,
                     checks: Mapping[str, LocalCheck], candidate: Runner,
                     candidate_values: Mapping[str, np.ndarray]) -> dict[str, CapturedValue]:
    """PyTorch's values of what the failing values' segments compute inside them."""
    inner = dict(ops.values) if ops is not None else dict(kernel_references or {})
    if modules is not None:
        # Module calls stand where no op is paired: a TorchScript trace's unknown ops, or
        # ops of a call traced alone, whose FX names are not the file's value names.
        inner = {**module_references(modules, checks, candidate, candidate_values), **inner}
    return inner


def module_references(modules: tuple[Capture, CallIndex], checks: Mapping[str, LocalCheck],
                      candidate: Runner, candidate_values: Mapping[str, np.ndarray],
                      ) -> dict[str, CapturedValue]:
    """PyTorch's module outputs by the ONNX values they align to, fused ones included.

    The module alignment is run again as if every value the culprits' nodes computed
    had been captured, so a module whose output lives inside a fused kernel is paired.
    """
    from bisect_onnx.align.modules import align_modules
    from bisect_onnx.graph.nodes import node_provenance

    capture, call_index = modules
    virtual = {name: CapturedValue(name, np.asarray(array), Provenance(position=0))
               for name, array in candidate_values.items()}
    for check in checks.values():
        for index in (check.segment.nodes if check.segment else ()):
            node = candidate.nodes[index]
            for output in node.outputs:
                if output in check.values and output not in virtual:
                    virtual[output] = CapturedValue(output, check.values[output],
                                                    node_provenance(node, 0))
    alignment = align_modules(capture, candidate.nodes, virtual, call_index=call_index)
    # Nested calls handing one value on (a Sequential whose last child is a conv layer)
    # share it: the innermost names where it was computed.
    found: dict[str, CapturedValue] = {}
    for pair in alignment.pairs:
        held = found.get(pair.candidate.name)
        if held is None or _depth(pair.reference.name) > _depth(held.name):
            found[pair.candidate.name] = pair.reference
    return found


def _depth(module: str) -> int:
    """How deep a module path is (``a.b.c``: 3); an input's ``(input)`` suffix aside."""
    return len(module.split(" ")[0].split("."))
