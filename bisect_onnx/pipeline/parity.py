"""Parity checks for test suites: cheap when parity holds, a bisection when it breaks.

``assert_parity`` first compares only the final outputs (one plain ONNX Runtime
session, nothing promoted). Only when they disagree does it run the full
bisection, and raise :class:`~bisect_onnx.errors.ParityError` with the verdict and
the table rows around the culprit, so a CI log says *where* parity broke.
"""

from __future__ import annotations

import logging
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from bisect_onnx.errors import ParityError
from bisect_onnx.events import BISECTION_STARTED, CAPTURE_STARTED, PARITY_CHECKED, emit
from bisect_onnx.graph.provenance import Provenance
from bisect_onnx.judge.records import Report
from bisect_onnx.judge.tolerance_judge import ToleranceJudge
from bisect_onnx.pipeline.check_reference import (
    check,
    check_models,
    recorded_inputs,
    reference_onnx_path,
)
from bisect_onnx.pipeline.options import (
    ExportOptions,
    FixOptions,
    OutputOptions,
    RandomInputs,
    RuntimeOptions,
    SearchOptions,
    Tolerance,
)
from bisect_onnx.pipeline.prepare import arrange_for, prepare_candidate, resolve_export
from bisect_onnx.pipeline.pytorch_vs_onnx import run_prepared
from bisect_onnx.pipeline.samples import as_arrays
from bisect_onnx.pipeline.torch_comparison import compare_final_outputs, is_vacuity
from bisect_onnx.pipeline.torch_settings import Settings
from bisect_onnx.pytorch.fast_paths import as_the_exporter_runs
from bisect_onnx.pytorch.module_side import model_untouched
from bisect_onnx.pytorch.parking import parking_for
from bisect_onnx.pytorch.reference import exit_is_a_model_error, reference_for
from bisect_onnx.reference.archive import looks_like_reference
from bisect_onnx.reference.loaded import Reference
from bisect_onnx.runtime.heap import kept_in_heap
from bisect_onnx.runtime.registry import display_name
from bisect_onnx.runtime.sides import CapturedValue
from bisect_onnx.sources.graph_inputs import check_against_onnx
from bisect_onnx.sources.output_paths import check_run_files

if TYPE_CHECKING:
    import onnx
    import torch
    from torch.export import ExportedProgram

__all__ = ["assert_parity"]

logger = logging.getLogger(__name__)


@exit_is_a_model_error
def assert_parity(
    model: torch.nn.Module | ExportedProgram | torch.onnx.ONNXProgram | str | Path,
    inputs: object,
    onnx_model: str | Path | onnx.ModelProto | torch.onnx.ONNXProgram | None = None,
    *,
    tolerance: Tolerance | tuple[float, float] | None = None,
    export: ExportOptions | None = None,
    output: OutputOptions | None = None,
    runtime: RuntimeOptions | None = None,
) -> None:
    """Assert that the ONNX model's final outputs match the PyTorch model's.

    Args:
        model: What :func:`bisect_onnx.bisect` takes, or a recorded reference (its path).
        inputs: As :func:`bisect_onnx.bisect` takes them (a reference's: ``None``).
        onnx_model: The export under test; without it the model is exported here.
        tolerance: As :func:`bisect_onnx.bisect` takes it (a ``Tolerance``, ``(rtol, atol)``).
        export: How to export when ``onnx_model`` is not given.
        output: ``repro_dir``: where a failing check writes its report (``<label>.json``,
            ``.html``) and its first divergence's repro (``<label>.repro/``); ``label``:
            its name in messages and those file names (``None``: the model's class).
        runtime: What runs the ONNX model (``None``: ONNX Runtime's CPU).

    Raises:
        ParityError: A final output is out of tolerance; ``.report`` holds the bisection.
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not ours
    if isinstance(model, Reference) or looks_like_reference(model):  # no PyTorch needed
        return _assert_recorded_parity(model, inputs, onnx_model, tolerance, output, runtime)
    tolerance = Tolerance.of(tolerance)
    judge = tolerance.judge()
    output = output or OutputOptions()
    check_run_files({"output.repro_dir": output.repro_dir,
                     "export.save_to": export and export.save_to},
                    model=model, onnx_models={"onnx_model": onnx_model},
                    tolerances=tolerance.rules, folders={"output.repro_dir"},
                    makes_parents={"export.save_to"})
    reference = reference_for(model, label=output.label)
    export = resolve_export(reference, onnx_model, export)
    label = output.label or reference.side.describe().get("class", "model")
    given = as_arrays(inputs)
    with (model_untouched(model),  # its buffers and modes as they came, on leaving
          tempfile.TemporaryDirectory(prefix="bisect-onnx-parity-") as workdir,
          parking_for(reference.exportable, Path(workdir)) as parking,
          as_the_exporter_runs()):  # as bisect runs it: the exporters' path
        prepared = prepare_candidate(reference, given, onnx_model, export, Path(workdir), runtime)
        arrays = arrange_for(reference, prepared.candidate, given)
        check_against_onnx(arrays, prepared.candidate.inputs)
        if prepared.capture is None:
            emit(CAPTURE_STARTED, "pytorch")
        capture = prepared.capture or reference.side.run(arrays, keywords=prepared.keywords)
        # PyTorch's values are recorded: one copy of the weights (the file's, where it can)
        parking.park(prepared.candidate.model, prepared.candidate.path.parent,
                     model_file=prepared.candidate.path)
        warnings: list[str] = []
        with kept_in_heap(parking.parked):  # its pages kept for the weights read back
            outputs = prepared.candidate.run_outputs(arrays)
        records = compare_final_outputs(capture.outputs, outputs, judge=judge,
                                        warnings=warnings)
        if _agreed(label, records, warnings):
            return
        stem = _file_name(label)
        folder = Path(output.repro_dir) if output.repro_dir is not None else None
        # The bisection reuses this export (which recorded which call of a reused
        # module each node ran in) and PyTorch's run on these inputs.
        emit(BISECTION_STARTED, output.label or "")
        settings = Settings(reference, prepared, export, Path(workdir), judge=judge,
                            budget=(runtime or RuntimeOptions()).budget(), parking=parking)
        report = run_prepared(settings, [(given, "given")], RandomInputs(),
                              repro_dir=folder / f"{stem}.repro" if folder is not None
                              else None)
    if folder is not None:
        _write_artifacts(report, folder, stem)
    raise ParityError(_failure_message(report, label, records, warnings), report)


def _assert_recorded_parity(reference: Reference | str | Path, inputs: object,
                            onnx_model: str | Path | None,
                            tolerance: Tolerance | tuple[float, float] | None,
                            output: OutputOptions | None,
                            runtime: RuntimeOptions | None) -> None:
    """:func:`assert_parity` against a reference recorded where PyTorch runs.

    Production's final outputs against the recorded ones, one run; only where they
    disagree is the whole check made (:func:`~bisect_onnx.pipeline.check_reference.check`).
    """
    __tracebackhide__ = True
    output, runtime = output or OutputOptions(), runtime or RuntimeOptions()
    loaded = (reference if isinstance(reference, Reference)
              else Reference.load(reference, max_memory=runtime.max_memory))
    label = output.label or loaded.path.stem
    check_run_files({"output.repro_dir": output.repro_dir},
                    onnx_models={"onnx_model": onnx_model}, folders={"output.repro_dir"})
    with tempfile.TemporaryDirectory(prefix="bisect-onnx-parity-") as workdir:
        candidate = runtime.runner(reference_onnx_path(loaded, onnx_model, Path(workdir)))
        models = check_models(loaded, candidate, Tolerance.of(tolerance), SearchOptions(),
                              FixOptions(), False, onnx_model)
        arrays = recorded_inputs(loaded, candidate, inputs)
        names = [row.onnx_value for row in loaded.manifest.final_outputs]
        values = loaded.values(names)  # the final outputs alone are read
        recorded = [CapturedValue(name, values[name], Provenance(position=index))
                    for index, name in enumerate(names)]
        emit(CAPTURE_STARTED, display_name(candidate.runtime))
        warnings: list[str] = []
        records = compare_final_outputs(
            recorded, candidate.run_outputs(arrays), warnings=warnings,
            judge=ToleranceJudge.from_floats(
                # A reference ONNX file's: its comparison's tolerance (the precision's).
                loaded.manifest.rtol if models.rtol is None else models.rtol,
                loaded.manifest.atol if models.atol is None else models.atol, models.rules))
    if _agreed(label, records, warnings):
        return
    stem = _file_name(label)
    folder = Path(output.repro_dir) if output.repro_dir is not None else None
    report = check(loaded, onnx_model, inputs, runtime=runtime, tolerance=tolerance,
                   output=OutputOptions(repro_dir=folder / f"{stem}.repro" if folder else None,
                                        label=label))
    if folder is not None:
        _write_artifacts(report, folder, stem)
    raise ParityError(_failure_message(report, label, records, warnings), report)


def _agreed(label: str, records: list, warnings: list[str]) -> bool:
    """Whether the final outputs agree (said as an event); parity that says nothing, said."""
    agree = not any(record.failed for record in records) and all(
        is_vacuity(warning) for warning in warnings)
    emit(PARITY_CHECKED, f"{label}: {'parity' if agree else 'diverged'}")
    if agree:
        for warning in warnings:
            logger.warning("%s: %s", label, warning)
    return agree


def _write_artifacts(report: Report, folder: Path, stem: str) -> None:
    """The JSON and HTML reports beside the repro (checked writable before the run)."""
    folder.mkdir(parents=True, exist_ok=True)
    report.save(folder / f"{stem}.json")
    report.save(folder / f"{stem}.html")


def _failure_message(report: Report, label: str, records: list, warnings: list[str]) -> str:
    """What the ParityError says: the verdict and table, or why only the plain run failed."""
    if report.diverged:
        return f"ONNX parity of {label} broke.\n{report.summary()}\n\n{report.table()}"
    # The plain session disagreed, the promoted one did not: ORT fuses differently
    # when every value is an output (or the outputs do not pair up).
    failing = [record for record in records if record.failed]
    details = "; ".join(warnings + [
        f"output {record.index} ({record.onnx_value}): {record.figures.status}, max abs "
        f"{record.figures.max_abs_error}" for record in failing])
    return (f"ONNX parity of {label} broke in production's plain run ({details}), "
            "but not when every value is recorded: the difference lives in what the "
            "runtime fuses when nothing is promoted")


def _file_name(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_") or "model"
