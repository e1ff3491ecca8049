r"""Planted bugs in tiny Hugging Face models: the corpus's plants and scores on real code.

Usage (from the repo root; needs the ``hf`` extra)::

    python benchmarks/hf_plants.py --plants 6 --out hf.json
    python benchmarks/hf_plants.py --plants 6 --runtime openvino   # the planted file in OpenVINO

Each architecture of ``tests/hf/architectures.py`` (BERT, Llama, ViT, ResNet, GPT-2,
Swin, T5's encoder: tiny configs, random weights, nothing downloaded) is exported with
each exporter that exports it, and ``--plants`` single-node plants are drawn on the
export as ``benchmarks/corpus.py`` draws them (a weight scaled, an attribute changed,
a ``Mul`` inserted), each kept only if it changes the output. Each planted file is
bisected against the model (``bisect``) and against the clean export
(``bisect_onnx_models``) and scored exact / near / wrong by the corpus's rules. These
are models nobody here wrote: transformers' own modeling files.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import corpus  # noqa: F401  (puts the repo and tests/ on sys.path)
import numpy as np
from corpus import Case, add_runtime_option, plant_and_bisect, run_onnx, use_runtime

import bisect_onnx  # noqa: E402


def _export(model, x: np.ndarray, exporter: str, path: Path) -> None:
    import torch

    torch.onnx.export(model, (torch.from_numpy(x),), str(path), dynamo=exporter == "dynamo",
                      opset_version=18)


def run_architecture(name: str, arch, plants: int, folder: Path, cases: list[Case],
                     discards: Counter) -> None:
    """Export one architecture each way it exports, plant, bisect both forms."""
    import torch

    torch.manual_seed(0)
    model = arch.build().eval()
    x = arch.make_input(np.random.default_rng(0))
    rng = random.Random(len(name))
    for exporter in arch.exporters:
        clean_path = folder / f"{name}-{exporter}.onnx"
        try:
            _export(model, x, exporter, clean_path)
            clean = run_onnx(clean_path, x)
        except Exception as error:  # noqa: BLE001 - a discard, counted by reason
            discards[f"{name} {exporter}: {type(error).__name__}"] += 1
            continue
        for case in plant_and_bisect(model, x, clean_path, clean, rng, plants, seed=0,
                                     exporter=exporter, blocks=[name], discards=discards,
                                     label=f"{name} {exporter}"):
            cases.append(case)
            print(f"{name} {exporter} {case.form} {case.kind} {case.planted}: {case.score} "
                  f"({case.named}; {case.cause}) {case.seconds:.1f}s", flush=True)


def summary(cases: list[Case]) -> str:
    """One row per architecture, exporter and form."""
    rows = ["| model | exporter | form | cases | exact | near | wrong |",
            "|---|---|---|---:|---:|---:|---:|"]
    keys = dict.fromkeys((case.blocks[0], case.exporter, case.form) for case in cases)
    for model, exporter, form in keys:
        chosen = [case for case in cases if (case.blocks[0], case.exporter, case.form) ==
                  (model, exporter, form)]
        count = Counter(case.score for case in chosen)
        rows.append(f"| {model} | {exporter} | {form} | {len(chosen)} | {count['exact']} | "
                    f"{count['near']} | {count['wrong']} |")
    count = Counter(case.score for case in cases)
    rows.append(f"| **all** | | | {len(cases)} | {count['exact']} | {count['near']} | "
                f"{count['wrong']} |")
    return "\n".join(rows)


def main() -> None:
    """Plant, bisect and print the table and every miss."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plants", type=int, default=6)
    parser.add_argument("--only", nargs="*", help="architecture names (default: all)")
    parser.add_argument("--out", type=Path)
    add_runtime_option(parser)
    args = parser.parse_args()
    use_runtime(args.runtime)
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    from hf.architectures import ARCHITECTURES, T5_ENCODER

    chosen = {**ARCHITECTURES, "t5": T5_ENCODER}
    started = time.perf_counter()
    cases: list[Case] = []
    discards: Counter = Counter()
    with tempfile.TemporaryDirectory() as folder:
        for name, arch in chosen.items():
            if not args.only or name in args.only:
                run_architecture(name, arch, args.plants, Path(folder), cases, discards)
    print(f"\n{len(cases)} cases, {(time.perf_counter() - started) / 60:.1f} minutes, "
          f"bisect-onnx {bisect_onnx.__version__}\n")
    print(summary(cases))
    misses = [case for case in cases if case.score != "exact"]
    if misses:
        print("\n| model | exporter | form | plant | planted node | named | score | cause |")
        print("|---|---|---|---|---|---|---|---|")
        for case in misses:
            print(f"| {case.blocks[0]} | {case.exporter} | {case.form} | {case.kind} | "
                  f"{case.planted} | {case.named} | {case.score} | {case.cause} |")
    if discards:
        print("\ndiscarded: " + "; ".join(f"{key} ({n})" for key, n in discards.items()))
    if args.out:
        args.out.write_text(json.dumps({"cases": [asdict(case) for case in cases],
                                        "discards": dict(discards)}, indent=1))


if __name__ == "__main__":
    main()
