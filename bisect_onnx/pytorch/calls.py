"""Module calls: how they are named, and how the calls of a reused module are told apart.

A module called several times (one ``self.relu`` used three times) gets one row per
call: ``relu``, ``relu@1``, ``relu@2`` — the convention of ``torch.export``'s
``nn_module_stack`` keys, used by every side so that their names meet.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["call_name", "split_call_name", "call_of_stack_key", "split_into_calls",
           "PlannedCall", "input_name", "input_of"]

Item = TypeVar("Item")
Output = TypeVar("Output")


def call_of_stack_key(key: str) -> int:
    """Which call an ``nn_module_stack`` key stands for: ``L__self__relu@2`` -> 2, else 0."""
    _, at, number = key.rpartition("@")
    return int(number) if at and number.isdigit() else 0


def call_name(path: str, call: int) -> str:
    """``relu`` for the first call of ``relu``, ``relu@2`` for the third."""
    return path if call == 0 else f"{path}@{call}"


def split_call_name(name: str) -> tuple[str, int]:
    """``("relu", 2)`` for ``relu@2``, ``("relu", 0)`` for ``relu``: :func:`call_name` undone."""
    path, at, call = name.rpartition("@")
    return (path, int(call)) if at and call.isdigit() else (name, 0)


def input_name(call: str, index: int, count: int) -> str:
    """``fc2 (input)``: the value entering a call, ``fc2 (input 1)`` when it takes several.

    Module level records what enters each call too, so that a value computed between
    two modules (``F.gelu`` in a ``forward``) is compared where the next module reads it.
    """
    return f"{call} (input)" if count == 1 else f"{call} (input {index})"


def input_of(name: str) -> tuple[str, int] | None:
    """``("fc2", 0)`` for ``fc2 (input)``; ``None`` for a call's output."""
    match = _INPUT_NAME.fullmatch(name)
    if match is None:
        return None
    return match["call"], int(match["index"] or 0)


_INPUT_NAME = re.compile(r"(?P<call>.*) \(input(?: (?P<index>\d+))?\)")


@dataclass(frozen=True)
class PlannedCall(Generic[Output]):
    """One module call found in a graph before running it (FX or TorchScript)."""

    path: str
    call: int
    module_class: str
    outputs: tuple[Output, ...]
    """What leaves the call, in graph order (FX nodes, or indices of captured values)."""
    done_at: int
    """Graph position of the call's last op: where eager mode would fire the hook."""
    depth: int
    """Nesting depth: of two calls done at one op, the inner one's hook fires first."""

    @property
    def name(self) -> str:
        """The call's name on every side (``relu@1``)."""
        return call_name(self.path, self.call)

    @property
    def hook_order(self) -> tuple[int, int]:
        """Sort key giving the order in which forward hooks would have fired."""
        return self.done_at, -self.depth


def split_into_calls(
    items: Sequence[Item],
    count: int,
    *,
    origin: Callable[[Item], Hashable],
    kind: Callable[[Item], str],
    among: Iterable[Item] | None = None,
) -> list[list[Item]] | None:
    """Split a reused module's ops (in execution order) into ``count`` calls.

    Where ``among`` (every op in order, other modules' too) has ops outside the module
    between its calls that cut ``items`` into ``count`` runs (the parent's ``x * 0.5``
    between two steps of a cell), those runs are the calls, whatever each ran (an
    ``LSTMCell``'s first step makes its zero state, the next does not).

    Else items with the same ``origin`` come from one torch op and stay together. The
    distinct origins are cut into ``count`` equal runs, accepted only when every run
    has the same sequence of kinds: calls that ran different code (a branch taken in
    one call only) cannot be told apart by order, and ``None`` says so.
    """
    if count == 1:
        return [list(items)]
    if among is not None and count > 1:
        inside, apart = set(items), [[]]
        for item in among:
            if item in inside:
                apart[-1].append(item)
            elif apart[-1]:
                apart.append([])
        if len([run for run in apart if run]) == count:
            return [run for run in apart if run]
    origins = list(dict.fromkeys(origin(item) for item in items))
    if count < 1 or len(origins) % count:
        return None
    per_call = len(origins) // count
    call_of = {key: position // per_call for position, key in enumerate(origins)}
    runs: list[list[Item]] = [[] for _ in range(count)]
    for item in items:
        runs[call_of[origin(item)]].append(item)
    signatures = {tuple(kind(item) for item in run) for run in runs}
    return runs if len(signatures) == 1 else None
