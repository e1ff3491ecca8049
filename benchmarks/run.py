"""Benchmark bisect-onnx against the floor and torch.onnx.verification; print a markdown table.

Usage (from the repo root; takes several minutes on 2 cores)::

    python benchmarks/run.py                 # everything, 3 repetitions
    python benchmarks/run.py --reps 5 --skip-verify --coverage-size small

For ResNet-50 and BERT-base (full size) the model is exported once; then, in the same
run, each measurement is repeated and its median reported, with peak resident memory:

- floor: one PyTorch forward + one ORT session with every value promoted + one run,
  timed in-process (imports and model building excluded) and as a whole process;
- bisect-onnx end to end with the model and the ONNX file given (export excluded),
  through the API in-process and as the CLI process;
- torch.onnx.verification.verify_onnx_program(compare_intermediates=True), once, on
  ResNet-50 (it builds an ORT session per node).

Then alignment coverage for every architecture of ``fixtures/architectures.py`` with
both exporters (where the exporter can export it). Every in-process figure comes from
a fresh worker process, so no measurement warms another's caches.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CLI_FACTORIES = {"resnet50": "benchmarks/models.py:resnet50_full",
                 "bert_base": "benchmarks/models.py:bert_base_full"}


# --- workers: run in their own process, print one JSON line ---------------------------


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _quiet() -> None:
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)


def _load(arch: str, folder: Path):
    import numpy as np

    from fixtures.architectures import ARCHITECTURES

    model = ARCHITECTURES[arch].factory("full")
    with np.load(folder / "inputs.npz") as archive:
        inputs = {key: archive[key] for key in archive.files}
    return model, inputs


def worker_floor(arch: str, folder: Path) -> dict:
    """One forward, one promoted session, one run: the least any such tool must do."""
    _quiet()
    import onnx
    import onnxruntime as ort
    import torch

    model, inputs = _load(arch, folder)
    start = time.perf_counter()
    with torch.no_grad():
        model(*[torch.from_numpy(array) for array in inputs.values()])
    proto = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    present = {value.name for value in proto.graph.output}
    for node in proto.graph.node:
        for name in node.output:
            if name and name not in present:
                proto.graph.output.append(onnx.ValueInfoProto(name=name))
                present.add(name)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                     str(folder))
    session = ort.InferenceSession(proto.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    feeds = dict(zip([i.name for i in session.get_inputs()], inputs.values(), strict=True))
    session.run(None, feeds)
    return {"seconds": time.perf_counter() - start, "peak_rss_mb": _peak_rss_mb()}


def worker_bisect(arch: str, folder: Path) -> dict:
    """bisect-onnx through the API, model and ONNX file given."""
    _quiet()
    # The libraries the floor imports before its clock starts, imported here too.
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401
    import torch  # noqa: F401

    import bisect_onnx

    model, inputs = _load(arch, folder)
    start = time.perf_counter()
    report = bisect_onnx.bisect(model, inputs, onnx_model=folder / "model.onnx")
    return {"seconds": time.perf_counter() - start, "peak_rss_mb": _peak_rss_mb(),
            "verdict": report.verdict}


def worker_verify(arch: str, folder: Path) -> dict:
    """torch.onnx.verification with intermediates, on an in-memory export (excluded)."""
    _quiet()
    import torch
    from torch.onnx.verification import verify_onnx_program

    model, inputs = _load(arch, folder)
    args = tuple(torch.from_numpy(array) for array in inputs.values())
    program = torch.onnx.export(model, args, dynamo=True, verbose=False)
    start = time.perf_counter()
    infos = verify_onnx_program(program, compare_intermediates=True)
    return {"seconds": time.perf_counter() - start, "peak_rss_mb": _peak_rss_mb(),
            "values": len(infos)}


def worker_coverage(arch: str, size: str, exporter: str) -> dict:
    """Alignment coverage of one architecture under one exporter (export made by bisect-onnx)."""
    _quiet()
    import bisect_onnx
    from fixtures.architectures import ARCHITECTURES

    entry = ARCHITECTURES[arch]
    try:
        report = bisect_onnx.bisect(entry.factory(size), entry.make_inputs(size),
                                    export=bisect_onnx.ExportOptions(exporter=exporter))
    except bisect_onnx.BisectOnnxError as error:
        return {"error": str(error)[:160]}
    coverage = report.coverage
    return {"verdict": report.verdict, "onnx_nodes": coverage.onnx_nodes,
            "attributed_nodes": coverage.attributed_nodes,
            "torch_modules": coverage.torch_modules,
            "aligned_modules": coverage.aligned_modules,
            "onnx_values": coverage.onnx_values, "aligned_values": coverage.aligned_values}


WORKERS = {"floor": worker_floor, "bisect": worker_bisect, "verify": worker_verify}


# --- the driver ---------------------------------------------------------------------------


def run_process(command: list[str]) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MB) and stdout of one child process."""
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    stdout = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.stdout.close()
    process.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - start, usage.ru_maxrss / 1024, stdout


def run_worker(*args: str) -> dict:
    """Run one worker in a fresh process and return what it printed."""
    _, _, stdout = run_process([sys.executable, __file__, "--worker", *args])
    lines = stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {"error": "the worker failed (rerun it alone)"}


def export_once(arch: str, folder: Path) -> float:
    """Export the full-size model and save its inputs; return the export's seconds."""
    _quiet()
    import numpy as np
    import torch

    from fixtures.architectures import ARCHITECTURES

    entry = ARCHITECTURES[arch]
    inputs = entry.make_inputs("full")
    np.savez(folder / "inputs.npz", **inputs)
    model = entry.factory("full")
    start = time.perf_counter()
    program = torch.onnx.export(model, tuple(torch.from_numpy(a) for a in inputs.values()),
                                dynamo=True, verbose=False)
    seconds = time.perf_counter() - start
    program.save(str(folder / "model.onnx"), external_data=True)
    return seconds


def median_of(reps: int, measure) -> tuple[float, float]:
    """Median seconds and largest peak RSS of ``reps`` measurements."""
    results = [measure() for _ in range(reps)]
    return (statistics.median(r[0] for r in results), max(r[1] for r in results))


def benchmark_model(arch: str, reps: int, verify: bool) -> dict:
    """Every timing row of one full-size model: name -> (seconds, peak RSS MB)."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{arch}-") as tmp:
        folder = Path(tmp)
        export_seconds = export_once(arch, folder)
        inputs = ["--input", str(folder / "inputs.npz")]
        rows = {"export (once, not counted below)": (export_seconds, None)}

        def worker(kind):
            return lambda: (lambda r: (r["seconds"], r["peak_rss_mb"]))(
                run_worker(kind, arch, str(folder)))

        def process(command):
            return lambda: run_process(command)[:2]

        rows["floor, in-process"] = median_of(reps, worker("floor"))
        rows["floor, whole process"] = median_of(reps, process(
            [sys.executable, __file__, "--worker", "floor", arch, str(folder)]))
        rows["bisect-onnx API, in-process"] = median_of(reps, worker("bisect"))
        rows["bisect-onnx CLI process"] = median_of(reps, process(
            [sys.executable, "-m", "bisect_onnx", CLI_FACTORIES[arch], *inputs,
             "--onnx", str(folder / "model.onnx")]))
        if verify:
            result = run_worker("verify", arch, str(folder))
            if "seconds" in result:
                rows["verify_onnx_program(compare_intermediates=True), once"] = (
                    result["seconds"], result["peak_rss_mb"])
        return rows


def main() -> int:
    """Run the benchmark (or, with --worker, one measurement) and print markdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--skip-verify", action="store_true",
                        help="skip verify_onnx_program (minutes on ResNet-50)")
    parser.add_argument("--coverage-size", choices=("small", "full"), default="full")
    parser.add_argument("--models", default="resnet50,bert_base")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, *rest = args.worker
        if kind == "coverage":
            result = worker_coverage(*rest)
        else:
            result = WORKERS[kind](rest[0], Path(rest[1]))
        print(json.dumps(result))
        return 0

    from fixtures.architectures import ARCHITECTURES

    print(f"bisect-onnx benchmark, {time.strftime('%Y-%m-%d')}, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{args.reps} repetitions (medians; memory is the largest peak RSS)\n")
    for arch in args.models.split(","):
        rows = benchmark_model(arch, args.reps, verify=arch == "resnet50" and
                               not args.skip_verify)
        floor = rows["floor, in-process"][0]
        floor_process = rows["floor, whole process"][0]
        print(f"### {arch} (full size)\n")
        print("| measurement | seconds | × floor | peak RSS (MB) |")
        print("|---|---:|---:|---:|")
        for name, (seconds, rss) in rows.items():
            base = floor_process if "process" in name and "in-process" not in name else floor
            ratio = "" if "export" in name else f"{seconds / base:.1f}"
            memory = "" if rss is None else f"{rss:.0f}"
            print(f"| {name} | {seconds:.2f} | {ratio} | {memory} |")
        print()

    print(f"### Alignment coverage ({args.coverage_size} size, export made by bisect-onnx)\n")
    print("| architecture | exporter | ONNX nodes attributed | module calls compared | "
          "ONNX values compared | verdict |")
    print("|---|---|---:|---:|---:|---|")
    for arch in ARCHITECTURES:
        for exporter in ("dynamo", "torchscript"):
            result = run_worker("coverage", arch, args.coverage_size, exporter)
            if "error" in result:
                print(f"| {arch} | {exporter} | — | — | — | cannot export: {result['error']} |")
                continue
            print(f"| {arch} | {exporter} | "
                  f"{result['attributed_nodes']}/{result['onnx_nodes']} | "
                  f"{result['aligned_modules']}/{result['torch_modules']} | "
                  f"{result['aligned_values']}/{result['onnx_values']} | {result['verdict']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
