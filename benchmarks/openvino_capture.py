r"""OpenVINO's capture on the fixtures: what it keeps, what it costs, against ONNX Runtime.

Usage (from the repo root; needs the ``openvino`` extra)::

    python benchmarks/openvino_capture.py [--precision f32|f16|bf16]

For each fixture it prints production's executed layers, the values leaving them
(the candidates), how many the capture keeps after the rounds, whether its layers are
production's and its final outputs bitwise, and the wall time of one ``bisect`` run
in OpenVINO and in ONNX Runtime (best of three, same inputs, the clean export).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bisect_onnx  # noqa: E402
from bisect_onnx.runtime.openvino.runner import OpenVinoRunner  # noqa: E402
from fixtures.registry import FIXTURES, build_model, load_inputs, repo_path  # noqa: E402

NAMES = ("tiny_mlp", "resnet_like", "tiny_transformer", "functional_attention",
         "two_inputs", "reused_block")


def _best_time(run, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    """Print one line per fixture."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=("f32", "f16", "bf16"), default=None)
    precision = parser.parse_args().precision
    print("fixture | precision | layers | candidates | captured | rounds | layers match | "
          "outputs bitwise | bisect OpenVINO s | bisect ORT s")
    runtime = bisect_onnx.RuntimeOptions(runtime="openvino", precision=precision)
    for name in NAMES:
        fixture = FIXTURES[name]
        path, inputs = repo_path(fixture.onnx_file), load_inputs(fixture)
        side = OpenVinoRunner(path, precision=precision)
        ran = side.run(list(inputs.values()))
        plan = side.plan
        model = build_model(fixture)
        ours = _best_time(lambda m=model, i=inputs, p=path: bisect_onnx.bisect(
            m, i, onnx_model=p, runtime=runtime))
        ort = _best_time(lambda m=model, i=inputs, p=path: bisect_onnx.bisect(
            m, i, onnx_model=p))
        print(f"{name} | {side.precision} | {len(plan.production_layers)} | "
              f"{len(plan.candidates)} | {len(plan.captured)} | {plan.rounds} | "
              f"{plan.layers_match_production} | {ran.production.matches} | "
              f"{ours:.2f} | {ort:.2f}")


if __name__ == "__main__":
    main()
