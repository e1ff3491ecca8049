"""Reference archives at full size: archive size, record time, check time against its floor.

For ResNet-50 and BERT-base, each built from a ``transformers`` config with random
weights (nothing downloaded; ``ResNetConfig(depths=[3, 4, 6, 3], hidden_sizes=[256, 512,
1024, 2048], layer_type="bottleneck")`` and ``BertConfig()``'s defaults, sequence 128):

1. the model is exported once (bisect-onnx's default exporter) to ``WORKDIR/<model>.onnx``
   (where it was, one comparison warms the process up instead: neither is timed);
2. ``bisect_onnx.bisect(model, inputs, onnx_model=FILE)``: the comparison alone;
3. ``bisect_onnx.record(...)`` with the same arguments: the comparison and the archive
   (its ``record`` time); the archive's size against the bytes of the values it holds;
4. ``bisect_onnx.check(ARCHIVE)`` against its *floor*, run alternately: load the file,
   mark every recorded value that is a node's output as a graph output, one ONNX
   Runtime session (the default optimization level), one run, and every recorded array
   read from the archive; the model serialized with the outputs, and again (*floor,
   weights in place*) as the check makes its capture session: the file's bytes, its
   large weights referenced where they lie in it, the outputs appended.

Times are in-process wall seconds (imports and the model's building excluded); record
and the comparison alone are one run each, check and floor the best and median of
``--reps``. Run::

    python benchmarks/reference_archive.py --workdir /tmp/reference-bench [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SEQUENCE = 128


def resnet50():
    """ResNet-50 from ``ResNetConfig``, random weights; its logits; input (1, 3, 224, 224)."""
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    class Logits(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.model(pixel_values=pixel_values).logits

    torch.manual_seed(0)
    config = ResNetConfig(depths=[3, 4, 6, 3], hidden_sizes=[256, 512, 1024, 2048],
                          layer_type="bottleneck")
    inputs = {"pixel_values": np.random.default_rng(0).standard_normal(
        (1, 3, 224, 224)).astype(np.float32)}
    return Logits(ResNetForImageClassification(config)).eval(), inputs


def bert_base():
    """BERT-base from ``BertConfig()``, random weights; its last hidden state; (1, 128)."""
    import torch
    from transformers import BertConfig, BertModel

    class Hidden(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids, attention_mask=attention_mask)[0]

    torch.manual_seed(0)
    config = BertConfig()
    inputs = {"input_ids": np.random.default_rng(0).integers(
                  0, config.vocab_size, (1, SEQUENCE)).astype(np.int64),
              "attention_mask": np.ones((1, SEQUENCE), dtype=np.int64)}
    return Hidden(BertModel(config)).eval(), inputs


MODELS = {"resnet50": resnet50, "bert_base": bert_base}


def floor(archive: Path, onnx_path: Path, *, in_place: bool = False) -> float:
    """Seconds of the floor: the recorded values as outputs, one session, one run, all read.

    Every recorded value a node computes is made a graph output of the file: the model
    serialized with them, or (``in_place``) as the check makes its capture session, the
    file's bytes with its large weights referenced where they lie in it and a message
    adding the outputs after them.
    """
    import onnx
    import onnxruntime as ort

    import bisect_onnx
    from bisect_onnx.runtime.onnx_files import file_key
    from bisect_onnx.runtime.weights_in_place import weights_in_place

    start = time.perf_counter()
    reference = bisect_onnx.Reference.load(archive)
    model = onnx.load(str(onnx_path))
    produced = {output for node in model.graph.node for output in node.output}
    present = {output.name for output in model.graph.output}
    added = [onnx.ValueInfoProto(name=name) for name in reference.value_names
             if name in produced and name not in present]
    options = ort.SessionOptions()
    options.log_severity_level = 4
    if in_place:
        in_place_bytes = weights_in_place(onnx_path, file_key(onnx_path))
        if in_place_bytes is None:
            raise SystemExit(f"{onnx_path}'s weights cannot be read in place, as the "
                             "check reads them: this floor does not apply to it")
        serialized = in_place_bytes + onnx.ModelProto(
            graph=onnx.GraphProto(output=added)).SerializeToString()
        options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path",
            str(onnx_path.resolve().parent))
    else:
        model.graph.output.extend(added)
        serialized = model.SerializeToString()
    session = ort.InferenceSession(serialized, options, providers=["CPUExecutionProvider"])
    del serialized
    del model
    feeds = {spec.name: array for spec, array in zip(session.get_inputs(),
                                                     reference.inputs(), strict=True)}
    outputs = session.run(None, feeds)
    del outputs, session
    with zipfile.ZipFile(archive) as opened:
        for name in opened.namelist():
            if name.endswith(".npy"):
                with opened.open(name) as stream:
                    np.lib.format.read_array(stream, allow_pickle=False)
    return time.perf_counter() - start


def measure(name: str, workdir: Path, reps: int) -> dict:
    """One model's figures."""
    import warnings

    import bisect_onnx

    warnings.simplefilter("ignore")
    model, inputs = MODELS[name]()
    onnx_path, archive = workdir / f"{name}.onnx", workdir / f"{name}.npz"
    if not onnx_path.exists():
        bisect_onnx.bisect(model, inputs, export=bisect_onnx.ExportOptions(save_to=onnx_path))
    else:  # a warm-up, not timed: the imports the first comparison of a process pays
        bisect_onnx.bisect(model, inputs, onnx_model=onnx_path)
    start = time.perf_counter()
    plain = bisect_onnx.bisect(model, inputs, onnx_model=onnx_path)
    compared = time.perf_counter() - start
    start = time.perf_counter()
    bisect_onnx.record(model, inputs, path=archive, onnx_model=onnx_path)
    recorded = time.perf_counter() - start
    del model
    reference = bisect_onnx.Reference.load(archive)
    held = sum(reference.value(value).nbytes for value in reference.value_names)
    held += sum(array.nbytes for array in reference.inputs())
    checks, floors, in_place = [], [], []
    for _ in range(reps):
        floors.append(floor(archive, onnx_path))
        in_place.append(floor(archive, onnx_path, in_place=True))
        start = time.perf_counter()
        checked = bisect_onnx.check(archive)
        checks.append(time.perf_counter() - start)
    return {"model": name, "values": len(reference.value_names), "held": held,
            "archive": archive.stat().st_size, "onnx": onnx_path.stat().st_size,
            "compare": compared, "record": recorded,
            "check": checks, "floor": floors, "in_place": in_place, "verdict": str(checked.verdict),
            "same": str(checked.verdict) == str(plain.verdict)}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    """Measure each model and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    print(f"reference archives, {time.strftime('%Y-%m-%d %H:%M')}, commit {_commit()}, "
          f"{platform.machine()}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{load:.2f}' for load in os.getloadavg())}, "
          f"Python {platform.python_version()}, {args.reps} reps\n")
    print("| model | values | values + inputs (MB) | archive (MB) | archive / values | "
          "compare (s) | record (s) | check best / median (s) | floor best / median (s) | "
          "check / floor (best) | floor, weights in place (s) | check / it (best) | verdict |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name in args.models:
        row = measure(name, args.workdir, args.reps)
        check, low = row["check"], row["floor"]
        print(f"| {name} | {row['values']} | {row['held'] / 1e6:.1f} | "
              f"{row['archive'] / 1e6:.1f} | {row['archive'] / row['held']:.4f} | "
              f"{row['compare']:.2f} | {row['record']:.2f} | "
              f"{min(check):.2f} / {statistics.median(check):.2f} | "
              f"{min(low):.2f} / {statistics.median(low):.2f} | "
              f"{min(check) / min(low):.2f}x | {min(row['in_place']):.2f} / "
              f"{statistics.median(row['in_place']):.2f} | "
              f"{min(check) / min(row['in_place']):.2f}x | {row['verdict']}"
              f"{'' if row['same'] else ' (not the comparison’s)'} |", flush=True)


if __name__ == "__main__":
    main()
