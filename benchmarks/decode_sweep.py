r"""Decode loops over tiny ``transformers`` decoders: parity, steps and time, both exporters.

Usage (from the repo root; needs the ``hf`` extra)::

    python benchmarks/decode_sweep.py [--steps 16] [--models gpt2,llama] [--json out.json]
    python benchmarks/decode_sweep.py --timing --steps 32 --models llama
    python benchmarks/decode_sweep.py --timing --steps 32 --models llama-1b \
        --exporters torchscript --workdir /tmp/decode-exports --repeat 3
    python benchmarks/decode_sweep.py --peak-memory --steps 32 --models llama-1b \
        --exporters torchscript --workdir /tmp/decode-exports

Each decoder of ``fixtures/decoders.py`` (random weights, two layers, nothing downloaded)
is exported by ``bisect_decode`` with each exporter and stepped ``--steps`` times on an
8-token prompt. A row: the verdict (``parity``; ``diverged at K (kind)``; ``no export``
with the exporter's reason), the export's and the loop's seconds.

``--timing`` also measures the floor of the loop: ``--steps`` + 1 PyTorch forwards with
the model's own cache and the attention mask, as ``generate`` runs them (``bare_torch``:
the same without a mask, which transformers then skips), and as many runs of one ONNX
Runtime session on the exported file (the compared values its outputs), against the
whole run on that file (session made, both sides, the teacher-forced and free-running
runs, the comparisons; the export not counted, as the floor has none). Best of
``--repeat`` runs each, interleaved; ``run_other`` is the run's time outside PyTorch's
and ONNX Runtime's calls (the session made, the comparisons). ``ratio`` is the run
against that floor; ``ratio_with_session`` counts the floor's session made too
(``floor_session``), as ``benchmarks/run.py``'s floors do.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bisect_onnx  # noqa: E402
from fixtures.decoders import TINY_DECODERS  # noqa: E402

EXPORTERS = ("torchscript", "dynamo")


def llama_medium() -> object:
    """A random Llama of 0.2B parameters (8 layers, width 1024, vocabulary 32000)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                         num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                         max_position_embeddings=2048)
    return LlamaForCausalLM(config).eval()


def llama_1b() -> object:
    """A random Llama of 1.1B parameters, TinyLlama's shape.

    22 layers, width 2048, 32 heads and 4 KV heads, MLP 5632, vocabulary 32000; 4.4 GB
    of float32 weights.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                         num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                         max_position_embeddings=2048)
    return LlamaForCausalLM(config).eval()


DECODERS = {**TINY_DECODERS, "llama-medium": llama_medium, "llama-1b": llama_1b}


def sweep_row(name: str, exporter: str, steps: int) -> dict[str, object]:
    """One decoder and exporter: the decode run's verdict and times."""
    model = DECODERS[name]()
    started = time.perf_counter()
    try:
        report = bisect_onnx.bisect_decode(
            model, steps=steps, export=bisect_onnx.ExportOptions(exporter=exporter))
    except bisect_onnx.BisectOnnxError as error:
        return {"model": name, "exporter": exporter, "verdict": "no export" if isinstance(
            error, bisect_onnx.ModelError) else "error", "reason": str(error)[:160],
            "seconds": time.perf_counter() - started}
    finding = report.finding
    verdict = ("parity" if finding is None
               else f"diverged at {finding.step} ({finding.kind}, {finding.where})")
    return {"model": name, "exporter": exporter, "verdict": verdict,
            "culprit": finding.culprit if finding else None,
            "worst_logits": max(row.free.logits.max_abs for row in report.rows),
            "export_s": report.seconds.get("export", 0.0),
            "loop_s": report.seconds["torch"] + report.seconds["runtime"],
            "seconds": report.seconds["total"]}


def exported(name: str, exporter: str, workdir: Path) -> Path:
    """The decoder's export in ``workdir``, made in a process of its own unless there.

    Its own process, so that the exporter's copies of the weights are not counted in
    (nor kept by) the process that measures.
    """
    path = workdir / f"{name}-{exporter}" / "decoder.onnx"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, __file__, "--export-child", name, exporter,
                        str(path.parent)], check=True)
    return path


def _export_child(name: str, exporter: str, folder: Path) -> None:
    from bisect_onnx.decode.export import export_decoder
    from bisect_onnx.decode.flat_cache import decoder_step

    export_decoder(decoder_step(DECODERS[name]()), folder, exporter=exporter)


def peak_row(name: str, exporter: str, steps: int, workdir: Path) -> dict[str, object]:
    """A run's peak resident memory, in a fresh process: the model built, then the run."""
    path = exported(name, exporter, workdir)
    child = subprocess.run([sys.executable, __file__, "--peak-child", name, str(path),
                            str(steps)], check=True, capture_output=True, text=True)
    figures = json.loads(child.stdout.strip().splitlines()[-1])
    return {"model": name, "exporter": exporter, "steps": steps,
            "file_mib": path.stat().st_size / 2**20 + sum(
                each.stat().st_size for each in path.parent.iterdir()
                if each != path) / 2**20, **figures}


def _peak_child(name: str, path: Path, steps: int) -> None:
    """Print the maximum resident set after the model is built, and after the run."""
    import resource

    from bisect_onnx.decode.run import bisect_decode

    def peak_mib() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

    model = DECODERS[name]()
    built = peak_mib()
    prompt = np.random.default_rng(0).integers(0, 100, size=(1, 8))
    report = bisect_decode(model, prompt, steps=steps, onnx_model=path)
    print(json.dumps({"verdict": report.verdict, "model_peak_mib": built,
                      "run_peak_mib": peak_mib(), "run_s": report.seconds["total"]}))


def timing_row(name: str, exporter: str, steps: int, repeat: int,
               workdir: Path | None = None) -> dict[str, object]:
    """The decode loop's time against its floor, best of ``repeat``."""
    from bisect_onnx.decode.export import export_decoder
    from bisect_onnx.decode.flat_cache import decoder_step
    from bisect_onnx.decode.run import bisect_decode

    path = exported(name, exporter, workdir) if workdir is not None else None
    model = DECODERS[name]()
    prompt = np.random.default_rng(0).integers(0, 100, size=(1, 8))
    runs: dict[str, list[float]] = {"run": [], "loop_torch": [], "loop_runtime": [],
                                    "run_other": [], "floor_torch": [], "floor_runtime": [],
                                    "bare_torch": [], "floor_session": []}
    with tempfile.TemporaryDirectory() as folder:
        if path is None:
            path = export_decoder(decoder_step(model), Path(folder), exporter=exporter)
        for _ in range(repeat):  # interleaved, so that a busy moment weighs on each alike
            report = bisect_decode(model, prompt, steps=steps, onnx_model=path)
            runs["run"].append(report.seconds["total"])
            runs["loop_torch"].append(report.seconds["torch"])
            runs["loop_runtime"].append(report.seconds["runtime"])
            # The rest of the run: the session, the comparisons, the file's names.
            runs["run_other"].append(report.seconds["total"] - report.seconds["torch"]
                                     - report.seconds["runtime"])
            runs["floor_torch"].append(_torch_floor(model, prompt, steps))
            runs["bare_torch"].append(_torch_floor(model, prompt, steps, mask=False))
            session_s, runtime_s = _runtime_floor(model, prompt, steps, path)
            runs["floor_runtime"].append(runtime_s)
            runs["floor_session"].append(session_s)
    best = {f"{key}_s": min(values) for key, values in runs.items()}
    floor = best["floor_torch_s"] + best["floor_runtime_s"]
    return {"model": name, "exporter": exporter, "steps": steps, **best, "floor_s": floor,
            "ratio": best["run_s"] / floor,
            "ratio_with_session": best["run_s"] / (floor + best["floor_session_s"])}


def _torch_floor(model: object, prompt: np.ndarray, steps: int, *, mask: bool = True) -> float:
    """``steps`` + 1 greedy forwards of the model with its own cache.

    With the attention mask, as ``generate`` passes it (and as the step takes it);
    ``mask=False`` is the bare forward, which transformers runs without a mask at all.
    """
    import torch

    tokens = torch.from_numpy(prompt)
    length = tokens.shape[1]

    def masked(total: int) -> dict[str, object]:
        return {"attention_mask": torch.ones((1, total), dtype=torch.long)} if mask else {}

    started = time.perf_counter()
    with torch.no_grad():
        out = model(input_ids=tokens, use_cache=True, **masked(length))
        for _ in range(steps):
            keyword = "cache" if getattr(out, "cache", None) is not None else "past_key_values"
            tokens, length = out.logits[:, -1:].argmax(-1), length + 1
            out = model(input_ids=tokens, use_cache=True, **{keyword: getattr(out, keyword)},
                        **masked(length))
    return time.perf_counter() - started


def _runtime_floor(model: object, prompt: np.ndarray, steps: int,
                   path: Path) -> tuple[float, float]:
    """The session's making, and ``steps`` + 1 runs of it, each fed the cache it returned."""
    from bisect_onnx.decode.flat_cache import decoder_step
    from bisect_onnx.decode.steps import RuntimeStepper, StepState, open_session

    step = decoder_step(model)
    started = time.perf_counter()
    session = open_session(path, provider="CPUExecutionProvider", opt_level="all")
    session_s = time.perf_counter() - started
    runner = RuntimeStepper(session, step.layout, path.name)
    empty = tuple(np.zeros((1, tail[0], 0, *tail[1:]), np.float32)
                  for pair in step.cache_tails or () for tail in pair)
    state = StepState(prompt, empty)
    started = time.perf_counter()
    for _ in range(steps + 1):
        state = state.after(runner.run(state))
    return session_s, time.perf_counter() - started


def main() -> None:
    """Run the sweep (or the timing) and print a line per decoder and exporter."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--models", default=",".join(TINY_DECODERS),
                        help="names of fixtures/decoders.py, llama-medium (0.2B) or "
                        "llama-1b (1.1B)")
    parser.add_argument("--exporters", default=",".join(EXPORTERS))
    parser.add_argument("--timing", action="store_true")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--workdir", type=Path,
                        help="keep the exports here (made in a process of their own), reuse")
    parser.add_argument("--peak-memory", action="store_true",
                        help="a run's peak resident memory in a fresh process (needs --workdir)")
    parser.add_argument("--export-child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--peak-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.export_child:
        name, exporter, folder = args.export_child
        return _export_child(name, exporter, Path(folder))
    if args.peak_child:
        name, path, steps = args.peak_child
        return _peak_child(name, Path(path), int(steps))
    rows = []
    for name in args.models.split(","):
        for exporter in args.exporters.split(","):
            if args.peak_memory:
                row = peak_row(name, exporter, args.steps, args.workdir)
            elif args.timing:
                row = timing_row(name, exporter, args.steps, args.repeat, args.workdir)
            else:
                row = sweep_row(name, exporter, args.steps)
            rows.append(row)
            print(_line(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


def _line(row: dict[str, object]) -> str:
    figures = "  ".join(f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}"
                        for key, value in row.items() if key not in ("model", "exporter"))
    return f"{row['model']:8} {row['exporter']:11} {figures}"


if __name__ == "__main__":
    main()
