"""Where each node ran: the kernel and execution provider of ONNX Runtime's session.

ONNX Runtime says which provider ran each kernel only in its profile
(``SessionOptions.enable_profiling``: one ``Node`` event per kernel run, named
``<kernel node>_kernel_time``, with ``args.op_name`` and ``args.provider``); the
saved optimized graph carries no provider. So the capture session, which runs
anyway, profiles its first run, the events are read, and the file goes (it is
written into a folder of its own, removed after reading).

A node that ONNX Runtime fused is no kernel of its own: its kernel is the optimized
graph's node that first computes a value downstream of it (a Conv fused with its Relu
runs in the kernel that outputs the Relu's value), which is what the report names.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    import onnx
    import onnxruntime as ort

    from bisect_onnx.runtime.sides import JsonObject

__all__ = ["Kernel", "ProfileFolder", "read_kernels", "kernels_by_output", "ran_in"]

_EVENT_SUFFIX = "_kernel_time"


@dataclass(frozen=True)
class Kernel:
    """One kernel of a session: its node in the optimized graph and who ran it."""

    node: str
    op_type: str
    provider: str
    precision: str | None
    """The element type of its first output as ONNX Runtime names it (``float``)."""


class ProfileFolder:
    """A private folder for one session's profile, removed once it has been read."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="bisect-onnx-profile-"))

    def enable(self, options: ort.SessionOptions) -> None:
        """Make the session that ``options`` configure profile into this folder."""
        options.enable_profiling = True
        options.profile_file_prefix = str(self.path / "profile")

    def remove(self) -> None:
        """Remove the folder and the profile in it."""
        shutil.rmtree(self.path, ignore_errors=True)


def read_kernels(session: ort.InferenceSession, folder: ProfileFolder) -> dict[str, Kernel]:
    """The kernels the profiled ``session`` ran, by node name; the profile is removed.

    Empty where the profile cannot be read (a provider that writes none): the report
    then says nothing about where the culprit ran, rather than guessing.
    """
    try:
        with contextlib.suppress(Exception):
            path = session.end_profiling()
            with open(path, encoding="utf-8") as stream:
                events = json.load(stream)
            return _kernels(events)
        return {}
    finally:
        folder.remove()


class _EventArgs(TypedDict, total=False):
    """What a profile event says of its kernel (the keys read here; there are others)."""

    op_name: str
    provider: str
    output_type_shape: list[dict[str, list[int]]]
    """Each output's element type -> its shape: ``[{"float": [1, 8]}]``."""


class _ProfileEvent(TypedDict, total=False):
    """One event of ONNX Runtime's profile, a JSON object (the keys read here)."""

    name: str
    cat: str
    args: _EventArgs


def _kernels(events: list[_ProfileEvent]) -> dict[str, Kernel]:
    kernels: dict[str, Kernel] = {}
    for event in events:
        name = event.get("name", "")
        args = event.get("args") or {}
        if event.get("cat") != "Node" or not name.endswith(_EVENT_SUFFIX) \
                or "provider" not in args:
            continue
        node = name[:-len(_EVENT_SUFFIX)]
        shapes = args.get("output_type_shape") or [{}]
        precision = next(iter(shapes[0]), None) if shapes and shapes[0] else None
        kernels.setdefault(node, Kernel(node, args.get("op_name", ""), args["provider"],
                                        precision))
    return kernels


def kernels_by_output(optimized: onnx.ModelProto) -> dict[str, str]:
    """Each value an optimized graph computes -> the name of the node computing it."""
    return {output: node.name for node in optimized.graph.node for output in node.output
            if output}


def ran_in(value: str, node: str | None, model: onnx.ModelProto, kernels: Mapping[str, Kernel],
           producers: Mapping[str, str]) -> JsonObject | None:
    """The kernel that computed ``value`` and its provider (``culprit.node.ran_in``).

    ``model``: the graph the user gave; ``producers``: the optimized graph's values by
    the node computing them (:func:`kernels_by_output`; empty when the capture wrote no
    optimized graph, and then a node is its own kernel). ``None`` where the profile
    names no kernel for it.
    """
    found = _kernel_of(value, node, model, kernels, producers)
    if found is None:
        return None
    kernel, output = found
    # Fused: the kernel computes the value only inside, and outputs another one.
    return {"provider": kernel.provider, "name": kernel.node, "op_type": kernel.op_type,
            "precision": kernel.precision, "fused": output != value, "output": output}


def _kernel_of(value: str, node: str | None, model: onnx.ModelProto, kernels: Mapping[str, Kernel],
               producers: Mapping[str, str]) -> tuple[Kernel, str] | None:
    """The kernel computing ``value`` (else the first downstream), and what it outputs.

    Breadth first through the user's graph from ``value``: the first value a kernel
    outputs is where the fused computation surfaces.
    """
    if not producers:  # no optimized graph written: nodes ran as themselves
        return (kernels[node], value) if node in kernels else None
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for each in model.graph.node:
        for name in each.input:
            consumers.setdefault(name, []).append(each)
    seen, frontier = {value}, [value]
    while frontier:
        following = []
        for name in frontier:
            kernel = kernels.get(producers.get(name, ""))
            if kernel is not None:
                return kernel, name
            for each in consumers.get(name, ()):
                for output in each.output:
                    if output and output not in seen:
                        seen.add(output)
                        following.append(output)
        frontier = following
    return None
