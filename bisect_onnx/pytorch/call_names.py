"""The whole model's FX names for the ops of one module call exported alone.

A dynamo file exported elsewhere names its values after the FX nodes of the whole
model's program (``conv2d_39``, ``getitem_117``). One module call exported alone has
the same ops under names counted from its own start (``conv2d_2``, ``getitem_6``):
torch.fx numbers each base name (``conv2d``) in graph order, and a call's ops are
contiguous in that order, so within one call each base's numbers are shifted by one
offset. The offsets are read from what the ONNX nodes of that call say they were made
from (``pkg.torch.onnx.fx_node``: the FX node and the FX nodes it read).

A wrong pairing would name a wrong culprit, so the mapping is refused unless it is
exact: every op of the call gets a name, every FX node the file attributes to the call
is one of them, with the same ATen op reading the same (mapped) nodes and weights in
the same order, and no name is one the file gives to an op outside the call.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bisect_onnx.pytorch.program_side import op_name

if TYPE_CHECKING:
    import torch
    from torch.export import ExportedProgram

__all__ = ["MadeFrom", "CallNames", "NamesRefused", "InputsUnnamed", "made_from",
           "map_call_names", "unnamed_inputs"]

_NUMBERED = re.compile(r"(?P<base>.+)_(?P<index>\d+)")
_NODE_REFERENCE = re.compile(r"%(\w+)")
_WEIGHT_PREFIXES = {"parameter": "p_", "buffer": "b_", "constant": "c_"}


class NamesRefused(Exception):
    """The call's ops cannot be paired exactly with the file's names; the message says why."""


class InputsUnnamed(NamesRefused):
    """No op of the file says which value enters the call (its first ops were folded)."""


@dataclass(frozen=True)
class MadeFrom:
    """What an ONNX file says about one FX node of the whole model's program."""

    op: str | None
    """The ATen op (``aten.conv2d.default``), where the metadata says."""
    reads: tuple[str, ...] | None
    """The FX nodes it reads, in order, each once; ``None`` where the file does not say."""


@dataclass
class CallNames:
    """Sub-program FX name -> the whole model's, for every op and user input."""

    ops: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    """User-input placeholder -> the whole model's FX node (or input) it stands for."""


def made_from(node_text: str, op: str | None) -> MadeFrom | None:
    """Parse ``pkg.torch.onnx.fx_node`` (``%relu_3 : ... = call_function[...](args = (%x,))``)."""
    names = _NODE_REFERENCE.findall(node_text.split(" = ", 1)[-1]) if " = " in node_text else []
    return MadeFrom(op=op, reads=tuple(dict.fromkeys(names)) if node_text else None)


#: The mark of an op the file gives no name (an FX name never ends so).
UNNAMED = "__not_in_the_file"


def split_name(name: str) -> tuple[str, int]:
    """``("conv2d", 39)`` for ``conv2d_39``; ``("conv2d", 0)`` for ``conv2d``."""
    match = _NUMBERED.fullmatch(name)
    return (match["base"], int(match["index"])) if match else (name, 0)


def _numbered(base: str, index: int) -> str:
    return base if index == 0 else f"{base}_{index}"


def map_call_names(program: ExportedProgram, path: str, known: Mapping[str, MadeFrom],
                   elsewhere: Collection[str]) -> CallNames:
    """Pair the ops of ``program`` with the whole model's FX names ``known``.

    ``program`` is the call of module ``path`` exported alone, ``known`` what the call's
    ONNX nodes were made from. ``elsewhere`` are the FX names the file gives to nodes
    outside the call. Raises :class:`NamesRefused` unless the pairing is exact.
    """
    ops = [node for node in program.graph.nodes if node.op == "call_function"]
    if not ops:
        raise NamesRefused("the call exported alone has no op")
    by_base: dict[str, dict[int, torch.fx.Node]] = {}
    for node in ops:
        base, index = split_name(node.name)
        by_base.setdefault(base, {})[index] = node
    offsets = _anchor_offsets(by_base, known)
    names = CallNames()
    _follow_reads(program, path, ops, offsets, known, names)
    for node in ops:
        base, index = split_name(node.name)
        # An op kind the file never names in the call (torch.ones for a mask, folded
        # into a constant) has no value to compare: it gets a name no FX node has.
        names.ops[node.name] = (_numbered(base, index + offsets[base]) if base in offsets
                                else f"{node.name}{UNNAMED}")
    _check_exact(program, path, ops, names, known, elsewhere)
    return names


def _anchor_offsets(by_base: Mapping[str, Mapping[int, torch.fx.Node]],
                    known: Mapping[str, MadeFrom]) -> dict[str, int]:
    """Each base's offset, where the file's names of that base allow exactly one."""
    wanted: dict[str, dict[int, str | None]] = {}
    for name, origin in known.items():
        base, index = split_name(name)
        wanted.setdefault(base, {})[index] = origin.op
    offsets = {}
    for base, indices in wanted.items():
        own = by_base.get(base)
        if not own:
            raise NamesRefused(f"the file's {_numbered(base, min(indices))} has no op of its "
                               "kind in the call exported alone")
        fits = {first - index for first in indices for index in own}
        fits = [offset for offset in fits if offset >= 0 and all(
            (index - offset) in own and (op is None or op_name(own[index - offset]) == op)
            for index, op in indices.items())]
        if not fits:
            raise NamesRefused(f"the file's {base} ops do not line up with the call's")
        if len(fits) == 1:
            offsets[base] = fits[0]
    return offsets


def _follow_reads(program: ExportedProgram, path: str, ops: list[torch.fx.Node],
                  offsets: dict[str, int], known: Mapping[str, MadeFrom], names: CallNames) -> None:
    """Learn from the reads of ops whose names are known.

    The offsets of bases the file names only as what others read (a folded Conv, a
    getitem), and the names of the user inputs.
    """
    changed = True
    while changed:
        changed = False
        for node in ops:
            base, index = split_name(node.name)
            if base not in offsets:
                continue
            origin = known.get(_numbered(base, index + offsets[base]))
            if origin is None or origin.reads is None:
                continue
            sources = node.all_input_nodes
            if len(sources) != len(origin.reads):
                raise NamesRefused(f"{node.name} reads {len(sources)} values, the file's "
                                   f"{_numbered(base, index + offsets[base])} "
                                   f"{len(origin.reads)}")
            for source, read in zip(sources, origin.reads, strict=True):
                changed |= _learn(program, path, source, read, offsets, names)


def _learn(program: ExportedProgram, path: str, source: torch.fx.Node, read: str,
           offsets: dict[str, int], names: CallNames) -> bool:
    """Record what one read says; whether it taught a new offset."""
    if source.op == "call_function":
        base, index = split_name(source.name)
        read_base, read_index = split_name(read)
        if read_base != base:
            raise NamesRefused(f"{source.name} stands where the file reads {read}")
        if base in offsets:
            if index + offsets[base] != read_index:
                raise NamesRefused(f"{source.name} would be both "
                                   f"{_numbered(base, index + offsets[base])} and {read}")
            return False
        if read_index < index:  # the whole model counts from before the call, never after
            raise NamesRefused(f"{source.name} stands where the file reads {read}")
        offsets[base] = read_index - index
        return True
    if source.op == "placeholder":
        kind = _weight_kind(program, source.name)
        if kind is None:
            if names.inputs.setdefault(source.name, read) != read:
                raise NamesRefused(f"input {source.name} stands for both "
                                   f"{names.inputs[source.name]} and {read}")
        elif not _same_weight(program, path, source.name, kind, read):
            raise NamesRefused(f"{source.name} stands where the file reads {read}")
    return False


def unnamed_inputs(program: ExportedProgram, names: CallNames) -> list[str]:
    """The user inputs the call reads whose whole-model value no op of the file names.

    Only folded ops read them (a Conv the exporter folded into its BatchNorm).
    """
    return [node.name for node in program.graph.nodes if node.op == "placeholder"
            and node.users and _weight_kind(program, node.name) is None
            and node.name not in names.inputs]


def _weight_kind(program: ExportedProgram, name: str) -> str | None:
    signature = program.graph_signature
    for kind, table in (("parameter", signature.inputs_to_parameters),
                        ("buffer", signature.inputs_to_buffers),
                        ("constant", signature.inputs_to_lifted_tensor_constants)):
        if name in table:
            return kind
    return None


def _same_weight(program: ExportedProgram, path: str, name: str, kind: str, read: str) -> bool:
    """Whether the whole model's placeholder ``read`` is this call's weight ``name``."""
    prefix = _WEIGHT_PREFIXES[kind]
    if kind == "constant":  # lifted constants are numbered across the model
        return read.startswith(prefix)
    signature = program.graph_signature
    table = (signature.inputs_to_parameters if kind == "parameter"
             else signature.inputs_to_buffers)
    qualified = f"{path}.{table[name]}" if path else table[name]
    return read == prefix + re.sub(r"[^0-9a-zA-Z_]", "_", qualified)


def _check_exact(program: ExportedProgram, path: str, ops: list[torch.fx.Node], names: CallNames,
                 known: Mapping[str, MadeFrom], elsewhere: Collection[str]) -> None:
    """Every known name is one op's, with its ATen op and its reads; no name is elsewhere's."""
    images = list(names.ops.values())
    if len(set(images)) != len(images):
        raise NamesRefused("two ops of the call would get one name")
    clash = next((name for name in images if name in elsewhere), None)
    if clash is not None:
        raise NamesRefused(f"{clash} is the name of an op outside the call")
    lost = sorted(set(known) - set(images))
    if lost:
        raise NamesRefused(f"the file's {lost[0]} has no op in the call exported alone")
    placeholders = {**names.inputs}
    for node in ops:
        origin = known.get(names.ops[node.name])
        if origin is None:
            continue
        if origin.op is not None and op_name(node) != origin.op:
            raise NamesRefused(f"{node.name} is {op_name(node)}, the file's "
                               f"{names.ops[node.name]} {origin.op}")
        if origin.reads is None:
            continue
        reads = []
        for source in node.all_input_nodes:
            if source.op == "call_function":
                reads.append(names.ops[source.name])
            elif source.name in placeholders or _weight_kind(program, source.name) is None:
                reads.append(placeholders.get(source.name))
            else:
                reads.append(None)  # a weight: checked by name while following reads
        if any(mine is not None and mine != theirs
               for mine, theirs in zip(reads, origin.reads, strict=True)):
            raise NamesRefused(f"{names.ops[node.name]} reads other values in the file")
