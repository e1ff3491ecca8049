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
from bisect_onnx.judge.records import Report
from bisect_onnx.pipeline.options import (
    ExportOptions,
    OutputOptions,
    RandomInputs,
    RuntimeOptions,
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
from bisect_onnx.runtime.heap import kept_in_heap
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
) -> None:
    """Assert that the ONNX model's final outputs match the PyTorch model's.

    Args:
        model: What :func:`bisect_onnx.bisect` takes (an ``nn.Module``, a program, a path).
        inputs: The inputs, as :func:`bisect_onnx.bisect` takes them (given, not drawn).
        onnx_model: The export under test; without it the model is exported here.
        tolerance: As :func:`bisect_onnx.bisect` takes it (a ``Tolerance`` or an
            ``(rtol, atol)`` pair; ``|onnx - torch| > atol + rtol * |torch|`` fails).
        export: How to export when ``onnx_model`` is not given.
        output: ``repro_dir``: where a failing check writes its report
            (``<label>.json`` and ``<label>.html``) and the repro of its first
            divergence (``<label>.repro/``); ``label``: the check's name in messages
            and those file names (``None``: the model's class).

    Raises:
        ParityError: A final output is out of tolerance; ``.report`` holds the bisection.
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not ours
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
        prepared = prepare_candidate(reference, given, onnx_model, export, Path(workdir))
        arrays = arrange_for(reference, prepared.candidate, given)
        check_against_onnx(arrays, prepared.candidate.inputs)
        if prepared.capture is None:
            emit(CAPTURE_STARTED, "pytorch")
        capture = prepared.capture or reference.side.run(arrays, keywords=prepared.keywords)
        # PyTorch's values are recorded: one copy of the weights (the file's, where it can)
        parking.park(prepared.candidate.model, prepared.candidate.path.parent)
        warnings: list[str] = []
        with kept_in_heap(parking.parked):  # its pages kept for the weights read back
            outputs = prepared.candidate.run_outputs(arrays)
        records = compare_final_outputs(capture.outputs, outputs, judge=judge,
                                        warnings=warnings)
        agree = not any(record.failed for record in records) and all(
            is_vacuity(warning) for warning in warnings)
        emit(PARITY_CHECKED, f"{label}: {'parity' if agree else 'diverged'}")
        if agree:
            for warning in warnings:  # parity that says nothing, said
                logger.warning("%s: %s", label, warning)
            return
        stem = _file_name(label)
        folder = Path(output.repro_dir) if output.repro_dir is not None else None
        # The bisection reuses this export (which recorded which call of a reused
        # module each node ran in) and PyTorch's run on these inputs.
        emit(BISECTION_STARTED, output.label or "")
        settings = Settings(reference, prepared, export, Path(workdir), judge=judge,
                            budget=RuntimeOptions().budget(), parking=parking)
        report = run_prepared(settings, [(given, "given")], RandomInputs(),
                              repro_dir=folder / f"{stem}.repro" if folder is not None
                              else None)
    if folder is not None:
        _write_artifacts(report, folder, stem)
    raise ParityError(_failure_message(report, label, records, warnings), report)


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
