r"""A wide sweep: many real architectures, both exporters, clean exports and planted bugs.

Usage (from the repo root; needs the ``hf`` extra)::

    python benchmarks/wide_sweep.py --plants 3 --time-limit 45 --out sweep.json
    python benchmarks/wide_sweep.py --only bert,mnist,softmax/direct   # rerun a few
    python benchmarks/wide_sweep.py --from-json sweep.json             # print a saved run

Three groups of models:

- ``hf``: tiny random-initialised ``transformers`` architectures built from configs
  (``benchmarks/wide_hf.py``: text encoders, vision models, decoders with
  ``use_cache=False``, the encoders of encoder-decoder models, speech encoders);
- ``model_defs``: own small versions of the architectures of PyTorch's
  ``test/onnx/model_defs`` (``benchmarks/torch_onnx_models.py``: DCGAN, MNIST,
  SqueezeNet, super-resolution, word language models with LSTM and GRU, an
  ``nn.LSTMCell`` stepping twice, ``x * 2.0`` next to ``F.gelu``, ...);
- ``single_ops``: one op each of those ``test_pytorch_onnx_onnxruntime.py`` covers,
  called in the model's own ``forward`` (``OP/direct``) and in a submodule's
  (``OP/submodule``).

Each model is exported with each exporter that exports it (opset 18); a model that
fails to build or export is counted by reason, not as an error. Each export is first
bisected clean (``bisect(model, [x], onnx_model=path)``, and again with op rows,
``SearchOptions(granularity="op")``, since for an existing file at parity ``bisect``
compares module calls and pairs ops only once a value diverges): the expected answer is
parity with no hidden divergence and no culprit (an export whose outputs really differ from
PyTorch's is listed apart and gets no plants). Then ``--plants`` plants are drawn on it
as ``benchmarks/corpus.py`` draws them (a weight scaled, an attribute changed, a ``Mul``
inserted; its functions, imported), and each planted file is bisected in the PyTorch form
and ONNX against ONNX (``bisect_onnx_models(clean, planted, [x])``) and scored by the
corpus's rules: exact, near, wrong, or none (no culprit named, or no divergence found).

``--time-limit`` stops starting new models once that many minutes have passed; the
groups are interleaved so that a cut leaves each group represented in proportion.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import re
import tempfile
import time
import warnings
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import corpus  # noqa: F401  (puts the repo, tests/ and benchmarks/ on sys.path)
import numpy as np
import onnx
from corpus import (
    EXPORTERS,
    FORMS,
    PLANT_KINDS,
    Case,
    draw_plant,
    export,
    outputs_differ,
    run_onnx,
    score,
)

import bisect_onnx  # noqa: E402

GROUPS = ("hf", "model_defs", "single_ops")
#: The clean export is bisected twice: as ``bisect`` picks its rows, and at op level.
GRANULARITIES = ("default", "op")
VERDICT_CHARS = 160


@dataclass(frozen=True)
class Entry:
    """One model of the sweep: its group, name and how to build it with its input."""

    group: str
    name: str
    build: Callable[[], tuple[object, np.ndarray]]


def _hf_builder(spec) -> Callable[[], tuple[object, np.ndarray]]:
    return lambda: (spec.build(), spec.make_input(np.random.default_rng(0)))


def entries() -> list[Entry]:
    """Every model, the groups interleaved in proportion to their sizes."""
    from torch_onnx_models import (
        MODEL_DEFS,
        SINGLE_OP_MODELS,
        build_model_def,
        build_single_op,
    )
    from wide_hf import HF_MODELS

    groups = {
        "hf": [Entry("hf", name, _hf_builder(spec)) for name, spec in HF_MODELS.items()],
        "model_defs": [Entry("model_defs", name, lambda n=name: build_model_def(n))
                       for name in MODEL_DEFS],
        "single_ops": [Entry("single_ops", name, lambda n=name: build_single_op(n))
                       for name in SINGLE_OP_MODELS],
    }
    ranked = [((index + 0.5) / len(members), GROUPS.index(group), entry)
              for group, members in groups.items() for index, entry in enumerate(members)]
    return [entry for *_, entry in sorted(ranked, key=lambda item: item[:2])]


@dataclass
class SweepCase(Case):
    """One planted file bisected one way, with its model and the report's verdict line."""

    group: str = ""
    model: str = ""
    verdict: str = ""


@dataclass
class CleanRun:
    """One clean export bisected against its model."""

    group: str
    model: str
    exporter: str
    outcome: str
    """``parity`` (expected: nothing claimed), ``parity, nothing aligned`` (final outputs
    only), ``hidden divergences`` or ``culprit at parity`` (claims on a clean file),
    ``false alarm`` (diverged where the outputs agree), ``crash``, or ``exporter not at
    parity`` (the export's outputs really differ from PyTorch's)."""
    detail: str = ""
    compared: str = ""
    seconds: float = 0.0
    granularity: str = "default"
    """``default`` (what ``bisect`` picks: module rows for an existing file at parity) or
    ``op`` (``SearchOptions(granularity="op")``: every op pairing checked at parity)."""


@dataclass
class Failure:
    """A model that did not build, or an export that failed, by reason."""

    group: str
    model: str
    stage: str
    reason: str


@dataclass
class Sweep:
    """Everything one run found."""

    clean: list[CleanRun] = field(default_factory=list)
    cases: list[SweepCase] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    discards: list[Failure] = field(default_factory=list)
    """Plant kinds of which no candidate changed an export's output."""
    built: Counter = field(default_factory=Counter)


@contextlib.contextmanager
def _quiet_descriptors():
    """Standard output and error sent to ``/dev/null`` at the descriptor level.

    The TorchScript exporter's graph dump on failure and torch's C++ warnings bypass
    ``sys.stderr``.
    """
    saved = [os.dup(1), os.dup(2)]
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 1)
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for descriptor in saved:
                os.close(descriptor)


def _first_line(error: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error)).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:110] if text else ''}"


def _reason(error: Exception) -> str:
    """The error's type and first line; for a wrapped error, the innermost one's too."""
    root: BaseException = error
    while root.__cause__ is not None:
        root = root.__cause__
    return _first_line(error) if root is error else (
        f"{type(error).__name__} from {_first_line(root)}")


def _compared(report) -> str:
    coverage = report.coverage
    if coverage.granularity == "op":
        return f"op {coverage.compared_ops}/{coverage.torch_ops}"
    return f"{coverage.granularity} {coverage.aligned_modules}/{coverage.torch_modules}"


def clean_run(entry: Entry, model, x: np.ndarray, exporter: str, path: Path,
              at_parity: bool, granularity: str) -> CleanRun:
    """Bisect the clean export against the model and say what it claims."""
    run = CleanRun(entry.group, entry.name, exporter, "parity", granularity=granularity)
    search = bisect_onnx.SearchOptions(granularity="op") if granularity == "op" else None
    started = time.perf_counter()
    try:
        report = bisect_onnx.bisect(model, [x], onnx_model=path, search=search)
    except Exception as error:  # noqa: BLE001 - a crash is recorded
        run.outcome, run.detail = "crash", _reason(error)
        run.seconds = time.perf_counter() - started
        return run
    run.seconds = time.perf_counter() - started
    run.compared = _compared(report)
    verdict = report.summary()[:VERDICT_CHARS]
    if not at_parity:
        culprit = report.culprit
        run.outcome = "exporter not at parity"
        run.detail = (f"culprit {culprit.onnx_node} ({culprit.onnx_op})" if culprit
                      else verdict)
    elif report.diverged:
        run.outcome, run.detail = "false alarm", verdict
    elif report.hidden_divergences:
        first = report.hidden_divergences[0]
        run.outcome = "hidden divergences"
        run.detail = (f"{len(report.hidden_divergences)}, first {first.onnx_node} "
                      f"({first.onnx_op}) <- {first.torch_op} in {first.torch_module}; "
                      + verdict)
    elif report.culprit is not None:
        run.outcome, run.detail = "culprit at parity", verdict
    elif verdict.startswith("PARITY OF FINAL OUTPUTS ONLY"):
        run.outcome, run.detail = "parity, nothing aligned", verdict
    return run


def planted_case(case: SweepCase, model, x: np.ndarray, clean_path: Path,
                 planted_path: Path, planted_model: onnx.ModelProto) -> None:
    """Bisect one planted file in ``case.form`` and score it as the corpus does."""
    started = time.perf_counter()
    try:
        if case.form == "pytorch":
            report = bisect_onnx.bisect(model, [x], onnx_model=planted_path)
        else:
            report = bisect_onnx.bisect_onnx_models(clean_path, planted_path, [x])
    except Exception as error:  # noqa: BLE001 - a crash is a miss, recorded as such
        case.score, case.cause = "wrong", f"error: {_reason(error)}"
    else:
        score(case, report, planted_model)
        case.verdict = report.summary()[:VERDICT_CHARS]
    case.seconds = time.perf_counter() - started


def plant(entry: Entry, model, x: np.ndarray, exporter: str, clean_path: Path,
          clean: list[np.ndarray], plants: int, sweep: Sweep) -> None:
    """``plants`` plants on one clean export, each bisected in both forms."""
    rng = random.Random(zlib.crc32(f"{entry.name} {exporter}".encode()))
    clean_model = onnx.load(str(clean_path))
    taken: set[str] = set()
    for index in range(plants):
        kind = PLANT_KINDS[index % len(PLANT_KINDS)]
        with _quiet_descriptors():  # ONNX Runtime's log of each candidate it refuses
            drawn = draw_plant(kind, clean_model, x, clean, rng, taken)
        if drawn is None:
            sweep.discards.append(Failure(entry.group, entry.name, f"plant {exporter}",
                                          f"no {kind} plant changes the output"))
            continue
        taken.add(drawn.node)
        planted_path = clean_path.with_name(f"{clean_path.stem}-{index}.onnx")
        onnx.save(drawn.model, str(planted_path))
        for form in FORMS:
            case = SweepCase(0, exporter, form, kind, drawn.node, drawn.op_type, drawn.edit,
                             [entry.name], group=entry.group, model=entry.name)
            planted_case(case, model, x, clean_path, planted_path, drawn.model)
            sweep.cases.append(case)
            logging.getLogger("sweep").info("  %s %s %s %s: %s (%s) %.1fs", entry.name,
                                            exporter, form, kind, case.score, case.cause,
                                            case.seconds)


def run_entry(entry: Entry, plants: int, folder: Path, sweep: Sweep,
              exporters: tuple[str, ...] = EXPORTERS) -> None:
    """Build one model, export it each way, bisect each export clean and planted."""
    import torch

    log = logging.getLogger("sweep")
    try:
        with _quiet_descriptors():
            model, x = entry.build()
        with torch.no_grad():
            expected = [model(torch.from_numpy(x)).numpy()]
    except Exception as error:  # noqa: BLE001 - counted by reason
        sweep.failures.append(Failure(entry.group, entry.name, "build", _reason(error)))
        log.info("%s: build failed: %s", entry.name, _reason(error))
        return
    sweep.built[entry.group] += 1
    stem = entry.name.replace("/", "-")
    for exporter in exporters:
        path = folder / f"{stem}-{exporter}.onnx"
        try:
            with _quiet_descriptors():
                export(model, torch.from_numpy(x), exporter, path)
            clean = run_onnx(path, x)
        except Exception as error:  # noqa: BLE001 - counted by reason
            sweep.failures.append(Failure(entry.group, entry.name, f"export {exporter}",
                                          _reason(error)))
            log.info("%s %s: export failed: %s", entry.name, exporter, _reason(error))
            continue
        at_parity = not outputs_differ(expected, clean)
        for granularity in GRANULARITIES:
            run = clean_run(entry, model, x, exporter, path, at_parity, granularity)
            sweep.clean.append(run)
            log.info("%s %s clean (%s rows): %s %s (%s) %.1fs", entry.name, exporter,
                     granularity, run.outcome, run.detail, run.compared, run.seconds)
        if at_parity:
            plant(entry, model, x, exporter, path, clean, plants, sweep)


# -- tables --------------------------------------------------------------------------

def _percent(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def plant_outcome(case: SweepCase) -> str:
    """``exact``, ``near``, ``wrong`` (another node named), ``none`` or ``crash``."""
    if case.score != "wrong":
        return case.score
    if case.cause.startswith("error:"):
        return "crash"
    if case.cause.startswith(("no divergence", "no culprit")):
        return "none"
    return "wrong"


CLEAN_OUTCOMES = ("parity", "parity, nothing aligned", "hidden divergences",
                  "culprit at parity", "false alarm", "crash", "exporter not at parity")


def clean_table(sweep: Sweep) -> str:
    """Clean exports by group and exporter."""
    lines = ["| group | exporter | rows | built | exported | parity, nothing claimed | final "
             "outputs only | false hidden divergences | culprit at parity | false alarms | "
             "crashes | exporter not at parity |", "|---|---|---|---:|" + "---:|" * 8]
    for granularity in GRANULARITIES:
        for group in GROUPS:
            for exporter in EXPORTERS:
                runs = [r for r in sweep.clean if (r.group, r.exporter, r.granularity) ==
                        (group, exporter, granularity)]
                counts = Counter(r.outcome for r in runs)
                lines.append(f"| {group} | {exporter} | {granularity} | {sweep.built[group]} | "
                             f"{len(runs)} | "
                             + " | ".join(str(counts[o]) for o in CLEAN_OUTCOMES) + " |")
    return "\n".join(lines)


def plant_table(sweep: Sweep) -> str:
    """Planted cases by group, exporter and form."""
    lines = ["| group | exporter | form | cases | exact | near | wrong | none | crash | "
             "exact % |", "|---|---|---|" + "---:|" * 7]
    for group in (*GROUPS, "all"):
        for exporter in EXPORTERS:
            for form in FORMS:
                chosen = [c for c in sweep.cases if c.exporter == exporter and c.form == form
                          and group in ("all", c.group)]
                counts = Counter(plant_outcome(c) for c in chosen)
                label = f"**{group}**" if group == "all" else group
                lines.append(f"| {label} | {exporter} | {form} | {len(chosen)} | "
                             + " | ".join(str(counts[o]) for o in
                                          ("exact", "near", "wrong", "none", "crash"))
                             + f" | {_percent(counts['exact'], len(chosen))} |")
    return "\n".join(lines)


def misses_table(sweep: Sweep) -> str:
    """Every non-exact case, and every clean run that claims anything."""
    lines = ["| group | model | exporter | form | plant | planted node | named | outcome | "
             "cause | verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {c.group} | {c.model} | {c.exporter} | {c.form} | {c.kind} | {c.planted} "
              f"({c.planted_op}) | {c.named} | {plant_outcome(c)} | {c.cause} | "
              f"{c.verdict[:90]} |" for c in sweep.cases if c.score != "exact"]
    lines += ["", "| group | model | exporter | rows | clean outcome | compared | detail |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {r.group} | {r.model} | {r.exporter} | {r.granularity} | {r.outcome} | "
              f"{r.compared} | {r.detail[:200]} |" for r in sweep.clean
              if r.outcome not in ("parity", "parity, nothing aligned")]
    vacuous = [f"{r.model} ({r.exporter}, {r.granularity})" for r in sweep.clean
               if r.outcome == "parity, nothing aligned"]
    if vacuous:
        lines += ["", f"Parity of final outputs only, nothing inside compared ({len(vacuous)}): "
                  + ", ".join(vacuous)]
    return "\n".join(lines)


def _grouped(records: list[Failure], shown: int = 12) -> list[str]:
    """Rows of ``group | stage | reason | count | models``, most frequent first."""
    grouped: dict[tuple[str, str, str], list[str]] = {}
    for record in records:
        grouped.setdefault((record.group, record.stage, record.reason), []).append(record.model)
    rows = []
    for (group, stage, reason), models in sorted(grouped.items(), key=lambda i: -len(i[1])):
        names = ", ".join(models[:shown]) + (", ..." if len(models) > shown else "")
        rows.append(f"| {group} | {stage} | {reason} | {len(models)} | {names} |")
    return rows


def failures_table(sweep: Sweep) -> str:
    """Build and export failures grouped by reason, with the models; discarded plants."""
    lines = ["| group | stage | reason | count | models |", "|---|---|---|---:|---|",
             *_grouped(sweep.failures)]
    if sweep.discards:
        lines += ["", "| group | exporter | discarded plant | count | models |",
                  "|---|---|---|---:|---|", *_grouped(sweep.discards)]
    return "\n".join(lines)


def print_sweep(header: str, sweep: Sweep) -> None:
    """The header, the clean and planted tables, every miss, every failure."""
    print(header + "\n")
    print("#### Clean exports (PyTorch form; rows as bisect picks them, and op rows)\n")
    print(clean_table(sweep))
    print("\n#### Plants\n")
    print(plant_table(sweep))
    print("\n#### Every non-exact case and every clean run that claims anything\n")
    print(misses_table(sweep))
    print("\n#### Models that did not build or export\n")
    print(failures_table(sweep))


def load(path: Path) -> tuple[str, Sweep]:
    """A run saved with ``--out``: its header and findings."""
    saved = json.loads(path.read_text())
    return saved["header"], Sweep(
        [CleanRun(**r) for r in saved["clean"]], [SweepCase(**c) for c in saved["cases"]],
        [Failure(**f) for f in saved["failures"]], [Failure(**f) for f in saved["discards"]],
        Counter(saved["built"]))


def main() -> None:
    """Sweep, print the tables, save the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plants", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=45.0, metavar="MINUTES")
    parser.add_argument("--only", help="comma-separated model names (default: all)")
    parser.add_argument("--groups", default=",".join(GROUPS), help="comma-separated groups")
    parser.add_argument("--exporters", default=",".join(EXPORTERS),
                        help="comma-separated exporters (default: both)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="keep the clean and planted files in DIR (default: a temporary one)")
    parser.add_argument("--from-json", type=Path, metavar="FILE",
                        help="print the tables of a run saved with --out; run nothing")
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per bisection")
    args = parser.parse_args()
    if args.from_json:
        print_sweep(*load(args.from_json))
        return
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    if args.verbose:
        logging.disable(logging.NOTSET)
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        logging.getLogger("sweep").setLevel(logging.INFO)
        logging.getLogger("bisect_onnx").setLevel(logging.ERROR)
    only = set(args.only.split(",")) if args.only else None
    groups = set(args.groups.split(","))
    chosen = [e for e in entries() if e.group in groups and (only is None or e.name in only)]
    started = time.perf_counter()
    sweep, done = Sweep(), 0
    with (contextlib.nullcontext(args.keep) if args.keep
          else tempfile.TemporaryDirectory()) as folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        for entry in chosen:
            if time.perf_counter() - started > 60 * args.time_limit:
                break
            run_entry(entry, args.plants, Path(folder), sweep,
                      tuple(args.exporters.split(",")))
            done += 1
    header = (f"models: {done} of {len(chosen)} started ("
              + ", ".join(f"{g} {sum(e.group == g for e in chosen[:done])}" for g in GROUPS)
              + f"), exporters {args.exporters}, {args.plants} plants per export, "
              f"{(time.perf_counter() - started) / 60:.1f} minutes, bisect-onnx "
              f"{bisect_onnx.__version__} from {Path(bisect_onnx.__file__).parent}")
    print_sweep(header, sweep)
    if args.out:
        args.out.write_text(json.dumps({
            "header": header, "clean": [asdict(r) for r in sweep.clean],
            "cases": [asdict(c) for c in sweep.cases],
            "failures": [asdict(f) for f in sweep.failures],
            "discards": [asdict(f) for f in sweep.discards], "built": dict(sweep.built)},
            indent=1))


if __name__ == "__main__":
    main()
