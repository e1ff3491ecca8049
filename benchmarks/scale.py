"""Scale run: a ~1B-parameter decoder-only transformer end to end; print a markdown table.

Usage (from the repo root; needs about 16 GB of free memory and 10 GB of disk)::

    python benchmarks/scale.py                       # a temporary folder, removed after
    python benchmarks/scale.py --workdir /tmp/scale  # kept, and the export reused next time
    python benchmarks/scale.py --layers 2            # a quick smoke run (~0.2B parameters)

The model is :class:`fixtures.architectures.GPT2` at hidden 2048, 16 heads, MLP 8192,
vocabulary 32000 and 19 layers (random weights, float32, nothing downloaded), on one
sequence of 32 tokens so that activations stay small. Each step runs in a fresh
process whose wall time and peak resident memory (``ru_maxrss`` from ``wait4``) are
measured from outside:

- the export: build the model, ``torch.onnx.export(dynamo=True)``, save with every
  weight in one external data file (skipped when ``--workdir`` already holds it);
- bisect-onnx as the CLI process, ``--onnx`` pointing to the export; again with a
  memory budget too small for a full capture (``--max-memory 1MB``); then without
  ``--onnx`` (bisect-onnx exports the model into its temporary folder);
- bisect-onnx through the API, in-process (model building excluded from the time).

:func:`decoder_1b` is also the zero-argument factory the CLI is given
(``benchmarks/scale.py:decoder_1b``), so keep this module free of side effects.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# The worker processes read the layer count from here, so that the CLI's zero-argument
# factory builds the same model as the export.
LAYERS_VARIABLE = "BISECT_ONNX_SCALE_LAYERS"
DEFAULT_LAYERS = 19  # 19 x 50.4M + embeddings: 1.02 billion parameters
SEQUENCE = 32


def decoder_1b():
    """The benchmark's decoder-only transformer (random weights, eval mode)."""
    from fixtures.architectures import GPT2, TransformerConfig, _build

    config = TransformerConfig(layers=int(os.environ.get(LAYERS_VARIABLE, DEFAULT_LAYERS)),
                               hidden=2048, heads=16, intermediate=8192, vocab=32000,
                               seq=SEQUENCE, max_positions=1024)
    return _build(GPT2, {"scale": config}, "scale", transformer_init=True)


# --- workers: run in their own process, print one JSON line ---------------------------


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_export(folder: Path) -> dict:
    """Build the model, export it with the dynamo exporter, save with external data."""
    import numpy as np
    import torch

    start = time.perf_counter()
    model = decoder_1b()
    built = time.perf_counter() - start
    inputs = {"input_ids": np.random.default_rng(0).integers(0, 32000, size=(1, SEQUENCE),
                                                             dtype=np.int64)}
    np.savez(folder / "inputs.npz", **inputs)
    start = time.perf_counter()
    with torch.no_grad():
        program = torch.onnx.export(model, (torch.from_numpy(inputs["input_ids"]),),
                                    dynamo=True, verbose=False)
    translated = time.perf_counter() - start
    program.save(str(folder / "model.onnx"), external_data=True)
    return {"build_seconds": built, "export_seconds": translated,
            "save_seconds": time.perf_counter() - start - translated,
            "parameters": sum(p.numel() for p in model.parameters()),
            "peak_rss_mb": _peak_rss_mb()}


def worker_api(folder: Path) -> dict:
    """bisect-onnx through the API, the export given; the model's building not timed."""
    import numpy as np

    import bisect_onnx

    model = decoder_1b()
    with np.load(folder / "inputs.npz") as archive:
        inputs = {key: archive[key] for key in archive.files}
    start = time.perf_counter()
    report = bisect_onnx.bisect(model, inputs, onnx_model=folder / "model.onnx")
    return {"seconds": time.perf_counter() - start, "peak_rss_mb": _peak_rss_mb(),
            "verdict": report.verdict,
            "max_abs_error": max((record.max_abs_error or 0.0)
                                 for record in report.final_outputs)}


WORKERS = {"export": worker_export, "api": worker_api}


# --- the driver ---------------------------------------------------------------------------


def run_process(command: list[str], env: dict[str, str]) -> tuple[float, float, int, str]:
    """Wall seconds, peak RSS (MB), exit status and stdout of one child process."""
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True, env=env)
    stdout = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    process.stdout.close()
    return (time.perf_counter() - start, usage.ru_maxrss / 1024,
            os.waitstatus_to_exitcode(status), stdout)


def run_worker(kind: str, folder: Path, env: dict[str, str]) -> tuple[float, float, dict]:
    """Run one worker in a fresh process: its wall time, peak RSS and what it printed."""
    seconds, rss, status, stdout = run_process(
        [sys.executable, __file__, "--worker", kind, str(folder)], env)
    lines = stdout.strip().splitlines()
    result = json.loads(lines[-1]) if status == 0 and lines else {
        "error": f"the {kind} worker exited with status {status} (rerun it alone)"}
    return seconds, rss, result


def _verdict(status: int) -> str:
    return {0: "parity", 1: "diverged"}.get(status, f"exit status {status}")


def _machine() -> str:
    """CPUs, memory, and what else was running (load average, memory available)."""
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text()
                   .splitlines())
    total, available = (int(meminfo[key].split()[0]) / 2**20
                        for key in ("MemTotal", "MemAvailable"))
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return (f"{platform.machine()}, {os.cpu_count()} CPUs, {total:.0f} GiB "
            f"({available:.1f} GiB available at the start), load average {load}, "
            f"Python {platform.python_version()}")


def main() -> int:
    """Export once (unless the workdir holds an export), run bisect-onnx twice, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path,
                        help="keep the export here (reused when present)")
    parser.add_argument("--layers", type=int, default=DEFAULT_LAYERS)
    parser.add_argument("--skip-api", action="store_true", help="no in-process run")
    parser.add_argument("--skip-export-here", action="store_true",
                        help="no CLI run that exports the model itself")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, folder = args.worker
        print(json.dumps(WORKERS[kind](Path(folder))))
        return 0

    env = {**os.environ, LAYERS_VARIABLE: str(args.layers), "PYTHONPATH": str(REPO)}
    print(f"bisect-onnx scale run, {time.strftime('%Y-%m-%d %H:%M')}, {_machine()}\n")
    with tempfile.TemporaryDirectory(prefix="bisect-onnx-scale-") as tmp:
        folder = args.workdir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        reused = (folder / "export.json").exists()
        if not reused:
            seconds, rss, result = run_worker("export", folder, env)
            if "error" in result:
                print(result["error"])
                return 1
            result.update(seconds=seconds, process_peak_rss_mb=rss)
            (folder / "export.json").write_text(json.dumps(result))
        export = json.loads((folder / "export.json").read_text())
        rows = [(f"build the model (random init) and export it (export "
                 f"{export['export_seconds']:.0f} s, save {export['save_seconds']:.0f} s)"
                 f"{', earlier run' if reused else ''}", export["seconds"],
                 export["process_peak_rss_mb"], "")]
        onnx_bytes = sum(path.stat().st_size for path in folder.glob("model.onnx*"))
        command = [sys.executable, "-m", "bisect_onnx", "benchmarks/scale.py:decoder_1b",
                   "--input", str(folder / "inputs.npz"), "--onnx", str(folder / "model.onnx"),
                   "--json", str(folder / "report.json"), "-q"]
        seconds, rss, status, _ = run_process(command, env)
        rows.append(("bisect-onnx CLI process (`--onnx`)", seconds, rss, _verdict(status)))
        # A budget too small for both sides' values: production's outputs, then probes.
        seconds, rss, status, _ = run_process([*command, "--max-memory", "1MB"], env)
        rows.append(("bisect-onnx CLI process (`--onnx --max-memory 1MB`: probes, not a "
                     "full capture)", seconds, rss, _verdict(status)))
        if not args.skip_export_here:
            seconds, rss, status, _ = run_process(
                [argument for argument in command if argument != "--onnx"
                 and argument != str(folder / "model.onnx")], env)
            rows.append(("bisect-onnx CLI process, exporting the model itself", seconds, rss,
                         _verdict(status)))
        if not args.skip_api:
            seconds, rss, result = run_worker("api", folder, env)
            rows.append(("bisect-onnx API, in-process (model building not timed)",
                         result.get("seconds", seconds), rss,
                         result.get("verdict") or result.get("error", "")))
    print(f"decoder-only transformer, {args.layers} layers, hidden 2048, "
          f"{export['parameters'] / 1e9:.2f} billion parameters (float32), sequence "
          f"{SEQUENCE}; ONNX file and external data {onnx_bytes / 2**30:.2f} GiB\n")
    print("| measurement | seconds | peak RSS (MB) | verdict |")
    print("|---|---:|---:|---|")
    for name, seconds, rss, verdict in rows:
        print(f"| {name} | {seconds:.1f} | {'' if rss is None else f'{rss:.0f}'} | {verdict} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
