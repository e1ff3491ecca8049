"""The op-level reference for a TorchScript export: every ATen value of the traced graph.

The TorchScript exporter translates the graph ``torch.jit.trace`` records. Its ONNX
nodes carry the module scope in their names (``/fc1/MatMul``) but not the op they
were made from, so op-level alignment (:mod:`bisect_onnx.align.script_ops`) pairs
them by scope, op and order. This module gives it the other side: the traced graph
run once with every ATen value returned (the instrumentation
:mod:`bisect_onnx.pytorch.script_side` uses for module calls), each value with its
ATen kind, the module it ran in, the source line that made it, and how to call its op
alone (for looking inside a multi-node op, :mod:`bisect_onnx.align.script_inside`).

Shape arithmetic that tracing records as tensors (``size * heads``) is left out: the
exporter folds it into constants, and no one debugs it.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from bisect_onnx.chatter import chatter_logged
from bisect_onnx.errors import ModelError, one_line
from bisect_onnx.graph.provenance import Provenance, user_source
from bisect_onnx.pytorch.calls import call_name
from bisect_onnx.pytorch.module_side import buffers_restored, describe_arrays, to_numpy, to_tensor
from bisect_onnx.pytorch.op_values import OpCapture
from bisect_onnx.pytorch.script_exported import ExporterRecords, InputSource
from bisect_onnx.pytorch.script_side import (
    TopLevel,
    call_numbers,
    instrument_values,
    module_paths_of,
    run_instrumented,
)
from bisect_onnx.runtime.sides import CapturedValue

if TYPE_CHECKING:
    import torch

    from bisect_onnx.graph.provenance import SourceLocation

__all__ = ["ScriptOp", "ScriptOpCapture", "Argument", "capture_script_ops", "trace_script",
           "branches"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Argument:
    """One argument of a traced op: another op's value, a weight, or a literal."""

    source: str
    """``value`` (``value`` names an op or a graph input), ``weight`` (a tensor of the
    model, or a list of them: a recurrent op's) or ``constant`` (a literal: a number, a
    list of them, ``None``)."""
    value: Any
    """By ``source``: the value's name (a ``str``), the tensor, or the literal, whose type
    only the op's schema says (its readers take each by position)."""
    keyword: str | None = None
    """The parameter's name where the op takes it by keyword only (SDPA's ``scale``)."""


@dataclass(frozen=True)
class ScriptOp:
    """One ATen op of the traced graph whose value is data (computed from the inputs)."""

    name: str
    """``linear``, ``linear_1``, ...: named like the dynamo exporter's FX nodes."""
    kind: str
    """The ATen op, ``aten::linear``."""
    module: str
    """The innermost module it ran in; ``""`` for an op in the model's own ``forward``."""
    arguments: tuple[Argument, ...] | None
    """How to call it alone; ``None`` where an argument is none of the three kinds."""
    output: int = 0
    """Which of the op's outputs this value is: an op with several (``topk``'s values
    and indices) has one entry per output, named ``topk[0]``, ``topk[1]``..."""
    outputs: int = 1
    """How many outputs the op has; its entries follow one another in graph order."""
    overload: str = ""
    """The schema's overload (``Tensor_mode``: a ``div`` with a rounding mode); ``""``
    where the traced node has no schema."""


@dataclass
class ScriptOpCapture(OpCapture):
    """Every data value of a traced graph on one input, by op name, with the ops."""

    ops: list[ScriptOp] = field(default_factory=list)
    """The data ops, in graph order (the values' keys are their names)."""
    module_paths: tuple[str, ...] = ()
    """Every submodule path of the model (scopes in ONNX node names resolve to them)."""
    records: ExporterRecords = field(default_factory=ExporterRecords)
    """What the TorchScript exporter makes of each op (by name), asked on first use."""
    fixed_ops: list[ScriptOp] = field(default_factory=list)
    """The ATen ops no input's value reaches (BiT's Conv weight standardized, position
    ids made from a tensor of the input's size), in graph order, named
    ``fixed.batch_norm``...: the same on any input, so never compared, but the file
    may compute them at run time (see ``constant_references``)."""
    fixed_values: dict[str, CapturedValue] = field(default_factory=dict)
    """The value of each of ``fixed_ops``, by its name."""
    constant_references: dict[str, CapturedValue] = field(default_factory=dict)
    """PyTorch's value of each op made from sizes or weights alone, by the ONNX value
    that holds it where the file computes it at run time: set by op alignment
    (:mod:`bisect_onnx.align.script_constants`), checked inside failing segments only."""


def trace_script(module: torch.nn.Module,
                 arrays: Sequence[np.ndarray]) -> torch.jit.ScriptModule:
    """``torch.jit.trace`` the module on ``arrays``, as the TorchScript exporter does."""
    import torch

    # Tracing reads every attribute of every module (transformers' models log from
    # properties such as `loss_function`): what they print and log is for the log.
    try:  # tracing runs the module: a training-mode BatchNorm's statistics are put back
        with chatter_logged("torch.jit.trace", native=True), warnings.catch_warnings(), \
                buffers_restored(module), torch.no_grad():
            warnings.simplefilter("ignore")  # TracerWarnings: the exporter traced the same
            return torch.jit.trace(module, tuple(to_tensor(array) for array in arrays),
                                   check_trace=False)
    except Exception as error:
        raise ModelError(f"torch.jit.trace failed on inputs {describe_arrays(arrays)}: "
                         f"{type(error).__name__}: {one_line(error)}") from error


def branches(model: torch.jit.ScriptModule) -> bool:
    """Whether ``model``'s graph runs ATen ops inside control flow (a scripted ``if``).

    Those ops are not promotable, and the graph is not the one a trace (and so the
    exporter) would record: op-level pairing would compare a fraction of the model.
    """
    return any(inner.kind().startswith("aten::")
               for node in model.inlined_graph.nodes() for block in node.blocks()
               for inner in block.nodes())


def capture_script_ops(model: torch.jit.ScriptModule, arrays: Sequence[np.ndarray],
                       aliases: Mapping[str, str] | None = None) -> ScriptOpCapture:
    """Run a traced or scripted ``model`` on ``arrays``; every data op's value, in order.

    ``aliases``: the traced module's paths registered twice (see ``instrument_values``).
    """
    graph, found = instrument_values(model, aliases)
    results = run_instrumented(model, graph, arrays)
    captured = cast("tuple[torch.Tensor, ...]", results[1:])  # TopLevel.values' tensors
    inputs = list(graph.inputs())[1:]  # the first is the module itself
    names = {value.debugName(): f"input_{index}" for index, value in enumerate(inputs)}
    capture = ScriptOpCapture(values={}, module_paths=tuple(found.paths), graph_inputs={
        f"input_{index}": np.asarray(array) for index, array in enumerate(arrays)})
    data = set(names)
    # Tensors the graph computes from weights alone (a relative position bias): the same
    # on any input, so an op reading one is called alone with it as a weight.
    computed = {debug_name: captured[index] for made in found.outputs_of.values()
                for debug_name, index in made}
    calls = call_numbers(model, found)
    counts: dict[str, int] = {}
    fixed_names: dict[str, str] = {}  # the trace's name of a fixed op's value -> the op's
    for position, node in enumerate(found.nodes):
        reads = [item.debugName() for value in node.inputs() for item in _held(value)]
        if node.kind() in _NOT_DATA or node.kind() in _CONTAINERS:
            continue
        if not any(read in data for read in reads):
            made = found.outputs_of.get(position, [])
            _record_fixed_op(capture, node, found, calls.get(position, {}),
                             [captured[index] for _, index in made], fixed_names, reads)
            continue
        data.update(value.debugName() for value in node.outputs())
        made = found.outputs_of.get(position, [])
        if not made or len(made) != len(list(node.outputs())):
            continue  # an output that is no tensor (chunk's list): not values to compare
        short = node.kind().split("::", 1)[-1]
        name = short if short not in counts else f"{short}_{counts[short]}"
        counts[short] = counts.get(short, 0) + 1
        # Named like module calls with several outputs: every output by its index.
        for output, (debug_name, _) in enumerate(made):
            names[debug_name] = f"{name}[{output}]" if len(made) > 1 else name
        arguments = _arguments(node, names, model, computed, data)
        for output, (debug_name, index) in enumerate(made):
            op = ScriptOp(names[debug_name], node.kind(), _innermost(node, found), arguments,
                          output=output, outputs=len(made), overload=_overload(node))
            capture.records.add(op.name, node, _sources(names, model, computed, data))
            _record(capture, op, reads, names, captured[index], _provenance(
                node, op, found, calls.get(position, {}), len(capture.values)))
    logger.info("recorded %d op values of the traced graph", len(capture.values))
    return capture


#: A value no input reaches larger than this is not kept (a model's re-laid-out
#: embedding): the search checks the nodes that compute it without it.
_FIXED_VALUE_BYTES = 16 << 20


def _record_fixed_op(capture: ScriptOpCapture, node: torch.Node, found: TopLevel,
                     calls: dict[str, int], made: Sequence[torch.Tensor],
                     fixed_names: dict[str, str], reads: Sequence[str]) -> None:
    """Keep the value of an ATen op no input reaches, where it is one tensor.

    ``fixed_names``: the trace's value names of the fixed ops so far (added to; ``""``
    for a value not kept, which an op reading it cannot be checked by);
    ``reads``: the trace's names of the values ``node`` reads.
    """
    if not node.kind().startswith("aten::"):
        return  # a literal, a weight read, a list: what reads it reads the weights
    if len(made) != 1 or len(list(node.outputs())) != 1 or made[0].nbytes > _FIXED_VALUE_BYTES:
        fixed_names.update({output.debugName(): "" for output in node.outputs()})
        return
    short = node.kind().split("::", 1)[-1]
    count = sum(op.kind == node.kind() for op in capture.fixed_ops)
    name = f"fixed.{short}" if not count else f"fixed.{short}_{count}"
    op = ScriptOp(name, node.kind(), _innermost(node, found), None)
    capture.fixed_ops.append(op)
    capture.fixed_values[name] = CapturedValue(name, to_numpy(made[0]), _provenance(
        node, op, found, calls, len(capture.values)))
    capture.inputs_of[name] = tuple(fixed_names[read] for read in reads if read in fixed_names)
    fixed_names[next(iter(node.outputs())).debugName()] = name


def _record(capture: ScriptOpCapture, op: ScriptOp, reads: Sequence[str],
            names: dict[str, str], value: torch.Tensor, provenance: Provenance) -> None:
    """Add one op value to ``capture``, with the values it reads and their readers."""
    capture.ops.append(op)
    capture.op_names[op.name] = f"aten.{op.kind.split('::', 1)[-1]}"
    capture.inputs_of[op.name] = tuple(names[read] for read in reads if read in names)
    for source in capture.inputs_of[op.name]:
        capture.users_of[source] = (*capture.users_of.get(source, ()), op.name)
    capture.values[op.name] = CapturedValue(op.name, to_numpy(value), provenance)


#: How the trace packs tensors (a list for ``cat``, a tuple a module returns) and unpacks
#: them: what an op reads through one is the tensors packed (:func:`_held`).
_PACKS = frozenset({"prim::ListConstruct", "prim::TupleConstruct"})
_CONTAINERS = _PACKS | {"prim::ListUnpack", "prim::TupleUnpack"}


def _held(value: torch.Value) -> list[torch.Value]:
    """The tensors ``value`` stands for, through the trace's packing and unpacking.

    T5 hands its position bias from block to block in a tuple: the next block's
    ``contiguous`` reads a ``TupleUnpack`` of a ``TupleConstruct``, and what it reads is
    the tensor packed (computed from weights alone, not data). A list unpacked from an
    op's output (``split``'s) stands for that output.
    """
    producer = value.node()
    if producer.kind() in _PACKS:
        return [item for part in producer.inputs() for item in _held(part)]
    if producer.kind() in _CONTAINERS:  # an unpacking
        packed = producer.inputsAt(0)
        if packed.node().kind() not in _PACKS:
            return [packed]
        index = [output.debugName() for output in producer.outputs()].index(
            value.debugName())
        return _held(packed.node().inputsAt(index))
    return [value]


# Ops whose outputs are shapes, not data, though tracing records them as tensors.
_NOT_DATA = frozenset({"aten::size", "aten::numel", "aten::dim", "aten::Int",
                       "aten::ScalarImplicit", "aten::len", "prim::NumToTensor",
                       "aten::detach", "prim::shape"})


def _innermost(node: torch.Node, found: TopLevel) -> str:
    modules = module_paths_of(node, found)
    return modules[-1][0] if modules else ""


def _provenance(node: torch.Node, op: ScriptOp, found: TopLevel, calls: dict[str, int],
                position: int) -> Provenance:
    modules = module_paths_of(node, found)
    path, module_class = modules[-1] if modules else ("", None)
    return Provenance(
        position=position, module=path, call=calls.get(path, 0), module_class=module_class,
        torch_op=f"aten.{op.kind.split('::', 1)[-1]}", source=_source_line(node),
        fx_node=op.name,
        scopes=tuple(call_name(inner, calls.get(inner, 0)) for inner, _ in modules))


def _source_line(node: torch.Node) -> SourceLocation | None:
    """The model's line, from the traced node's stack read as a Python traceback.

    The stack is ``file(line): function`` lines, innermost first.
    """
    frames = []
    for line in node.sourceRange().splitlines():
        file, _, rest = line.rpartition("(")
        number = rest.split(")", 1)[0]
        if file and number.isdigit():
            frames.append(f'File "{file}", line {number}')
    return user_source("\n".join(reversed(frames)))


def _overload(node: torch.Node) -> str:
    import torch

    try:
        return torch.parse_schema(node.schema()).overload_name
    except RuntimeError:  # no schema
        return ""


def _arguments(node: torch.Node, names: dict[str, str], model: torch.jit.ScriptModule,
               computed: dict[str, torch.Tensor], data: set[str],
               ) -> tuple[Argument, ...] | None:
    import torch

    try:
        schema = torch.parse_schema(node.schema()).arguments
    except RuntimeError:  # no schema: the op cannot be called alone by name
        return None
    arguments = []
    for value, parameter in zip(node.inputs(), schema, strict=False):
        argument = _argument(value, names, model)
        if (argument is None and value.debugName() in computed
                and value.debugName() not in data):  # from weights alone, not the inputs
            argument = Argument("weight", computed[value.debugName()])
        if argument is None:
            return None
        keyword = parameter.name if parameter.kwarg_only else None
        arguments.append(replace(argument, keyword=keyword))
    return tuple(arguments)


def _sources(names: dict[str, str], model: torch.jit.ScriptModule,
             computed: dict[str, torch.Tensor], data: set[str]) -> InputSource:
    """What an op's input is, for :class:`ExporterRecords`: (data name, weight).

    A value packed and unpacked on the way (a tuple a module returns) is the one
    packed; a data value the capture has no name for (a ``chunk``'s part) is named by
    its traced name, ``%x.1``: data, though no op value stands for it.
    """
    import torch

    def source(value: torch.Value) -> tuple[str | None, torch.Tensor | None]:
        debug_name = value.debugName()
        held = [item.debugName() for item in _held(value)]
        if debug_name in names or len(held) == 1 and held[0] in names:
            return names.get(debug_name, names.get(held[0])), None
        if debug_name in data or any(item in data for item in held):
            return f"%{debug_name}", None
        argument = _argument(value, names, model)
        weight = argument.value if argument is not None and argument.source == "weight" else None
        return None, (weight if isinstance(weight, torch.Tensor) else computed.get(debug_name))

    return source


def _argument(value: torch.Value, names: dict[str, str],
              model: torch.jit.ScriptModule) -> Argument | None:
    """What one input of a traced op is, or ``None`` if it is none of the kinds.

    A tensor a module returned in a tuple is read through its packing and unpacking
    (DeBERTa's attention output, the next Linear's input): it is the tensor packed.
    """
    if value.debugName() in names:
        return Argument("value", names[value.debugName()])
    held = _held(value)
    if len(held) == 1 and held[0].debugName() in names:
        return Argument("value", names[held[0].debugName()])
    producer = value.node()
    if producer.kind() == "prim::Constant":
        return Argument("constant", value.toIValue())
    if producer.kind() == "prim::ListConstruct":
        items = [_argument(item, names, model) for item in producer.inputs()]
        for source in ("constant", "weight"):  # a GRU's weights come as one list
            if items and all(item is not None and item.source == source for item in items):
                return Argument(source, [item.value for item in items])
        return None
    if producer.kind() == "prim::GetAttr":
        chain = []
        while producer.kind() == "prim::GetAttr":
            chain.append(producer.s("name"))
            producer = producer.inputsAt(0).node()
        target = model
        for attribute in reversed(chain):
            target = getattr(target, attribute, None)
        import torch

        if isinstance(target, torch.Tensor):
            return Argument("weight", target.detach().clone())
    return None
