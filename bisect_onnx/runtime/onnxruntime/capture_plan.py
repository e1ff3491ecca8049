"""Which values to promote so that ONNX Runtime still runs the production kernels.

Promoting every node output changes what ONNX Runtime fuses (a Conv's output made a
graph output can no longer disappear into a FusedConv), so the layer-by-layer run
would not execute the kernels production runs, and a fusion-only bug would vanish.
Fusion-preserving capture promotes only the values that survive in the *optimized*
graph of the production session (``SessionOptions.optimized_model_filepath``): the
capture session then fuses exactly as production does, which is checked by comparing
the op types of both optimized graphs.

At level ``all`` on x86 the NCHWc layout transformer renames nearly every value of a
CNN (blocked layout, ``reorder_token_N``); then the capture runs with that one
transformer disabled, and its final outputs are compared with the production
session's, bitwise, on every run: the report says which was done and whether they
matched.
"""

from __future__ import annotations

import logging
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.judge.compare import compare_arrays
from bisect_onnx.runtime.onnxruntime.placement import ProfileFolder, kernels_by_output
from bisect_onnx.runtime.onnxruntime.sessions import SessionSettings, create_session

if TYPE_CHECKING:
    import numpy.typing as npt
    import onnx
    import onnxruntime as ort

    from bisect_onnx.runtime.sides import JsonObject

__all__ = ["CapturePlan", "plan_capture", "NCHWC_TRANSFORMER", "NCHWC_DOMAIN",
           "graph_nodes", "op_counts", "session_and_graph", "matches_production"]

logger = logging.getLogger(__name__)

NCHWC_TRANSFORMER = "NchwcTransformer"
#: The domain of the nodes that transformer writes (Conv, ReorderInput, ...).
NCHWC_DOMAIN = "com.microsoft.nchwc"
# Capture against production on providers that are not bitwise deterministic.
GPU_RTOL = 1e-5
GPU_ATOL = 1e-6
# Below this share of surviving value names, the layout transformer is taken to have
# renamed the graph, and capture runs without it.
_SURVIVAL_FLOOR = 0.5


@dataclass
class CapturePlan:
    """How the capture session is made, and what it promotes."""

    mode: str
    """``all values``, ``fusion-preserving`` or ``fusion-preserving, NCHWc layout
    transformer disabled``."""
    promoted: set[str] | None
    """Value names to promote; ``None`` for every node output."""
    disabled_optimizers: list[str] = field(default_factory=list)
    production_session: ort.InferenceSession | None = None
    """The plain session, as production runs it, made where production must run (the
    capture's optimized graph is not production's); released after each run when the
    model is big (:data:`bisect_onnx.runtime.onnxruntime.runner.HOLD_WEIGHTS_ONCE_ABOVE`)."""
    survivors: int = 0
    values: int = 0
    production_ops: dict[str, int] = field(default_factory=dict)
    """Op type counts of the optimized graph the capture mirrors: production's, or
    with the NCHWc transformer disabled, production's without it."""
    capture_ops: dict[str, int] = field(default_factory=dict)
    production_nodes: list[tuple] = field(default_factory=list)
    """Production's optimized graph node by node (op, inputs, outputs, attributes);
    empty where the capture mirrors another graph (NCHWc disabled)."""
    capture_nodes: list[tuple] = field(default_factory=list)
    capture_producers: dict[str, str] = field(default_factory=dict)
    """The capture's optimized graph: each value -> the node (kernel) computing it."""

    @property
    def same_graph_as_production(self) -> bool:
        """The capture's optimized graph is production's node for node.

        Only its graph outputs are more: it runs the very kernels production runs.
        """
        return bool(self.production_nodes) and self.capture_nodes == self.production_nodes

    def describe(self) -> JsonObject:
        """The plan for the report's ``capture`` entry."""
        return {
            "mode": self.mode,
            "promoted": len(self.promoted) if self.promoted is not None else None,
            "surviving_values": self.survivors,
            "values": self.values,
            "disabled_optimizers": list(self.disabled_optimizers),
            # Against production's optimized graph, less the disabled optimizers.
            "fusions_match_production": (self.capture_ops == self.production_ops
                                         if self.capture_ops else None),
        }


def plan_capture(model: onnx.ModelProto, path: Path, *, promote: str, provider: str,
                 opt_level: str, label: str, source: bytes | Path | None = None) -> CapturePlan:
    """Decide what to promote from the optimized graph of the production session.

    The production session reads the file at ``path`` itself, or ``source``, its bytes
    with its weights referenced where they lie in it: serializing a model with its
    weights inline takes the better part of a second on BERT-base.
    """
    model_dir = path.resolve().parent
    source = path if source is None else source
    names = [name for node in model.graph.node if node.op_type != "Constant"
             for name in node.output if name]
    if promote == "all":
        return CapturePlan(mode="all values", promoted=None, values=len(names))
    with tempfile.TemporaryDirectory(prefix="bisect-onnx-optimized-") as folder:
        # Production's graph only: a production session to run is made if one is needed
        # (the capture's optimized graph turns out not to be production's). At "all", a
        # CNN's layout transformer will make the capture's graph another (below): then
        # this session is the production session to run, and is made whole.
        convolutional = opt_level == "all" and any(node.op_type == "Conv"
                                                   for node in model.graph.node)
        settings = SessionSettings(provider, opt_level)
        production, optimized = session_and_graph(source, model_dir, Path(folder), settings,
                                                   label, graph_only=not convolutional)
        survivors = _survivors(optimized, names)
        plan = CapturePlan(mode="fusion-preserving", promoted=survivors,
                           production_session=production if convolutional else None,
                           survivors=len(survivors),
                           values=len(names), production_ops=op_counts(optimized),
                           production_nodes=graph_nodes(optimized))
        # Only the layout transformer's renaming calls for a capture without it: values
        # fused away elsewhere (an attention fusion) are the capture's to miss anyway.
        if (opt_level == "all" and names and len(survivors) < _SURVIVAL_FLOOR * len(names)
                and _has_nchwc_nodes(optimized)):
            _, optimized = session_and_graph(
                source, model_dir, Path(folder),
                replace(settings, disabled_optimizers=(NCHWC_TRANSFORMER,)), label,
                graph_only=True)
            plan.promoted = _survivors(optimized, names)
            plan.survivors = len(plan.promoted)
            plan.mode = "fusion-preserving, NCHWc layout transformer disabled"
            plan.disabled_optimizers = [NCHWC_TRANSFORMER]
            plan.production_ops = op_counts(optimized)
            plan.production_nodes = []  # the capture mirrors this graph, not production's
            logger.info("only %d of %d values survive the NCHWc layout transformer: "
                        "capturing without it", len(survivors), len(names))
    return plan


def check_capture_graph(plan: CapturePlan, promoted_bytes: bytes, model_dir: Path, *,
                        provider: str, opt_level: str, label: str,
                        profile: ProfileFolder | None = None) -> ort.InferenceSession:
    """The capture session; its optimized graph's op types are recorded in the plan.

    ``profile``: the session profiles its runs there (which provider ran each kernel).
    """
    settings = SessionSettings(provider, opt_level, tuple(plan.disabled_optimizers))
    with tempfile.TemporaryDirectory(prefix="bisect-onnx-optimized-") as folder:
        session, optimized = session_and_graph(promoted_bytes, model_dir, Path(folder),
                                                settings, label, profile=profile)
    plan.capture_ops = op_counts(optimized)
    plan.capture_nodes = graph_nodes(optimized)
    plan.capture_producers = kernels_by_output(optimized)
    if plan.production_ops and plan.capture_ops != plan.production_ops:
        logger.info("the capture session fuses differently from production: %s vs %s",
                       plan.capture_ops, plan.production_ops)
    return session


def session_and_graph(serialized: bytes | Path, model_dir: Path, folder: Path,
                      settings: SessionSettings, label: str, *, graph_only: bool = False,
                      profile: ProfileFolder | None = None,
                      ) -> tuple[ort.InferenceSession, onnx.ModelProto]:
    """A session on ``serialized`` and the optimized graph ORT wrote for it (no weights)."""
    import onnx

    path = folder / f"optimized{len(list(folder.iterdir()))}.onnx"
    session = create_session(serialized, model_dir=model_dir, label=label, settings=settings,
                             optimized_path=path, graph_only=graph_only, profile=profile)
    return session, onnx.load(str(path), load_external_data=False)


def _has_nchwc_nodes(optimized: onnx.ModelProto) -> bool:
    """Whether the NCHWc layout transformer rewrote any node of an optimized graph."""
    return any(node.domain == NCHWC_DOMAIN for node in optimized.graph.node)


def _survivors(optimized: onnx.ModelProto, names: Sequence[str]) -> set[str]:
    present = {name for node in optimized.graph.node for name in node.output}
    present.update(value.name for value in optimized.graph.output)
    return {name for name in names if name in present}


def graph_nodes(optimized: onnx.ModelProto) -> list[tuple]:
    """Each node's op, inputs, outputs and attributes, in graph order."""
    return [(node.domain, node.op_type, tuple(node.input), tuple(node.output),
             tuple(hash(attribute.SerializeToString()) for attribute in node.attribute))
            for node in optimized.graph.node]


def op_counts(optimized: onnx.ModelProto) -> dict[str, int]:
    """How many nodes of each op type (``domain:op`` outside the default domain)."""
    return dict(Counter(f"{node.domain}:{node.op_type}" if node.domain else node.op_type
                        for node in optimized.graph.node))


def matches_production(output_names: Sequence[str], by_name: Mapping[str, npt.ArrayLike],
                       expected: Sequence[npt.ArrayLike], *,
                       exact: bool) -> tuple[bool, float | None]:
    """Whether the capture's final outputs are production's, and by how much not.

    ``exact``: bitwise (the CPU provider); else within a tight tolerance, since GPU
    providers are not deterministic run to run. The difference is the first differing
    output's largest, where it has one.
    """
    for name, array in zip(output_names, expected, strict=True):
        got = np.asarray(by_name[name])
        array = np.asarray(array)
        same = (np.array_equal(got, array, equal_nan=True) if exact
                else compare_arrays(array, got, rtol=GPU_RTOL, atol=GPU_ATOL).passed)
        if not same:
            difference = (float(np.nanmax(np.abs(got.astype(np.float64) - array)))
                          if got.shape == array.shape and got.dtype.kind in "fc"
                          and got.size else None)
            logger.info("the capture session's output %s differs from production's "
                        "(max abs %s)", name, difference)
            return False, difference
    return True, None
