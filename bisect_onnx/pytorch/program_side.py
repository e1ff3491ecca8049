"""The reference side for a ``torch.export`` ExportedProgram, run FX node by node.

Forward hooks on the submodules of ``ExportedProgram.module()`` never fire: the
graph is flat, and the submodules are only remembered in each node's
``meta["nn_module_stack"]`` (outermost first; key ``L__self__block@1`` for the
second call of ``block``, value ``(path, qualified class name)``). So the graph runs
in a :class:`torch.fx.Interpreter`, and the values that enter and leave each module
call are recorded under the name :class:`~bisect_onnx.pytorch.module_side.TorchModuleSide` gives the
same call (``block``, ``block@1``, ``pair[0]``), so either side can be the reference.
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from bisect_onnx.errors import ModelError, one_line
from bisect_onnx.graph.provenance import Provenance
from bisect_onnx.pytorch.calls import PlannedCall, call_of_stack_key, input_name
from bisect_onnx.pytorch.module_side import (
    buffers_restored,
    describe_arrays,
    final_outputs,
    flatten_outputs,
    same_tensor,
    to_numpy,
    to_tensor,
)
from bisect_onnx.pytorch.private_apis import is_op_overload
from bisect_onnx.runtime.sides import Capture, CapturedValue, JsonObject

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram
    from torch.fx import Node

__all__ = ["ExportedProgramSide"]

logger = logging.getLogger(__name__)

class ExportedProgramSide:
    """Runs an ``ExportedProgram`` and records the output of every module call."""

    def __init__(self, exported_program: ExportedProgram, *, label: str | None = None) -> None:
        self.exported_program = exported_program
        self._module = exported_program.module()
        self._calls, root_class = _plan_calls(self._module.graph)
        #: (module path, call) -> the nodes whose values enter the call, as its pre-hook
        #: would see them.
        self._inputs = _call_inputs(self._module.graph)
        self.module_class = root_class or type(self._module).__name__
        self.label = label or self.module_class

    def describe(self) -> JsonObject:
        """What this side is, for the report."""
        return {
            "kind": "exported_program",
            "model": self.label,
            "class": self.module_class,
            "module_calls": len(self._calls),
        }

    def run(self, inputs: Sequence[np.ndarray], *, keywords: Sequence[str] = ()) -> Capture:
        """Run the graph once on ``inputs``, copying each module call's output as it appears."""
        import torch

        wanted = {node for call in self._calls for node in call.outputs}
        wanted.update(node for entering in self._inputs.values() for node in entering.nodes)
        recorder = recorder_class()(self._module, wanted)
        # The graph's placeholders are the program's user inputs in its own order, which
        # is the order the inputs were arranged in: keywords need no special handling.
        tensors = [to_tensor(array) for array in inputs]
        try:
            # A program exported in training mode updates its BatchNorm statistics, which
            # it shares with the ExportedProgram's state_dict: put them back afterwards.
            with buffers_restored(self._module), torch.no_grad():
                result = recorder.run(*tensors)
        except Exception as error:
            raise ModelError(
                f"the exported program raised {type(error).__name__} on inputs "
                f"{describe_arrays(inputs)}: {one_line(error)}; check that the inputs "
                "match the ones it was exported with (shapes are fixed unless exported "
                "with dynamic_shapes)"
            ) from error
        values = _call_values(self._calls, recorder, self._inputs)
        logger.info("recorded %d module outputs from %d module calls", len(values),
                    len(self._calls))
        return Capture(values=values, outputs=final_outputs(result, self.module_class))


class RecordedNodes(Protocol):
    """What a recorder (:func:`recorder_class`) copied as the graph ran."""

    copies: dict[Node, list[tuple[str, np.ndarray]]]
    """Node -> (suffix, copy) of each tensor in its value."""
    passed_through: dict[Node, Node]
    """Node -> the recorded input node whose tensor it returned unchanged."""


def _call_values(calls: Sequence[PlannedCall[Node]], recorder: RecordedNodes,
                 inputs: Mapping[tuple[str, int], CallInputs]) -> dict[str, CapturedValue]:
    """Each module call's inputs and outputs as the recorder copied them.

    Named and ordered as the eager hooks name and order them.
    """
    values: dict[str, CapturedValue] = {}
    latest: dict[Node, str] = {}  # node -> last name its (whole) value was recorded as
    for kind, call, nodes in _hook_order(calls, inputs):
        several = len(nodes) > 1
        for index, node in enumerate(nodes):
            for suffix, array in recorder.copies.get(node, []):
                if kind == "input":
                    if suffix:
                        continue
                    name = input_name(call.name, index, len(nodes))
                    if node in latest:  # another call's output seen again: its copy
                        array = values[latest[node]].array
                    values[name] = CapturedValue(name, array, Provenance(
                        position=len(values), module=call.path, call=call.call,
                        module_class=call.module_class))
                    latest.setdefault(node, name)
                    continue
                name = call.name + (f"[{index}]" if several else "") + suffix
                same_as = recorder.passed_through.get(node)
                values[name] = CapturedValue(
                    name=name,
                    array=array,
                    provenance=Provenance(
                        position=len(values),
                        module=call.path,
                        call=call.call,
                        module_class=call.module_class,
                        torch_op=op_name(node),
                        same_as=latest.get(same_as) if same_as is not None else None,
                    ),
                )
                if not suffix:
                    latest[node] = name
    return values


def _hook_order(calls: Sequence[PlannedCall[Node]], inputs: Mapping[tuple[str, int], CallInputs],
                ) -> list[tuple[str, PlannedCall[Node], tuple[Node, ...]]]:
    """``("input" | "output", call, nodes)`` in the order eager pre-hooks and hooks fire.

    A call's pre-hook fires before its first node runs, outer calls' first; its hook
    after its last, inner calls' first.
    """
    events = []
    for call in calls:
        entering = inputs.get((call.path, call.call))
        if entering is not None and entering.nodes:
            events.append(((entering.starts_at, 0, call.depth),
                           ("input", call, entering.nodes)))
        events.append(((call.done_at, 1, -call.depth), ("output", call, call.outputs)))
    return [event for _, event in sorted(events, key=lambda item: item[0])]


@dataclass(frozen=True)
class CallInputs:
    """The tensor nodes read inside one module call but made outside it."""

    nodes: tuple[Node, ...]
    """In order of first use; weights (``get_attr`` nodes) are no inputs."""
    starts_at: int
    """Graph position of the call's first node: its pre-hook fires just before."""


def _call_inputs(graph: torch.fx.Graph) -> dict[tuple[str, int], CallInputs]:
    """(module path, call) -> what enters the call, as its forward pre-hook sees it."""
    position = {node: index for index, node in enumerate(graph.nodes)}
    members: dict[tuple[str, int], list[Node]] = defaultdict(list)
    for node in graph.nodes:
        for key, (path, _) in module_stack(node).items():
            if path:
                members[(path, call_of_stack_key(key))].append(node)
    entering: dict[tuple[str, int], CallInputs] = {}
    for call_key, nodes in members.items():
        inside = set(nodes)
        found = [source for node in nodes for source in node.all_input_nodes
                 if source not in inside and source.op != "get_attr"
                 and _may_hold_tensors_or_input(source)]
        entering[call_key] = CallInputs(tuple(dict.fromkeys(found)),
                                        min(position[node] for node in nodes))
    return entering


def _may_hold_tensors_or_input(node: Node) -> bool:
    return node.op == "placeholder" or _may_hold_tensors(node)


def _plan_calls(graph: torch.fx.Graph) -> tuple[list[PlannedCall[Node]], str | None]:
    """Every submodule call in ``graph`` with the nodes that are its outputs, in hook order.

    A call's outputs are the nodes inside it whose values are used outside it (by a
    later module, a functional op of the parent, or the graph's output): that is
    exactly what its ``forward`` returned, whether one tensor, a tuple of getitems, or
    a list a ``split`` made. A call whose output nobody uses falls back to its last
    tensor-valued node. Several outputs are numbered in graph order, which is the
    order ``forward`` returns them in unless it computes a later one first (the graph
    does not say); alignment pairs several outputs by shape, not by number.
    """
    position = {node: index for index, node in enumerate(graph.nodes)}
    members: dict[tuple[str, int], list[Node]] = defaultdict(list)
    classes: dict[tuple[str, int], str] = {}
    depths: dict[tuple[str, int], int] = {}
    root_class = None
    for node in graph.nodes:
        for depth, (key, (path, qualified)) in enumerate(module_stack(node).items()):
            short = str(qualified).rsplit(".", 1)[-1]
            if path == "":
                root_class = root_class or short
                continue
            call_key = (path, call_of_stack_key(key))
            members[call_key].append(node)
            classes[call_key] = short
            depths[call_key] = depth

    calls = []
    for call_key, nodes in members.items():
        inside = set(nodes)
        outputs = [node for node in nodes if _may_hold_tensors(node)
                   and any(user not in inside for user in node.users)]
        if not outputs:
            outputs = [node for node in nodes if _may_hold_tensors(node)][-1:]
        if outputs:
            calls.append(PlannedCall(
                path=call_key[0], call=call_key[1], module_class=classes[call_key],
                outputs=tuple(outputs), done_at=position[outputs[-1]], depth=depths[call_key],
            ))
    calls.sort(key=lambda call: call.hook_order)
    return calls, root_class


def module_stack(node: Node) -> dict[str, tuple[str, str]]:
    """The node's ``nn_module_stack``: key -> (module path, qualified class), outermost first."""
    stack = node.meta.get("nn_module_stack") or {}
    return {key: value for key, value in stack.items()
            if isinstance(value, (tuple, list)) and len(value) == 2}


def _may_hold_tensors(node: Node) -> bool:
    """Whether the node's value is (or contains) a tensor, from export's fake values.

    ``_guards_fn`` (a shape check returning ``None``) and symbolic sizes are not; a
    node without a recorded fake value might be, and is checked when it runs.
    """
    import torch

    if node.op not in ("call_function", "call_method", "call_module"):
        return False
    if "val" not in node.meta:
        return True
    value = node.meta["val"]
    if isinstance(value, (list, tuple)):
        return any(isinstance(item, torch.Tensor) for item in value)
    return isinstance(value, torch.Tensor)


def op_name(node: Node) -> str | None:
    """``aten.linear.default`` for an ATen op; ``None`` for getitem and the like."""
    return str(node.target) if is_op_overload(node.target) else None


@functools.cache
def recorder_class() -> type:
    """The interpreter class, made on first use so that importing this module skips torch."""
    import torch.fx

    class _Recorder(torch.fx.Interpreter):
        """Copies the values of the wanted nodes the moment they are computed.

        The exported graph may hold in-place ops (``relu_``) that change a value after
        it was produced; the interpreter itself frees every value after its last use.
        """

        def __init__(self, module: torch.fx.GraphModule, wanted: set[Node]) -> None:
            super().__init__(module, garbage_collect_values=True)
            self.wanted = wanted
            self.copies: dict[Node, list[tuple[str, np.ndarray]]] = {}
            # node -> the recorded input node whose tensor it returned unchanged
            self.passed_through: dict[Node, Node] = {}

        def run_node(self, node: Node) -> object:
            result = super().run_node(node)
            if node in self.wanted:
                self.copies[node] = [(suffix, to_numpy(tensor))
                                     for suffix, tensor in flatten_outputs(result)]
                source = self._source_of(node, result)
                if source is not None:
                    self.passed_through[node] = source
            return result

        def _source_of(self, node: Node, result: object) -> Node | None:
            """The recorded input whose tensor ``node`` handed back unchanged (eval Dropout).

            Like the eager side, the tensor must be the input itself *and* still hold
            the recorded values: an in-place ReLU also returns its input, changed.
            """
            if not isinstance(result, torch.Tensor):
                return None
            for source in node.all_input_nodes:
                value = self.env.get(source)
                recorded = self.copies.get(source)
                if (same_tensor(value, result) and recorded and len(recorded) == 1
                        and np.array_equal(recorded[0][1], self.copies[node][0][1],
                                           equal_nan=True)):
                    return source
            return None

    return _Recorder

