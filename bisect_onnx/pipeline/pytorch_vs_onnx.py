"""PyTorch against ONNX: the public ``bisect``, one sample at a time through the stages.

Data flows one way: prepare the ONNX model (export or given file), then each sample
runs through the list of stages of :mod:`bisect_onnx.pipeline.torch_sample` (capture
both sides, compare, search production where the capture cannot show the first
divergence, attribute it, describe the run), and the worst sample's report is the run's.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.events import BISECTION_STARTED, emit
from bisect_onnx.judge.records import Report
from bisect_onnx.pipeline.options import (
    ExportOptions,
    FixOptions,
    OutputOptions,
    RandomInputs,
    RuntimeOptions,
    SearchOptions,
    Tolerance,
)
from bisect_onnx.pipeline.prepare import (
    arrange_for,
    prepare_candidate,
    resolve_export,
)
from bisect_onnx.pipeline.samples import (
    RANDOM_SAMPLES,
    check_repro_folders,
    compare_samples,
    given_input_sets,
    random_samples,
    samples_kind,
)
from bisect_onnx.pipeline.sweep import check_one_sweep_sample, swept
from bisect_onnx.pipeline.torch_sample import run_torch_sample
from bisect_onnx.pipeline.torch_settings import Settings, computed_precision
from bisect_onnx.pytorch.fast_paths import as_the_exporter_runs
from bisect_onnx.pytorch.installed import require_torch
from bisect_onnx.pytorch.module_side import model_untouched
from bisect_onnx.pytorch.parking import parking_for
from bisect_onnx.pytorch.reference import exit_is_a_model_error, reference_for
from bisect_onnx.sources.input_sizes import input_budget
from bisect_onnx.sources.output_paths import check_run_files

if TYPE_CHECKING:
    import onnx
    import torch
    from torch.export import ExportedProgram

    from bisect_onnx.pipeline.samples import GivenArrays

__all__ = ["bisect", "PyTorchCall", "compare_pytorch", "run_prepared", "SampleRunner"]

SampleRunner = Callable[[Settings, list[np.ndarray], str],
                        tuple[Report, Callable[..., dict[str, Any]]]]
"""One sample through the stages: its report, and how to write its repro
(:func:`~bisect_onnx.pipeline.torch_sample.run_torch_sample`)."""

logger = logging.getLogger(__name__)


@exit_is_a_model_error
def bisect(
    model: torch.nn.Module | ExportedProgram | torch.onnx.ONNXProgram | str | Path,
    inputs: object = None,
    *,
    onnx_model: str | Path | onnx.ModelProto | torch.onnx.ONNXProgram | None = None,
    tolerance: Tolerance | tuple[float, float] | None = None,
    export: ExportOptions | None = None,
    runtime: RuntimeOptions | None = None,
    search: SearchOptions | None = None,
    output: OutputOptions | None = None,
    suggest_fix: bool | FixOptions | None = None,
) -> Report:
    """Compare a PyTorch model with its ONNX export in ONNX Runtime, layer by layer.

    Args:
        model: An ``nn.Module`` (its train/eval mode is used as given), an
            ``ExportedProgram``, a ``torch.onnx.ONNXProgram`` (its own ONNX model is
            the one tested), a TorchScript module, or a path to a ``.pt2`` or
            TorchScript archive (a whole pickled module is refused: load it yourself
            with ``torch.load(path, weights_only=False)`` if you trust it).
        inputs: One array or tensor, a sequence in ``forward``'s order, or a mapping
            from ``forward``'s parameter names (or the ONNX input names) to arrays;
            :class:`~bisect_onnx.Samples` of several such sets to try each (the report
            is the worst one's); or :class:`~bisect_onnx.RandomInputs` (seed, free
            dimensions, sample count) to draw them from the ONNX graph's input
            specification, which ``None`` does with its defaults.
        onnx_model: An existing export to compare against: a path, an
            ``onnx.ModelProto`` or a ``torch.onnx.ONNXProgram``. Without it the
            model is exported here (see ``export``).
        tolerance: A :class:`~bisect_onnx.Tolerance` (with per-value rules matched on
            ONNX value, op (FX node) and module call names) or an ``(rtol, atol)``
            pair; an element fails when ``|onnx - torch| > atol + rtol * |torch|``.
            ``None``: ``DEFAULT_RTOL`` and ``DEFAULT_ATOL``.
        export: How to export when no ONNX model is given.
        runtime: Provider, optimization level, promotion and memory budget for ONNX
            Runtime.
        search: Table granularity (``op`` or ``module`` rows; ``None`` picks, see
            :class:`~bisect_onnx.SearchOptions`) and whether to list every culprit.
        output: Where a divergence's standalone repro is written (``repro_dir``;
            ``<dir>/sample-<k>`` for each diverging random sample) and how the report
            names the model (``label``).
        suggest_fix: ``True`` (or a :class:`~bisect_onnx.FixOptions`, which can name a
            ``write_fixed`` path): for the culprit's class, try fixes on a copy and
            rerun; ``report.fixes`` holds each, checked by its rerun.

    Returns:
        The :class:`~bisect_onnx.judge.records.Report`; ``report.verdict`` is ``parity``
        or ``diverged``, ``report.first_divergence`` the first failing record.
    """
    return compare_pytorch(PyTorchCall(model, inputs, onnx_model, tolerance, export, runtime,
                                       search, output, suggest_fix))


@dataclass(frozen=True)
class PyTorchCall:
    """The arguments of one :func:`bisect` call, as the user gave them."""

    model: torch.nn.Module | ExportedProgram | torch.onnx.ONNXProgram | str | Path
    inputs: object = None
    onnx_model: str | Path | onnx.ModelProto | torch.onnx.ONNXProgram | None = None
    tolerance: Tolerance | tuple[float, float] | None = None
    export: ExportOptions | None = None
    runtime: RuntimeOptions | None = None
    search: SearchOptions | None = None
    output: OutputOptions | None = None
    suggest_fix: bool | FixOptions | None = None
    program: ExportedProgram | None = None
    """The ExportedProgram the given file was translated from, where the caller knows
    it and a trace at the inputs' sizes would not be it (a decode step's export, made
    with dynamic shapes at other sizes): used for op level where it names the file's
    values, else a trace is made here as for any file."""


def compare_pytorch(call: PyTorchCall, run_sample: SampleRunner = run_torch_sample) -> Report:
    """:func:`bisect`, each sample compared by ``run_sample`` (a recording keeps its values).

    Its callers say a ``sys.exit`` in the model's code as a model error
    (:func:`~bisect_onnx.pytorch.reference.exit_is_a_model_error`), naming the model.

    Long because it is :func:`bisect`'s one step: options checked, the candidate
    prepared, every sample compared in the run's temporary folder.
    """
    require_torch()
    model, inputs, onnx_model, export = call.model, call.inputs, call.onnx_model, call.export
    tolerance, runtime, search, output = call.tolerance, call.runtime, call.search, call.output
    suggest_fix = call.suggest_fix
    tolerance = Tolerance.of(tolerance)
    judge = tolerance.judge()
    runtime = runtime or RuntimeOptions()
    search = search or SearchOptions()
    output = output or OutputOptions()
    fixes = FixOptions.of(suggest_fix)
    random_inputs = inputs if isinstance(inputs, RandomInputs) else RandomInputs()
    inputs = None if isinstance(inputs, RandomInputs) else inputs
    check_run_files({"output.repro_dir": output.repro_dir,
                     "export.save_to": export and export.save_to},
                    model=model, onnx_models={"onnx_model": onnx_model},
                    tolerances=tolerance.rules, folders={"output.repro_dir"},
                    makes_parents={"export.save_to"})
    check_repro_folders(output.repro_dir, inputs, sweep=search.sweep)
    from bisect_onnx.fixes.stage import check_write_fixed, write_fixed  # imports onnx: lazily

    check_write_fixed(fixes.write_fixed, (model, onnx_model))
    emit(BISECTION_STARTED, output.label or "")
    reference = reference_for(model, label=output.label)
    export = resolve_export(reference, onnx_model, export)
    given = given_input_sets(inputs)
    if search.sweep:  # before anything is exported
        check_one_sweep_sample(len(given) if given is not None else random_inputs.samples)
    with (model_untouched(model),  # its buffers and modes as they came, on leaving
          tempfile.TemporaryDirectory(prefix="bisect-onnx-") as workdir,
          parking_for(reference.exportable, Path(workdir)) as parking,
          as_the_exporter_runs()):  # attention layers' fast paths have no ONNX graph
        # The export is made on the first input set (and PyTorch's run on it kept).
        prepared = prepare_candidate(reference, given[0][0] if given else None, onnx_model,
                                     export, Path(workdir), runtime, program=call.program)
        precision, basis = computed_precision(prepared.candidate)
        if tolerance.follows_precision() and basis is not None:
            judge = tolerance.judge(precision)
        settings = Settings(reference, prepared, export, Path(workdir), judge=judge,
                            tolerance_basis=basis if tolerance.follows_precision() else None,
                            granularity=search.granularity,
                            all_culprits=search.all_culprits, sweep=search.sweep,
                            budget=runtime.budget(),  # what is left once the model is loaded
                            input_budget=input_budget(runtime.max_memory), parking=parking,
                            fixes=fixes)
        report = run_prepared(settings, given, random_inputs, repro_dir=output.repro_dir,
                              kind=samples_kind(inputs), run_sample=run_sample)
    return write_fixed(report, fixes.write_fixed, (model, onnx_model))


def run_prepared(settings: Settings, given: list[tuple[GivenArrays, str]] | None,
                 random_inputs: RandomInputs, *, repro_dir: str | Path | None,
                 kind: str | None = None,
                 run_sample: SampleRunner = run_torch_sample) -> Report:
    """Compare every sample against the prepared candidate; the worst sample's report.

    ``given``: the user's input sets with how each is described (see
    :func:`~bisect_onnx.pipeline.samples.given_input_sets`); ``None`` draws ``random_inputs``.
    ``kind``: what the given sets are (:func:`~bisect_onnx.pipeline.samples.samples_kind`).
    """
    candidate = settings.prepared.candidate
    if given is not None:
        samples = [(arrange_for(settings.reference, candidate, inputs), description)
                   for inputs, description in given]
    else:
        samples = random_samples(candidate.inputs, candidate.model, random_inputs,
                                 budget=settings.input_budget)
    if settings.sweep:
        return swept(settings, next(iter(samples)), partial(run_sample, settings),
                     repro_dir=repro_dir)
    return compare_samples(samples, partial(run_sample, settings), repro_dir=repro_dir,
                           kind=RANDOM_SAMPLES if given is None else kind)
