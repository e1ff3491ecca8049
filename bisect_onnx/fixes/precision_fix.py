"""The float16/bfloat16 fix: the smallest set of nodes to keep in float32.

The search (:mod:`bisect_onnx.fixes.precision_search`) starts from the failing region,
grows it until the rerun passes the float32 reference's tolerance and shrinks it while it
still passes. Each reported keep-list was rerun and passes; a search that finds none
reports the best improvement it tried, with its factor, as a non-fix. The keep-list is
compared with blocking whole op types (``op_block_list``), both sizes in the details.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from bisect_onnx.errors import InputError
from bisect_onnx.fixes.precision_convert import (
    bfloat16_keeping,
    float16_keeping,
    keep_io_types_of,
    low_precision_type,
)
from bisect_onnx.fixes.precision_rerun import Rerun, check_copy_fits, run_model
from bisect_onnx.fixes.precision_search import grow_then_shrink
from bisect_onnx.fixes.trial import FixKind, FixResult
from bisect_onnx.judge.tolerances import Tolerance

__all__ = ["find_float32_keep_list"]


def find_float32_keep_list(reference: onnx.ModelProto, candidate: onnx.ModelProto,
                           inputs: Mapping[str, np.ndarray], *, tolerance: Tolerance,
                           start: Sequence[str] = (), model_dir: Path | None = None,
                           budget_runs: int = 60, max_memory: int | None = None,
                           ) -> list[FixResult]:
    """Keep-lists that bring the low-precision ``candidate`` within tolerance of ``reference``.

    ``start`` names the failing region the bisection found; ``model_dir`` is unused here
    (models with external data are loaded with it by the caller) and kept for the
    dispatcher's uniform call. Returns one passing fix, or one improvement (not a fix).
    """
    del model_dir
    began = time.perf_counter()
    check_copy_fits(reference, max_memory)
    precision = low_precision_type(candidate)
    if precision is None:
        raise InputError("the float32 keep-list search needs a float16 or bfloat16 candidate")
    rerun = Rerun(run_model(reference, inputs), inputs, tolerance=tolerance)
    before = rerun.figures(candidate)
    if before.passes:
        return []
    keep_io = keep_io_types_of(candidate)

    def make(keep: frozenset[str], op_types: list[str] | None = None) -> onnx.ModelProto:
        if precision == TensorProto.FLOAT16:
            return float16_keeping(reference, keep, keep_io_types=keep_io, op_block_list=op_types)
        kept = keep if op_types is None else {n.name for n in candidate.graph.node
                                              if n.op_type in op_types}
        return bfloat16_keeping(candidate, kept, reference)

    source = reference if precision == TensorProto.FLOAT16 else candidate
    allowed = [n.name for n in source.graph.node if n.name and n.op_type != "Cast"]
    outcome = grow_then_shrink(source.graph, allowed, start,
                               lambda keep: rerun.failing_or(lambda: make(keep)),
                               budget_runs=budget_runs)
    chosen = outcome.passing if outcome.passing is not None else outcome.best
    fixed = make(chosen)
    after = rerun.figures(fixed)
    op_types = sorted({n.op_type for n in source.graph.node if n.name in chosen})
    by_type = rerun.failing_or(lambda: make(frozenset(), op_types))
    type_nodes = sum(n.op_type in op_types for n in source.graph.node)
    name = "float16" if precision == TensorProto.FLOAT16 else "bfloat16"
    details = {
        "precision": name, "node_block_list": sorted(chosen, key=allowed.index),
        "nodes_kept_float32": len(chosen), "nodes": len(allowed), "keep_io_types": keep_io,
        "op_block_list": op_types, "op_block_list_nodes": type_nodes,
        "op_block_list_passes": by_type.passes, "reruns": rerun.runs,
        "how": ("onnxconverter_common.float16.convert_float_to_float16(model, keep_io_types="
                f"{keep_io}, node_block_list=node_block_list)" if name == "float16" else
                "the candidate with the listed nodes in float32 between Casts "
                "(onnxconverter-common has no bfloat16 converter)"),
    }
    change = (f"keep {len(chosen)} of {len(allowed)} nodes in float32: "
              f"{', '.join(details['node_block_list'])}")
    return [FixResult(FixKind.KEEP_FLOAT32, change, before, after, details,
                      fixed.SerializeToString(), time.perf_counter() - began)]
