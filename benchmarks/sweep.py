r"""The sweep's cost where every combination passes: ``--sweep`` against one comparison.

Usage (from the repo root)::

    python benchmarks/sweep.py --repeats 3

For each model (a small MLP, a small CNN), exported once with the
TorchScript exporter at batch 4 with a dynamic batch (so the export's time counts in
neither figure), it times ``bisect(model, x, onnx_model=path)`` (one comparison) and the
same with ``SearchOptions(sweep=True)``: the sample, then 5 batch sizes (the sample's 4,
1, 2, 7, 8) x 3 input scales, final outputs only, all passing, then the sample's
comparison (median of ``--repeats``; PyTorch on ``--torch-threads``, 1 by default).
Issue 50 asks the sweep to stay within 3x.
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
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bisect_onnx  # noqa: E402


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                          torch.nn.Linear(256, 256), torch.nn.GELU(),
                                          torch.nn.Linear(256, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x).softmax(-1)


def _models():
    torch.manual_seed(0)
    yield "MLP 64-256-256-10", _Mlp().eval(), (4, 64)
    convolutions = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, padding=1, stride=2), torch.nn.BatchNorm2d(64),
        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(64, 10))
    yield "small CNN 3x32x32", convolutions.eval(), (4, 3, 32, 32)


def _median_time(call, repeats: int):
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main() -> None:
    """Time both runs on each model and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--torch-threads", type=int, default=1,
                        help="PyTorch's intra-op threads (default 1: on a loaded machine its "
                        "threads spin against each other, and small forwards take 30x longer)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.torch_threads)
    print("| model | combinations | one comparison s | with --sweep s | ratio |")
    print("|---|---|---|---|---|")
    sweep = bisect_onnx.SearchOptions(sweep=True)
    with tempfile.TemporaryDirectory() as folder:
        for name, model, shape in _models():
            x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
            path = Path(folder) / "model.onnx"
            torch.onnx.export(model, (torch.from_numpy(x),), str(path), dynamo=False,
                              input_names=["x"], dynamic_axes={"x": {0: "batch"}})
            plain, report = _median_time(partial(bisect_onnx.bisect, model, x, onnx_model=path),
                                         args.repeats)
            assert not report.diverged
            swept, report = _median_time(partial(bisect_onnx.bisect, model, x, onnx_model=path,
                                                 search=sweep), args.repeats)
            assert not report.diverged and report.sweep.bisected is None
            shapes = len({row.shapes for row in report.sweep.rows})
            combos = f"{shapes} shapes x 3 scales + the sample ({len(report.sweep.rows)} runs)"
            print(f"| {name} | {combos} | {plain:.3f} | {swept:.3f} | {swept / plain:.1f}x |")


if __name__ == "__main__":
    main()
