r"""Decode loops over tiny ``transformers`` decoders: parity, steps and time, both exporters.

Usage (from the repo root; needs the ``hf`` extra)::

    python benchmarks/decode_sweep.py [--steps 16] [--models gpt2,llama] [--json out.json]
    python benchmarks/decode_sweep.py --timing --steps 32 --models llama

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
``--repeat`` runs each, interleaved.
"""

from __future__ import annotations

import argparse
import json
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


DECODERS = {**TINY_DECODERS, "llama-medium": llama_medium}


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


def timing_row(name: str, exporter: str, steps: int, repeat: int) -> dict[str, object]:
    """The decode loop's time against its floor, best of ``repeat``."""
    from bisect_onnx.decode.export import export_decoder
    from bisect_onnx.decode.flat_cache import decoder_step
    from bisect_onnx.decode.run import bisect_decode

    model = DECODERS[name]()
    prompt = np.random.default_rng(0).integers(0, 100, size=(1, 8))
    runs: dict[str, list[float]] = {"run": [], "loop_torch": [], "loop_runtime": [],
                                    "floor_torch": [], "floor_runtime": [], "bare_torch": []}
    with tempfile.TemporaryDirectory() as folder:
        path = export_decoder(decoder_step(model), Path(folder), exporter=exporter)
        for _ in range(repeat):  # interleaved, so that a busy moment weighs on each alike
            report = bisect_decode(model, prompt, steps=steps, onnx_model=path)
            runs["run"].append(report.seconds["total"])
            runs["loop_torch"].append(report.seconds["torch"])
            runs["loop_runtime"].append(report.seconds["runtime"])
            runs["floor_torch"].append(_torch_floor(model, prompt, steps))
            runs["bare_torch"].append(_torch_floor(model, prompt, steps, mask=False))
            runs["floor_runtime"].append(_runtime_floor(model, prompt, steps, path))
    best = {f"{key}_s": min(values) for key, values in runs.items()}
    floor = best["floor_torch_s"] + best["floor_runtime_s"]
    return {"model": name, "exporter": exporter, "steps": steps, **best, "floor_s": floor,
            "ratio": best["run_s"] / floor}


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


def _runtime_floor(model: object, prompt: np.ndarray, steps: int, path: Path) -> float:
    """``steps`` + 1 runs of one session, each fed the cache it returned."""
    from bisect_onnx.decode.flat_cache import decoder_step
    from bisect_onnx.decode.steps import RuntimeStepper, StepState, open_session

    step = decoder_step(model)
    session = open_session(path, provider="CPUExecutionProvider", opt_level="all")
    runner = RuntimeStepper(session, step.layout, path.name)
    empty = tuple(np.zeros((1, tail[0], 0, *tail[1:]), np.float32)
                  for pair in step.cache_tails or () for tail in pair)
    state = StepState(prompt, empty)
    started = time.perf_counter()
    for _ in range(steps + 1):
        state = state.after(runner.run(state))
    return time.perf_counter() - started


def main() -> None:
    """Run the sweep (or the timing) and print a line per decoder and exporter."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--models", default=",".join(TINY_DECODERS),
                        help="names of fixtures/decoders.py, or llama-medium (0.2B)")
    parser.add_argument("--exporters", default=",".join(EXPORTERS))
    parser.add_argument("--timing", action="store_true")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    rows = []
    for name in args.models.split(","):
        for exporter in args.exporters.split(","):
            row = (timing_row(name, exporter, args.steps, args.repeat) if args.timing
                   else sweep_row(name, exporter, args.steps))
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
