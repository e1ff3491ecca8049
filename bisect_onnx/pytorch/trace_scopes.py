"""Which module instance a traced node ran in, by the trace's hierarchy and scope.

A node of ``torch.jit.trace``'s graph says where it ran twice: its module hierarchy
(``layer2(BasicBlock).downsample(Sequential).0(Conv2d)``, instance names and classes)
and its scope (``__module.layer2/__module.layer2.downsample/...``, full paths). The
hierarchy is read as module paths; the scope settles what it leaves ambiguous.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["resolve_hierarchy", "scope_paths"]


def scope_paths(node: torch.Node) -> frozenset[str]:
    """The module paths of ``node``'s scope: ``__module.encoder.block.1.0/...``.

    The hierarchy leaves out a ModuleList that is iterated, not called, so the first
    layer of every stage is ``0(Layer)`` there; the tracer's scope names each call by
    its full path and tells them apart.
    """
    return frozenset(part.removeprefix("__module.") for part in node.scopeName().split("/")
                     if part.startswith("__module."))


#: What a trace's hierarchy says for a module it lost the name of (the middle call of a
#: module registered under several paths); the class still says which child it is.
_UNKNOWN = "INSTANCE_NAME_UNKNOWN"


def resolve_hierarchy(hierarchy: str, paths: Sequence[str],
                      classes: Mapping[str, str] | None = None,
                      scopes: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """``blocks.0`` for ``0(TransformerBlock)``: the hierarchy's instances as module paths.

    An instance name may be any module's below the parent (a ModuleList's ``0``, or
    ``reused``: a module registered twice is named after its last attribute on every
    call); the module's class, where ``classes`` has it, tells such paths apart, and so
    do the node's ``scopes`` (:func:`scope_paths`) where they hold one of them.
    """
    resolved, parent = [], ""
    for part in hierarchy.split(").") if hierarchy else []:
        instance, _, module_class = part.rstrip(")").partition("(")
        prefix = f"{parent}." if parent else ""
        matches = [path for path in paths
                   if path.startswith(prefix)
                   and (path.rsplit(".", 1)[-1] == instance or (
                       instance == _UNKNOWN and classes and path.count(".") == prefix.count(".")))
                   and (not classes or classes.get(path, module_class) == module_class)]
        matches = [path for path in matches if path in scopes] or matches
        if instance == _UNKNOWN and len(matches) != 1:
            break  # the tracer lost the name, and the class does not tell the child
        if not matches:
            break  # UNKNOWN_INSTANCE: a function call, not a module
        parent = min(matches, key=lambda path: path.count("."))
        resolved.append((parent, module_class))
    return resolved
