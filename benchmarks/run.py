"""Benchmark bisect-onnx against the floor, as whole processes; print one markdown table.

Usage (from the repo root; about 30 minutes on 2 cores, more with the 3B decoder)::

    python benchmarks/run.py                                  # every row, 3 repetitions
    python benchmarks/run.py --reps 1 --only resnet50         # one model
    python benchmarks/run.py --only decoder-1b --layers-1b 2  # a tiny decoder (smoke run)
    python benchmarks/run.py --workdir /tmp/bench             # exports kept and reused

Rows (``--only`` picks the groups ``resnet50``, ``bert_base``, ``decoder-1b``,
``decoder-3b``, ``bert_tiny_hf``; random weights, float32, nothing downloaded):

- ``resnet50`` and ``bert_base`` (``fixtures/architectures.py`` at full size): the CLI
  process given the model's factory and its dynamo export (``--onnx``), at parity; then
  diverged, on a planted copy of the export: one node deep in the graph (at 3/4 of the
  candidates in graph order: a Conv's weight in ResNet-50, the MatMul of a Linear in
  BERT) gets a private copy of its weight scaled by the smallest of ``FACTORS`` that
  makes ONNX Runtime's outputs fail bisect-onnx's default tolerance against PyTorch's;
- ``decoder-1b`` and ``decoder-3b`` (``benchmarks/scale.py``: 1.02 and 2.99 billion
  parameters): the CLI process with ``--onnx``, and the API in-process
  (``bisect_onnx.bisect(model, inputs, onnx_model=...)``) in a process of its own.

Each model is built and exported once, in a process of its own, into ``--workdir``
(default: a temporary folder, removed after); a workdir that already holds a model's
export is reused. That step is not measured.

Every figure is a whole process, measured from outside with ``os.wait4``: wall time and
peak resident memory (``ru_maxrss``). ``seconds`` is the median of ``--reps`` and peak
memory the largest. Each row is measured against the *floor*, the least any such tool
must do as a process: import torch, onnx and onnxruntime, build the model (the same
factory), run one PyTorch forward (its outputs kept), release the model, make one ONNX
Runtime CPU session of the same file (the planted one for the diverged rows) with every
node output promoted to a graph output, and run it once. Floor and measured processes
alternate rep by rep (floor, run, floor, run, ...; the decoder's CLI and API rows share
each floor), so that drift on the machine hits both alike.

The API rows exclude the model's building: their seconds are the process's wall time
minus the factory's seconds, measured inside the process; their floor is the floor
process's wall time minus its own factory's seconds, measured the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import platform
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import scale  # noqa: E402

# The smallest of these scales that makes a final output fail is planted: an edit near
# the tolerance that still changes the verdict.
FACTORS = (1.003, 1.01, 1.03, 1.1)
STARTED = time.perf_counter()


@dataclass(frozen=True)
class Group:
    """One model of the table and what is measured on it."""

    name: str
    factory: str
    """``FILE.py:FACTORY`` relative to the repo: the CLI's MODEL, and what workers build."""
    inputs: str
    """``FILE.py:FUNCTION`` returning the forward inputs (name -> array, in order)."""
    plant: str | None = None
    """The key of :data:`PLANTS` edited for the diverged row; ``None``: no such row."""
    layers: int | None = None
    """Decoders: the layer count, set as ``scale.LAYERS_VARIABLE`` in every process."""

    @property
    def folder(self) -> str:
        """The workdir's subfolder: one per model size, so a kept export is reused."""
        return self.name if self.layers is None else f"decoder-{self.layers}-layers"


GROUPS = {group.name: group for group in (
    Group("resnet50", "benchmarks/models.py:resnet50_full",
          "benchmarks/models.py:resnet50_full_inputs", plant="conv"),
    Group("bert_base", "benchmarks/models.py:bert_base_full",
          "benchmarks/models.py:bert_base_full_inputs", plant="linear_matmul"),
    # Tiny models included: a diverged run must stay within 1.5x its floor there too.
    Group("bert_tiny_hf", "benchmarks/models.py:bert_tiny_hf",
          "benchmarks/models.py:bert_tiny_hf_inputs", plant="linear_matmul"),
    Group("decoder-1b", "benchmarks/scale.py:decoder_1b", "benchmarks/scale.py:decoder_inputs",
          layers=scale.LAYERS_1B),
    Group("decoder-3b", "benchmarks/scale.py:decoder_3b", "benchmarks/scale.py:decoder_inputs",
          layers=scale.LAYERS_3B),
)}


# --- where to plant: a node deep in the graph --------------------------------------------


PLANTS = {"conv": "Conv weight", "linear_matmul": "MatMul of a Linear, weight"}


def deep_node(model, kind: str) -> tuple:
    """The node of ``kind`` at 3/4 of those in graph order, and its weight's input index.

    Deep, with some nodes after it to carry the error to the outputs. ``linear_matmul``
    is the MatMul of a Linear: MatMul then bias Add, one ``aten.linear`` (the bias Add
    carries the op's name).
    """
    from benchmarks.op_alignment import _segments

    if kind == "conv":
        nodes = [node for node in model.graph.node if node.op_type == "Conv"]
    else:
        nodes = [segment[0][0] for segment in _segments(model).values()
                 if [node.op_type for node, _ in segment] == ["MatMul", "Add"]
                 and segment[0][1].torch_op == "aten.linear.default"]
    if not nodes:
        raise LookupError(f"no {PLANTS[kind]} in the graph")
    return nodes[len(nodes) * 3 // 4], 1


# --- workers: run in their own process, print one JSON line ---------------------------


def _quiet() -> None:
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)


def _call(spec: str):  # noqa: ANN202 - whatever the function returns
    """Call the zero-argument function ``FILE.py:NAME`` (the file loaded by path)."""
    path, name = spec.split(":")
    return runpy.run_path(str(REPO / path))[name]()


def _built(group: Group) -> tuple:
    """The group's model and the seconds its factory took."""
    start = time.perf_counter()
    model = _call(group.factory)
    return model, time.perf_counter() - start


def _inputs(folder: Path) -> dict:
    import numpy as np

    with np.load(folder / "inputs.npz") as archive:
        return {key: archive[key] for key in archive.files}


def _as_tuple(outputs) -> tuple:
    return outputs if isinstance(outputs, tuple) else (outputs,)


def _feeds(session, inputs: dict) -> dict:
    return dict(zip([i.name for i in session.get_inputs()], inputs.values(), strict=True))


def worker_prepare(group: Group, folder: Path) -> dict:
    """Build the model, export it (dynamo, weights as external data), plant the edit."""
    _quiet()
    import numpy as np
    import torch

    model, built = _built(group)
    inputs = _call(group.inputs)
    np.savez(folder / "inputs.npz", **inputs)
    args = tuple(torch.from_numpy(array) for array in inputs.values())
    start = time.perf_counter()
    with torch.no_grad():
        program = torch.onnx.export(model, args, dynamo=True, verbose=False)
    program.save(str(folder / "model.onnx"), external_data=True)
    del program
    result = {"parameters": sum(p.numel() for p in model.parameters()),
              "weights_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
              "build_seconds": built, "export_seconds": time.perf_counter() - start}
    if group.plant:
        with torch.no_grad():
            reference = [tensor.numpy() for tensor in _as_tuple(model(*args))]
        result.update(_plant(group.plant, folder, inputs, reference))
    return result


def _plant(kind: str, folder: Path, inputs: dict, reference: list) -> dict:
    """Write ``planted.onnx`` at the smallest of ``FACTORS`` whose outputs fail."""
    from benchmarks.op_alignment import plant_scaled

    choose = functools.partial(deep_node, kind=kind)
    for factor in FACTORS:
        node = plant_scaled(folder / "model.onnx", folder / "planted.onnx", choose, factor)
        fails = _outputs_fail(folder / "planted.onnx", inputs, reference)
        if fails:
            break
    _as_external_data(folder / "planted.onnx")
    return {"planted_node": node, "edit": PLANTS[kind], "factor": factor, "outputs_fail": fails}


def _as_external_data(path: Path) -> None:
    """Resave ``path`` with its weights in one external data file, as the export is.

    So that the diverged rows, and their floor, differ from the parity rows by the edit
    only, not by the weights being read from inside the file.
    """
    import onnx

    model = onnx.load(str(path))
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)  # onnx appends to an existing data file
    onnx.save_model(model, str(path), save_as_external_data=True, location=data.name)


def _outputs_fail(path: Path, inputs: dict, reference: list) -> bool:
    """Whether ONNX Runtime's outputs of ``path`` fail the default tolerance against PyTorch's.

    Judged here, not by bisect-onnx: its verdict on the planted file is what is measured.
    """
    import numpy as np
    import onnxruntime as ort

    from bisect_onnx import DEFAULT_ATOL, DEFAULT_RTOL

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs = session.run(None, _feeds(session, inputs))
    return any(out.shape != ref.shape or not np.allclose(
        out.astype(np.float64), ref.astype(np.float64), rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL)
        for out, ref in zip(outputs, reference, strict=True))


def _promoted_session(path: Path):  # noqa: ANN202 - an onnxruntime.InferenceSession
    """A CPU session of ``path`` with every node output made a graph output."""
    import onnx
    import onnxruntime as ort

    # The weights stay on disk (a 3B model's would not fit twice): ONNX Runtime reads
    # the external data from the file's folder itself.
    proto = onnx.load(str(path), load_external_data=False)
    present = {value.name for value in proto.graph.output}
    for node in proto.graph.node:
        for name in node.output:
            if name and name not in present:
                proto.graph.output.append(onnx.ValueInfoProto(name=name))
                present.add(name)
    options = ort.SessionOptions()
    options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                     str(path.parent))
    return ort.InferenceSession(proto.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def worker_floor(group: Group, folder: Path, onnx_name: str) -> dict:
    """The floor: build, one forward, release the model, one promoted session, one run."""
    _quiet()
    import gc

    import onnx  # noqa: F401 - imported, as by any such tool
    import onnxruntime  # noqa: F401
    import torch

    model, built = _built(group)
    inputs = _inputs(folder)
    with torch.no_grad():
        outputs = _as_tuple(model(*(torch.from_numpy(array) for array in inputs.values())))
    # Released before the session is made, so that PyTorch's weights and ONNX Runtime's
    # are never held together: the floor of the 3B decoder fits in 24 GiB.
    del model
    gc.collect()
    session = _promoted_session(folder / onnx_name)
    values = session.run(None, _feeds(session, inputs))
    return {"build_seconds": built, "torch_outputs": len(outputs), "onnx_values": len(values)}


def worker_api(group: Group, folder: Path, onnx_name: str) -> dict:
    """bisect-onnx through the API, the model built here and the export given."""
    _quiet()
    import bisect_onnx

    model, built = _built(group)
    report = bisect_onnx.bisect(model, _inputs(folder), onnx_model=folder / onnx_name)
    return {"build_seconds": built, "verdict": str(report.verdict),
            "culprit": report.culprit.onnx_node if report.culprit else None}


WORKERS = {"prepare": worker_prepare, "floor": worker_floor, "api": worker_api}


# --- the driver: it stays small (no torch), so its memory never shows in a child's -------


class Rep(NamedTuple):
    """What one process gave."""

    seconds: float
    rss_mb: float
    verdict: str
    build: float = math.nan
    """Seconds the process's factory took, as it measured them (floor and API processes)."""
    culprit: str | None = None


@dataclass
class Row:
    """One row of the table: a measured process and the floor it is measured against."""

    name: str
    command: list[str]
    floor: list[Rep]
    group: Group
    prepared: dict
    api: bool = False
    planted: str | None = None
    report: Path | None = None
    runs: list[Rep] = field(default_factory=list)


def _progress(message: str) -> None:
    print(f"[{time.perf_counter() - STARTED:7.1f} s] {message}", file=sys.stderr, flush=True)


def run_process(command: list[str], env: dict, log: Path) -> tuple[float, float, int, dict]:
    """Wall seconds, peak RSS (MB), exit status and last JSON line of one child process."""
    start = time.perf_counter()
    with log.open("a") as stderr:
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                   stderr=stderr, text=True)
        stdout = process.stdout.read()
        # wait4, not wait: the child's own peak resident memory comes with its status.
        _, status, usage = os.wait4(process.pid, 0)
    process.stdout.close()
    process.returncode = os.waitstatus_to_exitcode(status)
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    return (time.perf_counter() - start, usage.ru_maxrss / 1024, process.returncode,
            json.loads(lines[-1]) if lines else {})


def _worker(kind: str, group: Group, folder: Path, *rest: str) -> list[str]:
    return [sys.executable, __file__, "--worker", kind, group.name, str(folder), *rest]


def _exit_word(status: int, words: dict[int, str]) -> str:
    """``words[status]``, else how the process ended."""
    if status in words:
        return words[status]
    return f"killed (signal {-status})" if status < 0 else f"exit {status}"


CLI_VERDICTS = {0: "parity", 1: "diverged"}  # the CLI's exit statuses
OK = {0: "ok"}


def prepare(group: Group, folder: Path, env: dict) -> dict:
    """The group's export (and planted file), made once: reused when the folder holds it."""
    marker = folder / "prepared.json"
    if marker.exists():
        _progress(f"{group.name}: reusing the export in {folder}")
        return json.loads(marker.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    _progress(f"{group.name}: building and exporting the model (not measured)")
    log = folder / "prepare.log"
    seconds, _, status, result = run_process(_worker("prepare", group, folder), env, log)
    if status != 0 or not result:
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        raise SystemExit(f"preparing {group.name} failed ({_exit_word(status, OK)}):\n{tail}")
    marker.write_text(json.dumps(result))
    _progress(f"{group.name}: prepared in {seconds:.0f} s")
    return result


def _cli(group: Group, folder: Path, onnx_name: str, label: str) -> tuple[list[str], Path]:
    """The CLI's command line on ``onnx_name``, and where its JSON report goes."""
    report = folder / f"report-{label}.json"
    return ([sys.executable, "-m", "bisect_onnx", group.factory,
             "--input", str(folder / "inputs.npz"), "--onnx", str(folder / onnx_name),
             "--json", str(report), "-q"], report)


def trials(group: Group, folder: Path, prepared: dict) -> list[tuple[str, list[Row]]]:
    """Each ONNX file the floor runs on, with the rows measured against that floor."""
    if group.layers is None:
        name, plant = group.name, prepared
        parity, parity_report = _cli(group, folder, "model.onnx", "parity")
        diverged, diverged_report = _cli(group, folder, "planted.onnx", "diverged")
        # Module level only: no op values, nothing traced; classified by float64 reruns.
        modules, modules_report = _cli(group, folder, "planted.onnx", "diverged-modules")
        edit = f"{plant['planted_node']} ({plant['edit']}) × {plant['factor']}"
        floor: list[Rep] = []  # one floor process a rep, for both diverged rows
        return [("model.onnx", [Row(f"{name}, parity, CLI", parity, [], group, prepared,
                                    report=parity_report)]),
                ("planted.onnx", [
                    Row(f"{name}, diverged: {edit}, CLI", diverged, floor, group, prepared,
                        planted=plant["planted_node"], report=diverged_report),
                    Row(f"{name}, diverged, CLI `--granularity module`",
                        [*modules, "--granularity", "module"], floor, group, prepared,
                        planted=plant["planted_node"], report=modules_report)])]
    name = (f"{group.name}: {prepared['parameters'] / 1e9:.2f}B parameters, "
            f"{group.layers} layers")
    command, report = _cli(group, folder, "model.onnx", "parity")
    floor: list[Rep] = []  # one floor process a rep, for both rows
    return [("model.onnx", [
        Row(f"{name}, CLI", command, floor, group, prepared, report=report),
        Row(f"{name}, API in-process", _worker("api", group, folder, "model.onnx"), floor,
            group, prepared, api=True)])]


def _measure_floor(reps: list[Rep], command: list[str], env: dict, log: Path) -> None:
    seconds, rss, status, result = run_process(command, env, log)
    reps.append(Rep(seconds, rss, _exit_word(status, OK), result.get("build_seconds", math.nan)))
    _progress(f"  floor: {seconds:.1f} s, {rss:.0f} MB, {reps[-1].verdict}")


def _measure_row(row: Row, env: dict, log: Path) -> None:
    if row.report is not None:
        row.report.unlink(missing_ok=True)  # an earlier rep's must not be read as this one's
    seconds, rss, status, result = run_process(row.command, env, log)
    if row.api:
        seconds -= result.get("build_seconds", math.nan)
        verdict = result["verdict"] if status == 0 and "verdict" in result else \
            _exit_word(status, {0: "no verdict"})
        culprit = result.get("culprit")
    else:
        verdict, culprit = _exit_word(status, CLI_VERDICTS), _reported_culprit(row.report)
    row.runs.append(Rep(seconds, rss, verdict, culprit=culprit))
    _progress(f"  {row.name}: {seconds:.1f} s, {rss:.0f} MB, {verdict}"
              + (f", culprit {culprit}" if row.planted else ""))


def _reported_culprit(report: Path) -> str | None:
    """``culprit.onnx_node`` of a CLI's JSON report (docs/json-schema.md)."""
    if not report.exists():
        return None
    return (json.loads(report.read_text()).get("culprit") or {}).get("onnx_node")


def measure(onnx_name: str, rows: list[Row], env: dict, folder: Path, reps: int) -> None:
    """Alternate the floor on ``onnx_name`` and the rows' processes, ``reps`` times."""
    floor = _worker("floor", rows[0].group, folder, onnx_name)
    for rep in range(reps):
        _progress(f"{rows[0].group.name}, floor on {onnx_name}, rep {rep + 1}/{reps}")
        _measure_floor(rows[0].floor, floor, env, folder / "floor.log")
        for row in rows:
            _measure_row(row, env, folder / "run.log")


# --- the table ---------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _unique(values: Iterable) -> str:
    return ", ".join(str(value) for value in dict.fromkeys(values))


def _culprit_cell(row: Row) -> str:
    if row.planted is None:
        return ""
    culprits = [rep.culprit for rep in row.runs]
    if set(culprits) == {row.planted}:
        return f"yes ({row.planted})"
    return f"NO: {_unique(culprits)} (planted {row.planted})"


def table_row(row: Row) -> str:
    """The row's markdown line."""
    # The API rows' floor excludes its model building too, as the API rows' seconds do.
    floor = [rep.seconds - (rep.build if row.api else 0.0) for rep in row.floor]
    seconds, floor_seconds = _median([rep.seconds for rep in row.runs]), _median(floor)
    verdict = _unique(rep.verdict for rep in row.runs)
    if {rep.verdict for rep in row.floor} != {"ok"}:
        verdict += f"; floor: {_unique(rep.verdict for rep in row.floor)}"
    if row.planted and not row.prepared.get("outputs_fail", True):
        verdict += f"; outputs pass even at × {FACTORS[-1]}"
    memory = [max(rep.rss_mb for rep in reps) for reps in (row.runs, row.floor)]
    return (f"| {row.name} | {seconds:.2f} | {floor_seconds:.2f} | "
            f"{seconds / floor_seconds:.2f} | {memory[0]:.0f} | {memory[1]:.0f} | "
            f"{row.prepared['weights_bytes'] / 2**20:.0f} | {verdict} | {_culprit_cell(row)} |")


def print_table(rows: list[Row], reps: int, decoder_reps: int | None = None) -> None:
    """The table, and what its columns are."""
    print("| run | seconds | floor (s) | × floor | peak RSS (MB) | floor peak (MB) | "
          "weights (MB) | verdict | culprit is the planted node |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---|")
    for row in rows:
        print(table_row(row))
    counted = f"{reps} (decoders: {decoder_reps})" if decoder_reps else f"{reps}"
    print(f"\nseconds: median of {counted} whole-process wall times; peak RSS: the largest of "
          "the reps (`ru_maxrss` from `wait4`); weights: the model's parameters. The floor "
          "(import, build, one forward, release, one session with every value promoted, one "
          "run) alternates with the row's process.")
    if any(row.api for row in rows):
        print("\nThe API rows exclude the model's building: their seconds are the process's "
              "wall time minus its factory's seconds (measured inside it), and their floor is "
              "the floor process's wall time minus its own model building; their memory is "
              "the whole process's peak.")


def _header(reps: int) -> str:
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text()
                   .splitlines())
    total, available = (int(meminfo[key].split()[0]) / 2**20
                        for key in ("MemTotal", "MemAvailable"))
    # The load average says what else was running: the machine may be shared.
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return (f"bisect-onnx benchmark, {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, "
            f"{os.cpu_count()} CPUs, {available:.1f} of {total:.0f} GiB available, load "
            f"average {load}, Python {platform.python_version()}, {reps} reps")


@contextlib.contextmanager
def _workdir(path: Path | None) -> Iterator[Path]:
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="bisect-onnx-bench-") as folder:
        yield Path(folder)


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3, help="repetitions (default 3)")
    parser.add_argument("--decoder-reps", type=int,
                        help="repetitions of the decoder rows (default: --reps); a 3B rep "
                             "takes about 9 minutes")
    parser.add_argument("--only", default=",".join(GROUPS),
                        help=f"comma-separated groups among {', '.join(GROUPS)}")
    parser.add_argument("--workdir", type=Path,
                        help="keep the exports here, reused when present (default: a "
                             "temporary folder, removed after)")
    parser.add_argument("--layers-1b", type=int, default=scale.LAYERS_1B)
    parser.add_argument("--layers-3b", type=int, default=scale.LAYERS_3B)
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = set(args.only.split(",")) - set(GROUPS)
    if unknown:
        parser.error(f"--only: unknown group(s) {', '.join(sorted(unknown))}")
    return args


def _selected(args: argparse.Namespace) -> list[Group]:
    layers = {"decoder-1b": args.layers_1b, "decoder-3b": args.layers_3b}
    return [dataclasses.replace(GROUPS[name], layers=layers[name]) if name in layers
            else GROUPS[name] for name in args.only.split(",")]


def main() -> int:
    """Run the benchmark (or, with --worker, one process of it) and print the table."""
    args = _parse()
    if args.worker:
        kind, name, folder, *rest = args.worker
        print(json.dumps(WORKERS[kind](GROUPS[name], Path(folder), *rest)))
        return 0
    decoders = f", decoders {args.decoder_reps}" if args.decoder_reps else ""
    print(_header(args.reps) + decoders + "\n", flush=True)
    rows: list[Row] = []
    with _workdir(args.workdir) as workdir:
        for group in _selected(args):
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            if group.layers is not None:
                env[scale.LAYERS_VARIABLE] = str(group.layers)
            folder = workdir / group.folder
            prepared = prepare(group, folder, env)
            for onnx_name, trial_rows in trials(group, folder, prepared):
                reps = args.reps if group.layers is None else args.decoder_reps or args.reps
                measure(onnx_name, trial_rows, env, folder, reps)
                rows += trial_rows
    print_table(rows, args.reps, args.decoder_reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
