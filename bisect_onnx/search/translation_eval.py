"""The exporter's translation of one op, evaluated on PyTorch's values without tracing.

To look inside a multi-node op (``aten.linear`` is MatMul then Add) the op's fresh
translation is run on PyTorch's values and compared node by node with the file's
(:mod:`bisect_onnx.search.decomposition`). Exporting the op alone for that traces it
with ``torch.export`` and builds the exporter's registry: seconds, in a process that
has not exported yet. Where the file's metadata names the op and its arguments (the
FX node it was made from), the exporter's own translation function (onnxscript's
torch_lib) is called directly instead, in onnxscript's eager mode, each ONNX op it
emits recorded with its inputs and outputs: the same nodes, in a fraction of a second.

Only an op whose arguments the metadata gives exactly is evaluated: tensors are the
values it read (by ONNX name) or the model's weights (by their FX placeholder names),
the rest Python literals. Anything else (a dtype, a device, a function that does not
run eagerly) raises :class:`CannotEvaluate`, and the caller traces as before.
"""

from __future__ import annotations

import ast
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from bisect_onnx.pytorch.op_alone import Translation
from bisect_onnx.pytorch.private_apis import (
    PrivateApiMissing,
    recording_evaluator,
    torch_translations,
    torchlib_translations,
)

__all__ = ["CannotEvaluate", "OpCall", "parse_op_call", "evaluate_translation"]

logger = logging.getLogger(__name__)

_CALL = re.compile(r"call_function\[target=torch\.ops\.(?P<target>[\w.]+)\]"
                   r"\(args = (?P<args>.*), kwargs = (?P<kwargs>\{.*\})\)\s*$", re.DOTALL)
_REFERENCE = re.compile(r"%(\w+)")
_MARK = "\x00"  # no literal of an FX node's text holds it: it marks a node reference


class CannotEvaluate(Exception):
    """The op's translation cannot be evaluated exactly here; the message says why."""


class OpCall:
    """One FX op as the file's metadata gives it: its target and its arguments."""

    def __init__(self, target: str, args: tuple, kwargs: dict) -> None:
        self.target, self.args, self.kwargs = target, args, kwargs

    def references(self) -> list[str]:
        """The FX nodes (values, weights) it reads, in order."""
        found: list[str] = []
        _walk((self.args, self.kwargs), lambda name: found.append(name) or name)
        return found


def parse_op_call(node_text: str) -> OpCall:
    """``%linear_5 : ... = call_function[target=torch.ops.aten.linear.default](args = ...)``."""
    match = _CALL.search(node_text.split(" = ", 1)[-1])
    if match is None:
        raise CannotEvaluate("the file does not say which op call the node was made from")
    marked = {part: _REFERENCE.sub(lambda ref: repr(_MARK + ref[1]), match[part])
              for part in ("args", "kwargs")}
    try:
        args, kwargs = ast.literal_eval(marked["args"]), ast.literal_eval(marked["kwargs"])
    except (ValueError, SyntaxError) as error:
        raise CannotEvaluate(f"an argument of {match['target']} is not a literal") from error
    return OpCall(match["target"], args if isinstance(args, tuple) else (args,), kwargs)


def _walk(item: Any, resolve: Callable[[str], Any]) -> Any:
    """``item`` with every node reference replaced by ``resolve(name)``."""
    if isinstance(item, str) and item.startswith(_MARK):
        return resolve(item[1:])
    if isinstance(item, (tuple, list)):
        return type(item)(_walk(part, resolve) for part in item)
    if isinstance(item, dict):
        return {key: _walk(value, resolve) for key, value in item.items()}
    return item


def evaluate_translation(call: OpCall, arrays: Mapping[str, np.ndarray]) -> Translation:
    """The exporter's translation of ``call`` run on ``arrays`` (by FX reference).

    Returns the ONNX nodes it emitted (their values named ``fresh_<k>``, its inputs by
    their references) and every value by name: what exporting the op alone gives
    (:func:`bisect_onnx.pytorch.op_alone.export_alone`), without the export.
    """
    function = _translation_of(call.target)
    names: dict[int, str] = {}
    values: dict[str, np.ndarray] = {}

    def resolve(name: str) -> np.ndarray:
        if name not in arrays:
            raise CannotEvaluate(f"no value of {name}, which {call.target} reads")
        array = np.asarray(arrays[name])
        names[id(array)] = name
        values[name] = array
        return array

    args, kwargs = _walk(call.args, resolve), _walk(call.kwargs, resolve)
    recorder = _recording_evaluator(names, values)
    from onnxscript import evaluator

    try:
        with evaluator.default_as(recorder):
            function(*args, **kwargs)
    except Exception as error:  # onnxscript's eager mode: any failure means "cannot"
        raise CannotEvaluate(f"{call.target}'s translation does not run eagerly: "
                             f"{type(error).__name__}") from error
    return Translation(recorder.nodes, values)


def _translation_of(target: str) -> Callable[..., object]:
    """The exporter's function for ``aten.linear.default``: torch's own first, then torch_lib."""
    try:
        own = torch_translations(target)
        if not own:
            namespace, _, rest = target.partition(".")
            name, _, overload = rest.rpartition(".")
            own = torchlib_translations(
                f"{namespace}::{name}" + ("" if overload == "default" else f".{overload}"))
    except PrivateApiMissing as error:
        raise CannotEvaluate(str(error)) from error
    if len(own) != 1:
        raise CannotEvaluate(f"the exporter has {len(own)} translations of {target}")
    return own[0]


def _recording_evaluator(names: dict[int, str], values: dict[str, np.ndarray]) -> Any:
    """An ONNX Runtime eager evaluator that keeps each op it runs as an ONNX node (``.nodes``)."""
    import onnx

    nodes: list[onnx.NodeProto] = []
    kept: list[Any] = []  # alive, so that no id is reused

    def record(schema: Any, inputs: Any, attributes: Any, outputs: Any) -> None:
        read = []
        for item in inputs:
            array = getattr(item, "value", item)
            if array is None:
                read.append("")
                continue
            if id(array) not in names:
                names[id(array)] = f"fresh_{len(names)}"
                values[names[id(array)]] = np.asarray(array)
            read.append(names[id(array)])
            kept.append(array)
        made = []
        for item in outputs:
            array = getattr(item, "value", item)
            names[id(array)] = name = f"fresh_{len(names)}"
            values[name] = np.asarray(array)
            made.append(name)
            kept.append(array)
        nodes.append(onnx.helper.make_node(
            schema.name, read, made, domain=schema.domain, **dict(attributes)))

    try:
        recorder = recording_evaluator(record)
    except PrivateApiMissing as error:
        raise CannotEvaluate(str(error)) from error
    recorder.nodes, recorder.kept = nodes, kept
    return recorder
