"""The reference side for a TorchScript model, from its own graph.

ScriptModules support no forward hooks, and ``torch.export`` cannot take them. But
their inlined graph still says, for every ATen node, which module instances it ran
in (``node.getModuleHierarchy()``: ``layer2(BasicBlock).downsample(Sequential).0(...)``).
So the inlined graph is copied with every node output added to its outputs, run
once, and each module call's output is read off as the value its nodes produced
last — the same names and order :class:`~bisect_onnx.pytorch.module_side.TorchModuleSide`
gives, so alignment works unchanged.

How many times each module is called comes from the un-inlined graphs (one
``prim::CallMethod`` per call); a reused module's nodes are split into that many
equal runs, accepted only when the runs are alike, as in :mod:`bisect_onnx.align.modules`.

The instrumented graph and its run (:func:`instrument_values`, :func:`run_instrumented`)
serve the op level too (:mod:`bisect_onnx.pytorch.script_ops`), which keeps every ATen
value rather than each module call's last.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import numpy as np

from bisect_onnx.errors import InputError, ModelError, one_line
from bisect_onnx.graph.provenance import Provenance
from bisect_onnx.pytorch.calls import PlannedCall, call_name, split_into_calls
from bisect_onnx.pytorch.module_side import (
    buffers_restored,
    describe_arrays,
    final_outputs,
    to_numpy,
    to_tensor,
)
from bisect_onnx.pytorch.private_apis import graph_function, prepare_script_graph
from bisect_onnx.pytorch.script_writes import as_computed
from bisect_onnx.pytorch.shared_modules import canonical_path, module_aliases
from bisect_onnx.pytorch.trace_scopes import resolve_hierarchy, scope_paths
from bisect_onnx.runtime.sides import Capture, CapturedValue, JsonObject

if TYPE_CHECKING:
    import torch

__all__ = ["ScriptModuleSide", "TopLevel", "instrument_values", "run_instrumented",
           "call_numbers", "module_paths_of"]

logger = logging.getLogger(__name__)


class ScriptModuleSide:
    """Runs a TorchScript module once, capturing every module call's output from its graph."""

    def __init__(self, model: torch.jit.ScriptModule, *, label: str | None = None) -> None:
        self.model = model
        self.label = label or model.original_name
        self.graph, self._calls, called = _instrument(model)
        captured = {(call.path, call.call) for call in self._calls}
        #: Module calls the graph does not show (inside control flow, or calls of one
        #: module that ran different code), in call order.
        self.uncaptured = [
            call_name(path, number)
            for path, count in called.items() for number in range(count)
            if (path, number) not in captured
        ]

    def describe(self) -> JsonObject:
        """What this side is, for the report."""
        return {"kind": "torchscript", "model": self.label, "class": self.model.original_name,
                "module_calls": len(self._calls)}

    def run(self, inputs: Sequence[np.ndarray], *, keywords: Sequence[str] = ()) -> Capture:
        """Run the instrumented graph once; copy each module call's output."""
        if keywords:
            raise InputError("a TorchScript model takes its inputs in order: give every "
                             "input up to the last one you need, positionally")
        results = run_instrumented(self.model, self.graph, inputs)
        final, captured = results[0], cast("tuple[torch.Tensor, ...]", results[1:])
        values: dict[str, CapturedValue] = {}
        for call in sorted(self._calls, key=lambda call: call.hook_order):
            several = len(call.outputs) > 1
            for number, index in enumerate(call.outputs):
                name = call.name + (f"[{number}]" if several else "")
                values[name] = CapturedValue(
                    name=name,
                    array=to_numpy(captured[index]),
                    provenance=Provenance(position=len(values), module=call.path,
                                          call=call.call, module_class=call.module_class),
                )
        return Capture(values=values, outputs=final_outputs(final, self.model.original_name))


def run_instrumented(model: torch.jit.ScriptModule, graph: torch.Graph,
                     inputs: Sequence[np.ndarray]) -> tuple[object, ...]:
    """Run a graph made by :func:`instrument_values` on ``inputs``: its one tuple.

    The model's own output first, then the tensors :attr:`TopLevel.values` names.
    """
    import torch

    function = graph_function(graph, model)
    try:  # a trace shares the model's buffers: a training-mode BatchNorm's are put back
        with buffers_restored(model), torch.no_grad():
            return cast("tuple[object, ...]",
                        function(*[to_tensor(array) for array in inputs],
                                 *_defaults_after(model, len(inputs))))
    except Exception as error:
        raise ModelError(f"the TorchScript model raised {type(error).__name__} on inputs "
                         f"{describe_arrays(inputs)}: {one_line(error)}") from error


def _defaults_after(model: torch.jit.ScriptModule, given: int) -> list[object]:
    """Default values of ``forward``'s parameters after the first ``given``.

    A function made from the graph keeps the parameters but not their defaults.
    """
    arguments = model.forward.schema.arguments[1 + given:]  # the first is self
    return [argument.default_value for argument in arguments if argument.has_default_value()]


def _instrument(
    model: torch.jit.ScriptModule,
) -> tuple[torch.Graph, list[PlannedCall[int]], Counter[str]]:
    """Instrument the inlined graph.

    Returns the graph (returning its output, then every tensor an ATen node makes),
    the module calls the graph shows, and how often each module is called.
    """
    graph, found = instrument_values(model)
    calls_per_module = _calls_per_module(model, found)
    calls = [call for (path, module_class), positions in found.members.items()
             for call in _calls_of(found, path, module_class, positions,
                                   calls_per_module.get(path, 0))]
    return graph, calls, calls_per_module


def instrument_values(model: torch.jit.ScriptModule, aliases: Mapping[str, str] | None = None,
                      ) -> tuple[torch.Graph, TopLevel]:
    """The inlined graph, made to return its output then every tensor an ATen node makes.

    Returns the graph and what its top-level nodes make (:class:`TopLevel`).
    ``aliases`` (path -> first path of a module registered twice) where the module the
    trace was made from told them; else they are read off the model's tensors.
    """
    graph = model.inlined_graph
    # In-place ops (a ReLU(inplace=True) after a conv) would change captured values
    # before the run returns them: make them functional where that is safe; and merge
    # repeated ones as the exporter does.
    prepare_script_graph(graph)
    classes = {path: getattr(module, "original_name", type(module).__name__)
               for path, module in model.named_modules() if path}
    top_level = list(graph.nodes())  # nodes inside If/Loop blocks are not promotable
    aliases = module_aliases(model) if aliases is None else dict(aliases)
    found = _find_values(TopLevel(top_level, list(classes), _users(graph, top_level),
                                  aliases=aliases, classes=classes))
    made_at = {index: position for position, made in found.outputs_of.items()
               for _, index in made}
    _return_everything(graph, as_computed(graph, top_level, made_at, found.values))
    return graph, found


def call_numbers(model: torch.jit.ScriptModule, found: TopLevel) -> dict[int, dict[str, int]]:
    """Node position -> {module path: which call of it the node ran in}.

    The calls of a reused module split its nodes as :class:`ScriptModuleSide` does;
    a module whose nodes do not split evenly is left out (its nodes count as call 0).
    """
    calls_per_module = _calls_per_module(model, found)
    numbers: dict[int, dict[str, int]] = defaultdict(dict)
    for (path, _), positions in found.members.items():
        runs = split_into_calls(positions, calls_per_module.get(path, 0),
                                origin=lambda position: position,
                                kind=lambda position: found.nodes[position].kind(),
                                among=found.outputs_of)
        for call, run in enumerate(runs or []):
            for position in run:
                numbers[position][path] = call
    return numbers


@dataclass
class TopLevel:
    """The inlined graph's top-level nodes; what ATen nodes make, and which modules ran them."""

    nodes: Sequence[torch.Node]
    paths: Sequence[str]
    """Every submodule path of the model."""
    users: dict[str, set[int]]
    """Value name -> positions of the nodes that read it (see :func:`_users`)."""
    classes: dict[str, str] = field(default_factory=dict)
    """Path -> its module's class name (where known)."""
    aliases: dict[str, str] = field(default_factory=dict)
    """Path -> the first path of the same module (see :mod:`~bisect_onnx.pytorch.shared_modules`):
    the path every call of a module registered twice is known by."""
    values: list[torch.Value] = field(default_factory=list)
    """Every tensor an ATen node makes, in graph order: the run returns them after its own
    output."""
    outputs_of: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    """Node position -> (value name, index into ``values``) of each tensor it makes."""
    members: dict[tuple[str, str], list[int]] = field(
        default_factory=lambda: defaultdict(list))
    """(module path, class) -> positions of the nodes that ran inside it."""


def _find_values(found: TopLevel) -> TopLevel:
    """Fill in the tensors each ATen node makes and the module calls it ran in."""
    for position, node in enumerate(found.nodes):
        tensors = [out for out in node.outputs() if out.type().kind() == "TensorType"]
        if not node.kind().startswith("aten::") or node.kind() in _SHAPE_OPS or not tensors:
            continue
        found.outputs_of[position] = [(out.debugName(), len(found.values) + i)
                                      for i, out in enumerate(tensors)]
        found.values.extend(tensors)
        for path, module_class in module_paths_of(node, found):
            found.members[(path, module_class)].append(position)
    return found


def _calls_of(found: TopLevel, path: str, module_class: str, positions: list[int],
              called: int) -> list[PlannedCall[int]]:
    """The ``called`` calls of one module, from the nodes that ran in it, if they split evenly."""
    top_level = found.nodes
    runs = split_into_calls(positions, called, origin=lambda position: position,
                            kind=lambda position: top_level[position].kind(),
                            among=found.outputs_of)
    calls = []
    for call, run in enumerate(runs or []):
        # Inlining keeps a call's nodes together: everything between its first and
        # last op (list constructions, inner calls) is inside it, and so are the
        # control-flow nodes right after it that still belong to the module (the
        # If that picks max_pool's values or indices in a scripted module).
        end = run[-1]
        while (end + 1 < len(top_level) and end + 1 not in found.outputs_of
               and path in _module_paths(top_level[end + 1], found)):
            end += 1
        inside = set(range(run[0], end + 1))
        # What the call returns: the values used after it (or by the graph's
        # output), not whatever its last op made (max_pool's indices, LSTM's c_n).
        leaving = [index for position in run for name, index in found.outputs_of[position]
                   if found.users.get(name, set()) - inside]
        if not leaving:
            leaving = [found.outputs_of[run[-1]][0][1]]
        calls.append(PlannedCall(path, call, module_class, tuple(leaving), run[-1],
                                 path.count(".")))
    return calls


def _return_everything(graph: torch.Graph, values: Sequence[torch.Value]) -> None:
    """Make the graph return one tuple: its own result, then every value in ``values``.

    One tuple, since a function made from a graph returns a single value.
    """
    import torch

    originals = list(graph.outputs())
    for position in reversed(range(len(originals))):
        graph.eraseOutput(position)
    everything = originals + list(values)
    pack = graph.create("prim::TupleConstruct", everything, 1)
    graph.appendNode(pack)
    pack.output().setType(torch.TupleType([value.type() for value in everything]))
    graph.registerOutput(pack.output())


_RETURN = -1
# Shape arithmetic, which tracing records as tensors: not values anyone debugs.
_SHAPE_OPS = frozenset({"aten::size", "aten::numel", "aten::dim", "aten::Int",
                        "aten::ScalarImplicit", "aten::len"})


def _users(graph: torch.Graph, top_level: Sequence[torch.Node]) -> dict[str, set[int]]:
    """Value name -> positions of the top-level nodes that read it (``_RETURN``: the output).

    A read inside an If or Loop counts as a read by that If or Loop.
    """
    users: dict[str, set[int]] = defaultdict(set)

    def visit(node: torch.Node, position: int) -> None:
        for value in node.inputs():
            users[value.debugName()].add(position)
        for block in node.blocks():
            for inner in block.nodes():
                visit(inner, position)
            for value in block.outputs():
                users[value.debugName()].add(position)

    for position, node in enumerate(top_level):
        visit(node, position)
    for value in graph.outputs():
        users[value.debugName()].add(_RETURN)
    return users


def _called_paths(module: torch.jit.ScriptModule, prefix: str, method: str = "forward",
                  ) -> list[str]:
    """Every submodule call in ``module.<method>``, recursively, as dotted paths.

    Tracing gives each further call of a module a method of its own (``forward1``,
    ``forward2``), so every ``forward*`` method call counts as a call.
    """
    found = []
    graph = getattr(getattr(module, method), "graph", None)
    if graph is None and method == "forward":
        # A traced submodule's forward is a Python wrapper; its graph is the module's own.
        graph = module.graph
    for node in graph.nodes():
        if node.kind() != "prim::CallMethod" or not node.s("name").startswith("forward"):
            continue
        chain, value = [], node.inputsAt(0)
        while value.node().kind() == "prim::GetAttr":
            chain.append(value.node().s("name"))
            value = value.node().inputsAt(0)
        if not chain:
            continue
        relative = ".".join(reversed(chain))
        path = f"{prefix}.{relative}" if prefix else relative
        found.append(path)
        try:
            submodule = module
            for name in reversed(chain):
                submodule = getattr(submodule, name)
            found.extend(_called_paths(submodule, path, node.s("name")))
        except AttributeError:
            logger.debug("cannot follow the call of %s", path)
    return found


def _calls_per_module(model: torch.jit.ScriptModule, found: TopLevel) -> Counter[str]:
    """How often each module is called, a module registered twice under its first path.

    By the graph's method calls, or by the callers its nodes ran under where those are
    more: the trace may inline a call of a module registered twice (the middle one, whose
    name it lost), leaving no method call of it. Each count is at most the true one.
    """
    counted = Counter(canonical_path(path, found.aliases) for path in _called_paths(model, ""))
    for (path, _), positions in found.members.items():
        callers = {_caller(found.nodes[position], path, found) for position in positions}
        counted[path] = max(counted[path], len(callers - {None}))
    return counted


def _caller(node: torch.Node, path: str, found: TopLevel) -> str | None:
    """The hierarchy ``node`` ran under, down to the module at ``path`` (its caller's)."""
    parts = [part.rstrip(")") for part in node.getModuleHierarchy().split(").")]
    resolved = [each for each, _ in module_paths_of(node, found)]
    if path not in resolved:
        return None
    return ").".join(parts[:resolved.index(path) + 1])


def _module_paths(node: torch.Node, found: TopLevel) -> set[str]:
    return {path for path, _ in module_paths_of(node, found)}


def module_paths_of(node: torch.Node, found: TopLevel) -> list[tuple[str, str]]:
    """(module path, class) of each module instance ``node`` ran in, outermost first.

    A module registered twice is named by its first path, as the exporter names it.
    """
    return [(canonical_path(path, found.aliases), module_class)
            for path, module_class in resolve_hierarchy(
                node.getModuleHierarchy(), found.paths, found.classes, scope_paths(node))]
