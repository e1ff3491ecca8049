r"""The fix searches on the planted cases: keep-list size and search time.

Usage (from the repo root; needs onnxconverter-common)::

    python benchmarks/fixes.py --repeats 3

For each planted case of ``tests/fixes`` (float16 overflow of a large weight, float16
cancellation, a QDQ weight scale planted x8, an ONNX Runtime fusion that changes the
result: the same file optimized against itself unoptimized) it prints the size of the
fix (nodes kept in float32, left unquantized, optimizers disabled) against blocking the
whole op types those nodes have
(``op_block_list``: how many nodes that keeps, and whether it passes), and the time of
``bisect_onnx_models(..., suggest_fix=True)`` against one plain ``bisect_onnx_models``
run (median of ``--repeats``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path

import numpy as np
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bisect_onnx  # noqa: E402
from tests.fixes.precision_models import cancellation_model, large_weight_model  # noqa: E402
from tests.fixes.test_optimizer_fix import _scaled_matmul  # noqa: E402
from tests.fixes.test_qdq_fix import _float_and_qdq  # noqa: E402


def _cases():
    from bisect_onnx.fixes.precision_convert import float16_keeping

    inputs = {"x": np.random.default_rng(0).normal(0, 1, (4, 32)).astype(np.float32)}
    for name, build in (("float16 large weight", large_weight_model),
                        ("float16 cancellation", cancellation_model)):
        reference = build()
        yield name, reference, float16_keeping(reference, [], keep_io_types=True), inputs, {}
    with tempfile.TemporaryDirectory() as folder:
        reference, qdq, inputs = _float_and_qdq(Path(folder))
    for tensor in qdq.graph.initializer:
        if tensor.name == "w2_scale":
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor) * 8, tensor.name))
    yield "QDQ scale x8", reference, qdq, inputs, {}
    model, arrays = _scaled_matmul()
    yield "ORT MatMulScaleFusion", model, model, arrays, {
        "reference_runtime": bisect_onnx.RuntimeOptions(opt_level="disabled"),
        "candidate_runtime": bisect_onnx.RuntimeOptions(opt_level="all")}


def _median_time(call, repeats: int):
    times, result = [], None
    for _ in range(repeats):
        began = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - began)
    return statistics.median(times), result


def main() -> None:
    """Print the table of docs/benchmarks.md's fix-search section."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    print("| case | fix | nodes | whole op types (nodes, passes) | plain s | with fix s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, reference, candidate, inputs, runtimes in _cases():
        compare = partial(bisect_onnx.bisect_onnx_models, reference, candidate, inputs,
                          **runtimes)
        plain, _ = _median_time(compare, args.repeats)
        fixing, report = _median_time(partial(compare, suggest_fix=True), args.repeats)
        fix = next((f for f in report.fixes if f.reaches_parity), None)
        if fix is None:
            print(f"| {name} | none found | - | - | {plain:.2f} | {fixing:.2f} | "
                  f"{fixing / plain:.1f}x |")
            continue
        details = fix.details
        if "node_block_list" in details:
            size = f"{details['nodes_kept_float32']} of {details['nodes']} kept float32"
            types = (f"{', '.join(details['op_block_list'])}: "
                     f"{details['op_block_list_nodes']}, "
                     f"{'passes' if details['op_block_list_passes'] else 'fails'}")
        elif "disabled_optimizers" in details:
            size = f"disable {', '.join(details['disabled_optimizers'])}"
            types = "-"
        else:
            size = f"{details['nodes_left_unquantized']} of {details['quantized_nodes']} " \
                   "left unquantized"
            types = "-"
        print(f"| {name} | {fix.change.split(':')[0]} | {size} | {types} | {plain:.2f} | "
              f"{fixing:.2f} | {fixing / plain:.1f}x |")


if __name__ == "__main__":
    main()
