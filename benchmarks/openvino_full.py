r"""ResNet-50 and BERT-base through OpenVINO, against an OpenVINO floor; one markdown table.

Usage (from the repo root; needs the ``openvino`` extra; about 15 minutes on 2 cores)::

    python benchmarks/openvino_full.py                       # both models, 2 repetitions
    python benchmarks/openvino_full.py --only resnet50 --reps 1
    python benchmarks/openvino_full.py --precision bf16      # another inference precision

The models, their export and the planted edit are ``benchmarks/run.py``'s (its
``prepare`` worker): the full-size ResNet-50 and BERT-base of ``fixtures/architectures.py``
exported once with the dynamo exporter into a temporary folder (removed after; kept and
reused with ``--workdir``), and a copy
with one deep initializer scaled by the smallest factor that makes ONNX Runtime's outputs
fail the default tolerance (a Conv's weight in ResNet-50, a Linear's MatMul in BERT-base).
Both files are then saved again with their weights inside them (under 2 GB): OpenVINO
reads an external-data file from its path, but the local checks that name a node inside
a fused layer compile models made from bytes, which cannot find external weights
(docs/openvino.md, Limits). ``--external-data`` adds a diverged row on the external-data
file, to show what that costs.

Rows: the CLI process (``--runtime openvino --ov-precision PRECISION``) at parity and on
the planted file. Every figure is a whole process measured from outside with
``os.wait4`` (wall time, peak resident memory ``ru_maxrss``); ``seconds`` is the best of
``--reps``, peak memory the largest. Each is set against the *OpenVINO floor*, run
alternately with it on the same file: import torch, onnx and openvino, build the model,
one PyTorch forward (outputs kept), release the model, read the file in OpenVINO, make
every ONNX node's output (Constants aside) a model output, compile it for the CPU in the
same inference precision, run it once. That is the least a layer-by-layer comparison with
OpenVINO must do (and what a naive "mark all" does; it changes what OpenVINO fuses).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import run  # noqa: E402 - the models, export, plant and process timing

GROUPS = ("resnet50", "bert_base")


# --- workers: run in their own process, print one JSON line ---------------------------


def worker_inline(source: Path, target: Path) -> dict:
    """Save ``source`` (external data) again as ``target`` with its weights inside."""
    import onnx

    model = onnx.load(str(source))  # reads the external data beside it
    onnx.save_model(model, str(target))
    return {"bytes": target.stat().st_size}


def worker_floor(group: run.Group, folder: Path, onnx_name: str, precision: str) -> dict:
    """The OpenVINO floor: build, one forward, release, mark-all compile, one inference."""
    run._quiet()
    import gc

    import onnx
    import openvino
    import torch

    model, built = run._built(group)
    inputs = run._inputs(folder)
    with torch.no_grad():
        outputs = run._as_tuple(model(*(torch.from_numpy(a) for a in inputs.values())))
    del model
    gc.collect()
    path = folder / onnx_name
    graph = onnx.load(str(path), load_external_data=False).graph
    present = {value.name for value in graph.output}
    names = [name for node in graph.node if node.op_type != "Constant"
             for name in node.output if name and name not in present]
    del graph
    core = openvino.Core()
    ov_model = core.read_model(str(path))
    ov_model.add_outputs(names)
    compiled = core.compile_model(ov_model, "CPU", {"INFERENCE_PRECISION_HINT": precision})
    request = compiled.create_infer_request()
    request.infer(dict(zip([port.any_name for port in compiled.inputs], inputs.values(),
                           strict=True)))
    return {"build_seconds": built, "torch_outputs": len(outputs),
            "openvino_outputs": len(compiled.outputs)}


WORKERS = {"inline": lambda source, target: worker_inline(Path(source), Path(target)),
           "floor": lambda name, folder, onnx_name, precision: worker_floor(
               run.GROUPS[name], Path(folder), onnx_name, precision)}


# --- the driver ---------------------------------------------------------------------


@dataclass
class Row:
    """One measured CLI process and the floor run alternately with it."""

    name: str
    onnx_name: str
    command: list[str]
    report: Path
    planted: str | None = None
    runs: list[run.Rep] = field(default_factory=list)
    floor: list[run.Rep] = field(default_factory=list)


def _worker(*args: str) -> list[str]:
    return [sys.executable, __file__, "--worker", *args]


def _cli(group: run.Group, folder: Path, onnx_name: str, label: str, precision: str
         ) -> tuple[list[str], Path]:
    report = folder / f"report-openvino-{label}.json"
    return ([sys.executable, "-m", "bisect_onnx", group.factory,
             "--input", str(folder / "inputs.npz"), "--onnx", str(folder / onnx_name),
             "--runtime", "openvino", "--ov-precision", precision,
             "--json", str(report), "-q"], report)


def _inline(folder: Path, env: dict, source: str, target: str) -> None:
    _, _, status, _ = run.run_process(_worker("inline", str(folder / source),
                                              str(folder / target)), env, folder / "prep.log")
    if status != 0:
        raise SystemExit(f"resaving {source} with its weights inside failed; see "
                         f"{folder / 'prep.log'}")


def rows_of(group: run.Group, folder: Path, prepared: dict, precision: str,
            external: bool) -> list[Row]:
    """The group's rows: parity, diverged (and diverged on the external-data file)."""
    edit = f"{prepared['planted_node']} ({prepared['edit']}) × {prepared['factor']}"
    files = [("model-inline.onnx", f"{group.name}, parity", "parity", None),
             ("planted-inline.onnx", f"{group.name}, diverged: {edit}", "diverged",
              prepared["planted_node"])]
    if external:
        files.append(("planted.onnx", f"{group.name}, diverged, weights as external data",
                      "diverged-external", prepared["planted_node"]))
    rows = []
    for onnx_name, name, label, planted in files:
        command, report = _cli(group, folder, onnx_name, label, precision)
        rows.append(Row(name, onnx_name, command, report, planted))
    return rows


def _report_facts(report: Path) -> dict:
    """Culprit, where it ran and the capture's figures, from the CLI's JSON report."""
    if not report.exists():
        return {}
    data = json.loads(report.read_text())
    culprit = data.get("culprit") or {}
    layer = (((culprit.get("node") or {}).get("ran_in") or {}).get("layer")) or {}
    return {"culprit": culprit.get("onnx_node"), "layer": layer.get("type"),
            "capture": data.get("capture") or {}, "warnings": data.get("warnings") or []}


def measure(row: Row, group: run.Group, folder: Path, env: dict, reps: int,
            precision: str) -> dict:
    """Alternate the floor and the row's process ``reps`` times; the last report's facts."""
    floor = _worker("floor", group.name, str(folder), row.onnx_name, precision)
    facts: dict = {}
    for rep in range(reps):
        run._progress(f"{row.name}: floor, rep {rep + 1}/{reps}")
        seconds, rss, status, _ = run.run_process(floor, env, folder / "floor.log")
        row.floor.append(run.Rep(seconds, rss, run._exit_word(status, run.OK)))
        run._progress(f"  floor: {seconds:.1f} s, {rss:.0f} MB, {row.floor[-1].verdict}")
        row.report.unlink(missing_ok=True)
        seconds, rss, status, _ = run.run_process(row.command, env, folder / "run.log")
        facts = _report_facts(row.report)
        row.runs.append(run.Rep(seconds, rss, run._exit_word(status, run.CLI_VERDICTS),
                                culprit=facts.get("culprit")))
        run._progress(f"  bisect: {seconds:.1f} s, {rss:.0f} MB, {row.runs[-1].verdict}, "
                      f"culprit {facts.get('culprit')}")
    return facts


def table_line(row: Row, facts: dict) -> str:
    """The row's markdown line."""
    seconds = min(rep.seconds for rep in row.runs)
    floor = min(rep.seconds for rep in row.floor)
    verdict = run._unique(rep.verdict for rep in row.runs)
    if {rep.verdict for rep in row.floor} != {"ok"}:
        verdict += f"; floor: {run._unique(rep.verdict for rep in row.floor)}"
    if row.planted is None:
        named = ""
    elif {rep.culprit for rep in row.runs} == {row.planted}:
        named = f"yes ({row.planted}, in a {facts.get('layer')} layer)"
    else:
        named = f"NO: {run._unique(rep.culprit for rep in row.runs)}"
    capture = facts.get("capture", {})
    kept = (f"{capture.get('captured')}/{capture.get('candidates')}, "
            f"{capture.get('rounds')} rounds, layers match: "
            f"{capture.get('layers_match_production')}") if capture else ""
    ratio = seconds / floor if floor else math.nan
    return (f"| {row.name} | {seconds:.1f} | {floor:.1f} | {ratio:.2f} | "
            f"{max(r.rss_mb for r in row.runs):.0f} | {max(r.rss_mb for r in row.floor):.0f} | "
            f"{verdict} | {named} | {kept} |")


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2, help="repetitions (default 2)")
    parser.add_argument("--only", default=",".join(GROUPS), help="resnet50, bert_base")
    parser.add_argument("--precision", choices=("f32", "f16", "bf16"), default="f32",
                        help="OpenVINO's inference precision (default f32: this CPU's own "
                             "default, bf16, diverges from PyTorch's float32 at parity)")
    parser.add_argument("--external-data", action="store_true",
                        help="also a diverged row on the file with external weights")
    parser.add_argument("--workdir", type=Path,
                        help="keep the exports here, reused when present (default: a "
                             "temporary folder, removed after)")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> int:
    """Run the benchmark (or, with --worker, one process of it) and print the table."""
    args = _parse()
    if args.worker:
        kind, *rest = args.worker
        print(json.dumps(WORKERS[kind](*rest)))
        return 0
    import openvino

    print(run._header(args.reps) + f", OpenVINO {openvino.__version__}, inference precision "
          f"{args.precision}\n", flush=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    lines = []
    with run._workdir(args.workdir) as workdir:
        for name in args.only.split(","):
            group = run.GROUPS[name]
            folder = workdir / name
            prepared = run.prepare(group, folder, env)
            for source in ("model", "planted"):
                if not (folder / f"{source}-inline.onnx").exists():
                    _inline(folder, env, f"{source}.onnx", f"{source}-inline.onnx")
            for row in rows_of(group, folder, prepared, args.precision, args.external_data):
                facts = measure(row, group, folder, env, args.reps, args.precision)
                lines.append(table_line(row, facts))
    started = time.perf_counter() - run.STARTED
    print("| run | seconds | OpenVINO floor (s) | × floor | peak RSS (MB) | floor peak (MB) | "
          "verdict | planted node named | captured/leaving values, rounds |")
    print("|---|---:|---:|---:|---:|---:|---|---|---|")
    print("\n".join(lines))
    print(f"\nseconds: best of {args.reps} whole-process wall times (CLI, `--runtime "
          f"openvino --ov-precision {args.precision}`); peak RSS: the largest of the reps "
          f"(`ru_maxrss` from `wait4`). Total {started / 60:.1f} minutes.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
