"""Which PyTorch modules enclose each ONNX node, for either exporter.

- The dynamo exporter writes the module paths into each node's metadata
  (``pkg.torch.onnx.name_scopes``); which *call* of a reused module a node ran in
  is known only from the ExportedProgram (``nn_module_stack`` keys ``relu@1``).
- The TorchScript exporter writes them into node names: ``/layer2/downsample/
  downsample.0/Conv``. Each component is a module's name without its parents, except
  that a numeric name keeps its container (``downsample.0``, ``blocks.0``) when an
  ``nn.Module`` is exported; an export of a ``torch.jit.trace`` archive shows the bare
  attribute name (``/layer2/downsample/0/Conv``). A repeated call gets a suffix
  (``act_1``). Components are resolved against the module paths the PyTorch side
  actually called.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from bisect_onnx.graph.nodes import NodeInfo

__all__ = ["NodeScope", "read_scopes", "detect_exporter", "count_attributed",
           "unqualified_name"]

_CALL_SUFFIX = re.compile(r"(?P<name>.+)_(?P<call>\d+)")


@dataclass(frozen=True)
class NodeScope:
    """The modules around one ONNX node."""

    modules: tuple[str, ...]
    """Enclosing module paths, outermost first; the model itself is left out."""
    origin: str
    """Nodes with the same origin were made from one torch op: never split across calls."""
    calls: Mapping[str, int] = field(default_factory=dict)
    """Module path -> which call of it the node ran in, where the exporter recorded it."""
    complete: bool = True
    """Every scope the exporter wrote resolved to a module PyTorch called (a TorchScript
    name's component that resolves to none leaves the innermost modules unknown)."""


def detect_exporter(nodes: Sequence[NodeInfo]) -> str:
    """``dynamo``, ``torchscript`` or ``unknown``, from what the graph carries."""
    if any(node.torch for node in nodes):
        return "dynamo"
    scoped = sum(node.name.startswith("/") for node in nodes)
    if nodes and scoped >= len(nodes) / 2:
        return "torchscript"
    return "unknown"


def count_attributed(nodes: Sequence[NodeInfo]) -> int:
    """How many nodes carry a module attribution: torch metadata, or a scoped name."""
    return sum(node.torch is not None or node.name.startswith("/") for node in nodes)


def read_scopes(
    nodes: Sequence[NodeInfo],
    module_paths: Collection[str],
    call_index: Mapping[str, Mapping[str, int]] | None = None,
) -> list[NodeScope | None]:
    """The scope of every node (``None`` where nothing is known), in node order."""
    exporter = detect_exporter(nodes)
    if exporter == "dynamo":
        return [_dynamo_scope(node, call_index or {}) for node in nodes]
    if exporter == "torchscript":
        known = frozenset(module_paths)
        return [_torchscript_scope(node, known) for node in nodes]
    return [None] * len(nodes)


def _dynamo_scope(node: NodeInfo, call_index: Mapping[str, Mapping[str, int]]) -> NodeScope | None:
    meta = node.torch
    if meta is None:
        return None
    origin = meta.fx_node or node.name
    modules = tuple(scope for scope in meta.scopes if scope)
    return NodeScope(modules=modules, origin=origin, calls=dict(call_index.get(origin, {})))


def _torchscript_scope(node: NodeInfo, module_paths: frozenset[str]) -> NodeScope | None:
    if not node.name.startswith("/"):
        return None
    components = node.name.split("/")[1:-1]  # the last part names the op itself
    chains: list[tuple[str, ...]] = [()]
    call = 0
    for component in components:
        extended, suffix = _extend(chains, component, module_paths)
        if not extended:
            break  # a scope the PyTorch side never called: the rest is not a module path
        chains, call = extended, suffix
    modules, call = _occurrence(chains, call)
    # The exporter suffixes the innermost module of a repeated call (``act_1``); its
    # enclosing modules keep their plain names on every call, so only the innermost
    # module's call is known (and an unsuffixed one only presumed the first).
    calls = {modules[-1]: call} if modules else {}
    return NodeScope(modules=modules, origin=node.name, calls=calls,
                     complete=len(modules) == len(components))


def _extend(chains: list[tuple[str, ...]], component: str, module_paths: frozenset[str],
            ) -> tuple[list[tuple[str, ...]], int]:
    """Each chain extended by the modules ``component`` names under its last.

    With the call number a ``_k`` suffix gives (0 without one).
    """
    extended = [(*chain, path) for chain in chains
                for path in _children(chain[-1] if chain else "", component, module_paths)]
    suffixed = _CALL_SUFFIX.fullmatch(component)
    if extended or not suffixed:
        return extended, 0
    return [(*chain, path) for chain in chains
            for path in _children(chain[-1] if chain else "", suffixed["name"],
                                  module_paths)], int(suffixed["call"])


def _occurrence(chains: list[tuple[str, ...]], call: int) -> tuple[tuple[str, ...], int]:
    """The chain a scope stands for, and its call.

    Several chains: the scope left a level out (a module called through ``.forward``,
    not ``__call__``, records no scope), so same-named modules share it, and the
    exporter numbers their occurrences in the order they ran: ``attention``,
    ``attention_1`` are ``layers.0.attention`` and ``layers.1.attention``, taken in
    their registration order.
    """
    if len(chains) == 1:
        return chains[0], call
    ordered = sorted(chains, key=lambda chain: _natural(chain[-1]))
    return ordered[call % len(ordered)], call // len(ordered)


def _natural(path: str) -> list[tuple[int, int | str]]:
    """A path's order among its siblings: ``layers.2`` before ``layers.10``."""
    return [(0, int(atom)) if atom.isdigit() else (1, atom) for atom in path.split(".")]


def _children(parent: str, component: str, module_paths: frozenset[str]) -> list[str]:
    """The shallowest modules under ``parent`` that ``component`` names.

    By its unqualified name (``downsample.0``), or by its attribute name alone (``0``),
    which is how the scopes of an exported ScriptModule show a Sequential's children;
    or by its whole path, where no module under ``parent`` has that name. Several where
    a level between is left out of the scope (``layers.0.attention``,
    ``layers.1.attention`` under ``encoder``).
    """
    prefix = f"{parent}." if parent else ""
    matches = [
        path for path in module_paths
        if path.startswith(prefix)
        and component in (unqualified_name(path), path.rpartition(".")[2])
    ]
    if not matches and component in module_paths:
        # A module registered twice, called from another module (``/blocks.2/blocks.0/``):
        # the exporter names it by its first path, which is not under its caller's.
        return [component]
    depth = min((path.count(".") for path in matches), default=0)
    return [path for path in matches if path.count(".") == depth]


def unqualified_name(path: str) -> str:
    """A module's name as the TorchScript exporter shows it in a scope.

    The last component, widened to the left over numeric ones: ``layer2.downsample.0``
    shows as ``downsample.0``, ``blocks.0`` as ``blocks.0``.
    """
    atoms = path.split(".")
    for index in range(len(atoms) - 1, -1, -1):
        if not atoms[index].isdigit():
            return ".".join(atoms[index:])
    return path
