"""ONNX against ONNX: a reference ONNX model and a candidate, layer by layer.

After export come float16 conversion, quantization, graph simplification and other
execution providers, and each can break parity again. The reference is an ONNX model
in ONNX Runtime (every value promoted) or in ONNX's reference evaluator; the
candidate is an ONNX model in ONNX Runtime with its own provider and optimization
level (the same file, or another: its float16 conversion, its QDQ version, its
simplified form). Values are paired by name through the Casts and Q/DQ pairs
converters insert (:mod:`bisect_onnx.align.onnx_pairs`), compared with tolerances that
follow the candidate's precision (:mod:`bisect_onnx.judge.tolerances`), and run through
the same sample loop, production probes, attribution and repro as the PyTorch form.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.errors import InputError, UsageError
from bisect_onnx.events import BISECTION_STARTED, emit
from bisect_onnx.judge.records import Report
from bisect_onnx.judge.tolerances import Judge
from bisect_onnx.pipeline.onnx_sample import OnnxModels, OnnxSample, run_onnx_sample
from bisect_onnx.pipeline.options import (
    FixOptions,
    OutputOptions,
    RandomInputs,
    RuntimeOptions,
    SearchOptions,
    Tolerance,
)
from bisect_onnx.pipeline.prepare import onnx_model_path
from bisect_onnx.pipeline.repro import write_sample_repro
from bisect_onnx.pipeline.samples import (
    as_arrays,
    check_repro_folders,
    compare_samples,
    random_samples,
    samples_kind,
)
from bisect_onnx.pipeline.sweep import (
    bisect_swept,
    check_one_sweep_sample,
    onnx_outputs_compared,
    run_sweep,
)
from bisect_onnx.runtime.heap import give_back, kept_in_heap
from bisect_onnx.runtime.reference_evaluator.runner import ReferenceEvaluatorRunner
from bisect_onnx.runtime.runner import Runner
from bisect_onnx.runtime.sides import SampleArrays
from bisect_onnx.sources.arrangement import arrange_inputs
from bisect_onnx.sources.file_kinds import check_onnx_file
from bisect_onnx.sources.graph_inputs import check_against_onnx
from bisect_onnx.sources.input_samples import Samples
from bisect_onnx.sources.input_sizes import input_budget
from bisect_onnx.sources.output_paths import check_run_files, same_file

if TYPE_CHECKING:
    import onnx

__all__ = ["bisect_onnx_models", "compare_onnx_models", "check_onnx_file"]

logger = logging.getLogger(__name__)

SAME_FILE = ("the candidate {candidate} is the reference's file {reference} (a link to it, "
             "or its name again), run the same way: it can only agree with itself; give the "
             "other file, or another optimization level, provider or runtime to compare")
NOTHING_TO_COMPARE = (
    "the reference and the candidate are the same model run the same way; give a "
    "candidate (--against FILE), another optimization level (--against-opt-level), "
    "provider (--against-provider) or runtime (--against-runtime), or "
    "--against-reference-evaluator")

NO_MEMORY_BUDGET = (
    "max_memory applies to bisect(); bisect_onnx_models captures every value of both "
    "models: drop it from {which}")

NO_GRANULARITY = (
    "granularity applies to bisect() (op or module rows of a PyTorch model); "
    "bisect_onnx_models compares value by value: drop it from search")

#: ``reference_runtime`` that runs the reference in ``onnx.reference`` instead of ORT.
REFERENCE_EVALUATOR = "onnx.reference"

REFERENCE_PROMOTES_ALL = (
    "the reference's values are always all promoted; drop promote from reference_runtime "
    "(candidate_runtime's promote is the candidate's)")


def bisect_onnx_models(
    reference: str | Path | onnx.ModelProto,
    candidate: str | Path | onnx.ModelProto | None = None,
    inputs: object = None,
    *,
    reference_runtime: RuntimeOptions | str | None = None,
    candidate_runtime: RuntimeOptions | None = None,
    tolerance: Tolerance | tuple[float, float] | None = None,
    search: SearchOptions | None = None,
    output: OutputOptions | None = None,
    suggest_fix: bool | FixOptions | None = None,
) -> Report:
    """Compare two ONNX models (or one model run two ways), value by value.

    Args:
        reference: The reference ONNX model: a path or an ``onnx.ModelProto``.
        candidate: The candidate ONNX model; ``None`` runs the reference model again,
            as ``candidate_runtime`` says.
        inputs: One array, a sequence in the graph's input order, or a mapping by the
            reference graph's input names; :class:`~bisect_onnx.Samples` of several
            such sets; or :class:`~bisect_onnx.RandomInputs` to draw them (``None``:
            with its defaults). The report is the worst sample's.
        reference_runtime: Provider and optimization level of the reference in ONNX
            Runtime (every value is promoted, so ``promote`` is refused), or
            ``"onnx.reference"`` to run it in ONNX's reference evaluator (standard
            ops only).
        candidate_runtime: Provider, optimization level and promotion of the
            candidate; by default the reference's provider and level.
        tolerance: A :class:`~bisect_onnx.Tolerance` (per-value rules matched on value
            names) or an ``(rtol, atol)`` pair; an rtol or atol left ``None`` follows
            the narrower precision of the two models (float16 and bfloat16 looser than
            float32, a quantized value by its scale).
        search: ``all_culprits``: check every failing value on the reference's values
            and list each one that introduces error (``report.culprits``), not only
            the first; ``sweep``: from the one sample, the free dimensions at other sizes
            and the inputs at other scales, final outputs only, until one combination
            fails, which is bisected (``report.sweep``). Its ``granularity`` is for
            PyTorch models and is refused.
        output: Where a divergence's standalone repro of the first culprit is written
            (``repro_dir``; ``<dir>/sample-<k>`` for each diverging random sample),
            the reference's values fed to the candidate's nodes; ``label`` names the
            reference in the progress events.
        suggest_fix: ``True`` (or a :class:`~bisect_onnx.FixOptions`): for a float16,
            bfloat16 or QDQ candidate, search the nodes to keep in float32 or leave
            unquantized, each checked by a rerun (``report.fixes``).

    Returns:
        The :class:`~bisect_onnx.judge.records.Report`, as :func:`bisect_onnx.bisect` gives.
    """
    return compare_onnx_models(
        reference, candidate, inputs, reference_runtime=reference_runtime,
        candidate_runtime=candidate_runtime, tolerance=tolerance, search=search,
        output=output, suggest_fix=suggest_fix)


def compare_onnx_models(
    reference: str | Path | onnx.ModelProto,
    candidate: str | Path | onnx.ModelProto | None = None,
    inputs: object = None,
    *,
    reference_runtime: RuntimeOptions | str | None = None,
    candidate_runtime: RuntimeOptions | None = None,
    tolerance: Tolerance | tuple[float, float] | None = None,
    search: SearchOptions | None = None,
    output: OutputOptions | None = None,
    suggest_fix: bool | FixOptions | None = None,
    keep_sample: Callable[[OnnxSample], None] | None = None,
) -> Report:
    """:func:`bisect_onnx_models`; ``keep_sample`` is handed each sample once its stages ran.

    (A recording keeps what the archive needs of it: the reference's values, the pairing.)
    """
    tolerance = Tolerance.of(tolerance)
    fixes = FixOptions.of(suggest_fix)
    from bisect_onnx.fixes.stage import check_write_fixed, write_fixed  # imports onnx: lazily
    check_write_fixed(fixes.write_fixed, (reference, candidate))
    search, output = search or SearchOptions(), output or OutputOptions()
    if search.granularity is not None:
        raise UsageError(NO_GRANULARITY)
    evaluator = _runs_in_evaluator(reference_runtime)
    reference_runtime = (RuntimeOptions() if evaluator or reference_runtime is None
                         else reference_runtime)
    random_inputs = inputs if isinstance(inputs, RandomInputs) else RandomInputs()
    inputs = None if isinstance(inputs, RandomInputs) else inputs
    _check_before_running(reference, candidate, inputs, random_inputs, tolerance=tolerance,
                          search=search, output=output)
    rules = tolerance.per_value()
    candidate_runtime = candidate_runtime or RuntimeOptions(
        provider=reference_runtime.provider, opt_level=reference_runtime.opt_level,
        runtime=reference_runtime.runtime, precision=reference_runtime.precision)
    _check_runtimes(reference_runtime, candidate_runtime)
    if not evaluator and reference_runtime.runs_like(candidate_runtime):
        _check_two_models(reference, candidate)
    emit(BISECTION_STARTED, output.label or str(reference))
    with tempfile.TemporaryDirectory(prefix="bisect-onnx-") as workdir:
        reference_path, reference_label = _model_path(reference, Path(workdir), "reference")
        candidate_path, candidate_label = (
            (reference_path, reference_label) if candidate is None
            else _model_path(candidate, Path(workdir), "candidate"))
        models = _Models(OnnxModels(
            ReferenceEvaluatorRunner(reference_path) if evaluator
            else reference_runtime.runner(reference_path, promote="all"),
            labels=(reference_label, candidate_label), rtol=tolerance.rtol,
            atol=tolerance.atol, rules=rules, all_culprits=search.all_culprits,
            fixes=fixes, user_paths=(reference, candidate)),
            candidate_runtime.runner(candidate_path), keep_sample=keep_sample)
        # A large model's sessions are made in the heap, each making's buffers reusing
        # one another's pages (runtime/heap.py); what it kept is given back at the end.
        large = any(side.holds_weights_once for side in (models.reference, models.candidate))
        try:
            with kept_in_heap(large):
                report = _compare(models, inputs, random_inputs, sweep=search.sweep,
                                  repro_dir=output.repro_dir)
                return write_fixed(report, fixes.write_fixed, (reference, candidate))
        finally:
            give_back()


@dataclass
class _Models:
    """The two models of one run; what a sample changes for the samples after it."""

    shared: OnnxModels
    candidate: Runner
    """The runtime under test; a promote-all one once a fallback was needed."""
    fell_back: str | None = None
    """The promote-all fallback's warning, said in every sample once it happened."""
    keep_sample: Callable[[OnnxSample], None] | None = None
    """Handed each sample once its stages ran (a recording keeps its values)."""

    @property
    def reference(self) -> Runner:
        """The reference model's runner."""
        return self.shared.reference

    def run_sample(self, arrays: list[np.ndarray], description: str):
        """One sample through every stage: its report, and how to write its repro."""
        sample = run_onnx_sample(OnnxSample(
            self.shared, self.candidate, arrays,
            _candidate_inputs(arrays, self.reference, self.candidate), description,
            fell_back=self.fell_back))
        self.candidate, self.fell_back = sample.candidate, sample.fell_back
        if self.keep_sample is not None:
            self.keep_sample(sample)
        return sample.report, partial(_write_repro, report=sample.report,
                                      candidate=sample.candidate, values=sample.values,
                                      tolerance=sample.paired.judge)


def _write_repro(folder: Path, report: Report, candidate: Runner,
                 values: SampleArrays, tolerance: Judge) -> dict[str, Any]:
    """Write the first culprit's minimal repro, the reference's values as the expected."""
    record = report.culprit or report.first_divergence
    if record.onnx_value not in values.candidate:
        record = report.first_divergence
    return write_sample_repro(
        folder, report=report, candidate=candidate, failing_value=record.onnx_value,
        values=values, tolerance=tolerance.of(record), reference_label="the reference model")


def _model_path(model: object, folder: Path, label: str) -> tuple[Path, str]:
    """A path ONNX Runtime can read, and how the report names the model."""
    if isinstance(model, (str, Path)):
        check_onnx_file(Path(model), label)
        return Path(model), str(model)
    import onnx

    if not isinstance(model, onnx.ModelProto):
        raise InputError(f"the {label} must be a path or an onnx.ModelProto, got "
                         f"{type(model).__name__}")
    folder = folder / label  # each model its own folder: the proto is saved as given.onnx
    folder.mkdir()
    return onnx_model_path(model, folder)


def _runs_in_evaluator(reference_runtime: RuntimeOptions | str | None) -> bool:
    """Whether ``reference_runtime`` names ONNX's reference evaluator (other text is refused)."""
    if not isinstance(reference_runtime, str):
        return False
    if reference_runtime != REFERENCE_EVALUATOR:
        raise UsageError(f"reference_runtime {reference_runtime!r} is not a runtime; pass "
                         f"RuntimeOptions(...), or {REFERENCE_EVALUATOR!r} for ONNX's "
                         "reference evaluator")
    return True


def _check_runtimes(reference: RuntimeOptions, candidate: RuntimeOptions) -> None:
    """Refuse the runtime options this comparison would otherwise ignore."""
    for which, runtime in (("reference_runtime", reference), ("candidate_runtime", candidate)):
        if runtime.max_memory is not None:
            raise UsageError(NO_MEMORY_BUDGET.format(which=which))
    if reference.promote != RuntimeOptions.promote:
        raise UsageError(REFERENCE_PROMOTES_ALL)


def _reference_inputs(reference: Runner, inputs: object, random_inputs: RandomInputs,
                      ) -> Iterator[tuple[list[np.ndarray], str]]:
    """The reference graph's inputs: given (arranged by name), or samples drawn from it."""
    if inputs is None:
        yield from random_samples(reference.inputs, reference.model, random_inputs,
                                  budget=input_budget())
        return
    sets = inputs.described() if isinstance(inputs, Samples) else [(inputs, "given")]
    for one, description in sets:
        arrays = arrange_inputs(as_arrays(one),
                                forward_names=[spec.name for spec in reference.inputs])
        check_against_onnx(arrays, reference.inputs)
        yield arrays, description


def _candidate_inputs(arrays: Sequence[np.ndarray], reference: Runner,
                      candidate: Runner) -> list[np.ndarray]:
    """The same inputs for the candidate, floats cast to its input types (float16 I/O)."""
    if len(candidate.inputs) != len(arrays):
        raise InputError(f"the reference takes {len(arrays)} input(s) and the candidate "
                         f"{len(candidate.inputs)}; compare models with the same inputs")
    converted = [array.astype(spec.dtype) if array.dtype.kind == "f" and spec.dtype.kind == "f"
                 else array for array, spec in zip(arrays, candidate.inputs, strict=True)]
    check_against_onnx(converted, candidate.inputs)
    return converted


def _check_two_models(reference: object, candidate: object) -> None:
    """Where both sides run alike: refuse a model compared with itself (no candidate, its file)."""
    if candidate is None:
        raise UsageError(NOTHING_TO_COMPARE)
    if isinstance(reference, (str, Path)) and isinstance(candidate, (str, Path)) \
            and same_file(Path(reference), Path(candidate)):
        raise UsageError(SAME_FILE.format(candidate=candidate, reference=reference))


def _check_before_running(reference: object, candidate: object, inputs: object,
                          random_inputs: RandomInputs, *, tolerance: Tolerance,
                          search: SearchOptions, output: OutputOptions) -> None:
    """What is refused before anything runs: the sweep's samples, the files, the repro folder."""
    if search.sweep:
        check_one_sweep_sample(_sample_count(inputs, random_inputs))
    check_run_files({"output.repro_dir": output.repro_dir},
                    onnx_models={"reference": reference, "candidate": candidate},
                    tolerances=tolerance.rules, folders={"output.repro_dir"})
    check_repro_folders(output.repro_dir, inputs, sweep=search.sweep)


def _compare(models: _Models, inputs: object, random_inputs: RandomInputs, *, sweep: bool,
             repro_dir: str | Path | None) -> Report:
    """Every sample compared, the worst one's report; or the sweep from the one sample."""
    samples = _reference_inputs(models.reference, inputs, random_inputs)
    if sweep:
        return _swept(models, next(samples), repro_dir=repro_dir)
    return compare_samples(samples, models.run_sample, repro_dir=repro_dir,
                           kind=samples_kind(inputs))


def _swept(models: _Models, sample: tuple[list[np.ndarray], str], *,
           repro_dir: str | Path | None) -> Report:
    """The sweep from ``sample`` (final outputs only), its first failing combination bisected."""
    reference, candidate = models.reference, models.candidate
    compare = onnx_outputs_compared(
        models.shared, candidate,
        lambda arrays: _candidate_inputs(arrays, reference, candidate))
    return bisect_swept(sample, lambda arrays: run_sweep(reference.inputs, arrays, compare,
                                                         budget=input_budget()),
                        models.run_sample, repro_dir=repro_dir)


def _sample_count(inputs: object, random_inputs: RandomInputs) -> int:
    """How many samples the run compares: random draws, the given sets, or one."""
    if inputs is None:
        return random_inputs.samples
    return len(inputs.described()) if isinstance(inputs, Samples) else 1

