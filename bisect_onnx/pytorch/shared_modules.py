"""One module object reached by several paths: which path the exporter names it by.

A module registered twice (``self.reused = blocks[0]``) is one object with two paths.
The TorchScript exporter names its nodes by the first path ``named_modules()`` gives
(``/blocks.0/norm`` on its own call, ``/blocks.2/blocks.0/norm`` when ``blocks.2``
calls it), while a trace's module hierarchy names every call of it after the last
attribute it was registered as (``reused``). A ScriptModule keeps no object identity
for such a module, but it keeps its tensors: paths whose modules are of one class and
hold the very same parameters and buffers are one module, known by its first path.
Where the ``nn.Module`` the trace was made from is at hand, object identity says it
for every module, those without tensors too (an attention written by hand, reused).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["module_aliases", "identity_aliases", "canonical_path"]


def module_aliases(model: torch.nn.Module) -> dict[str, str]:
    """Path -> the first path of the same module, for every path after a module's first.

    Modules without parameters or buffers cannot be told apart this way and keep
    their own paths.
    """
    first: dict[tuple, str] = {}
    aliases: dict[str, str] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        tensors = tuple((name, tensor.data_ptr()) for name, tensor in (
            *module.named_parameters(), *module.named_buffers()) if tensor is not None)
        if not path or not tensors:
            continue
        key = (getattr(module, "original_name", type(module).__name__), tensors)
        if key in first:
            aliases[path] = first[key]
        else:
            first[key] = path
    return aliases


def identity_aliases(module: torch.nn.Module) -> dict[str, str]:
    """Path -> the first path of the same object, for every path after an object's first.

    For an ``nn.Module``: exact, where :func:`module_aliases` can only go by tensors.
    """
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for path, child in module.named_modules(remove_duplicate=False):
        if not path:
            continue
        if id(child) in first:
            aliases[path] = first[id(child)]
        else:
            first[id(child)] = path
    return aliases


def canonical_path(path: str, aliases: Mapping[str, str]) -> str:
    """``path`` under its module's first path (``blocks.2.reused.norm`` -> ``blocks.0.norm``)."""
    if not aliases:
        return path
    atoms = path.split(".")
    for end in range(len(atoms), 0, -1):
        head = ".".join(atoms[:end])
        if head in aliases:
            return ".".join([aliases[head], *atoms[end:]])
    return path
