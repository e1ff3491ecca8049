"""The sweep: from one sample, other sizes of the free dimensions and other input values.

A sample at the export's shapes with positive values passes; the export may still hold
its batch as a constant, or a branch the tracer took for these values only. The sweep
runs both sides on inputs made from the sample, each free dimension of the ONNX graph
at several sizes (the sample's, 1, 2, a prime, the ends of a range the exporter
declared, the largest the memory budget allows) and, at each, float inputs drawn at several
scales and signs (integer inputs within the sample's range), comparing only the final
outputs (one reference forward and one run of the runtime each) until one combination
fails. That combination is then bisected as a sample is (the caller's pipeline);
where all pass, the sample itself is. The table is the report's ``sweep``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from bisect_onnx.errors import BisectOnnxError, RuntimeRefused, UsageError, one_line
from bisect_onnx.judge.assembly import amended
from bisect_onnx.judge.records import Record, Report
from bisect_onnx.judge.sweep_table import (
    FAILED,
    PASSED,
    REFUSED,
    SKIPPED,
    SweepRow,
    SweepTable,
    shapes_text,
)
from bisect_onnx.runtime.input_specs import InputSpec
from bisect_onnx.runtime.sides import CapturedValue
from bisect_onnx.sources.input_sizes import Budget, array_bytes

if TYPE_CHECKING:
    from bisect_onnx.pipeline.onnx_sample import OnnxModels
    from bisect_onnx.pipeline.samples import RunSample, Sample
    from bisect_onnx.pipeline.torch_settings import Settings
    from bisect_onnx.pytorch.reference import TorchReference
    from bisect_onnx.runtime.runner import Runner

__all__ = ["SCALES", "SAMPLE", "LARGEST_CAP", "Outcome", "CompareOutputs", "sweep_sizes",
           "free_dim_sizes", "sweep_inputs", "run_sweep", "check_one_sweep_sample",
           "outcome_of", "NOT_ONE_SAMPLE", "swept", "torch_outputs_compared",
           "declared_ranges", "bisect_swept", "onnx_outputs_compared"]

SAMPLE = "the sample"
"""The first row: the sample itself, as given."""
SCALES = ("N(0,1)", "x100 positive", "x100 negative")
"""How float inputs are drawn at each size: unit normal (both signs), then a hundred
times its magnitude with one sign each (a branch on a sum's sign, an overflow)."""
LARGEST_CAP = 64
"""The largest size a free dimension is tried at (a sensible bound on a run's time)."""
_LARGEST_FACTOR = 2
_LARGEST_FLOOR = 8
# Within the cap, the largest size is at most twice the sample's (at least 8): a forward
# at 64 where the sample is 4 costs sixteen of the sample's, and the sweep of an
# all-passing model is meant to cost a few comparisons (benchmarks/sweep.py: 64 made a
# small CNN's sweep 7.7x one comparison, 2x the sample's about 3x).
_PRIMES = (7, 13, 11, 5, 3)
# The activations of a forward take many times its inputs: the inputs of the largest
# size may take this share of the memory budget.
_INPUT_SHARE = 64

NOT_ONE_SAMPLE = ("--sweep starts from one sample: give one input set (one --input, or "
                  "--samples 1 for random inputs)")


class Outcome(NamedTuple):
    """What one combination's final outputs showed."""

    max_abs_error: float | None
    """The worst final output's (``None`` where no figure applies)."""
    verdict: str
    """``parity``, ``diverged``, ``refused`` or ``skipped``."""
    reason: str | None = None
    """Why it was refused or skipped, one line."""


CompareOutputs = Callable[[list[np.ndarray]], Outcome]
"""Both sides' final outputs on one combination's inputs, compared."""


@dataclass(frozen=True)
class _Combination:
    """One combination to try: the free dimensions' sizes and how floats are drawn."""

    sizes: Mapping[str, int]
    scale: str


def check_one_sweep_sample(count: int) -> None:
    """Refuse a sweep of several samples: it starts from one."""
    if count != 1:
        raise UsageError(NOT_ONE_SAMPLE)


def free_dim_sizes(specs: Sequence[InputSpec], arrays: Sequence[np.ndarray]) -> dict[str, int]:
    """The graph's free dimensions (by name, ``input:axis`` without one) at the sample's sizes."""
    sizes: dict[str, int] = {}
    for spec, array in zip(specs, arrays, strict=True):
        for axis, dim in enumerate(spec.shape or ()):
            if not isinstance(dim, int) and axis < np.ndim(array):
                sizes.setdefault(_dim_key(spec, axis, dim), int(np.shape(array)[axis]))
    return sizes


def _dim_key(spec: InputSpec, axis: int, dim: str | None) -> str:
    return dim if dim else f"{spec.name}:{axis}"


def sweep_sizes(sample: Mapping[str, int], largest: int,
                declared: Mapping[str, tuple[int, int | None]]) -> tuple[list[int], str | None]:
    """The sizes every free dimension is tried at together, and what was left out.

    The sample's (each dimension its own: its values are swept before its shapes), 1,
    2, a prime, the ends of a range the exporter declared, and ``largest``; a size
    outside a declared range is not tried. ``0`` in the list stands for the sample's.
    """
    prime = next((each for each in _PRIMES if each not in sample.values()), 17)
    ends = [end for low, high in declared.values() for end in (low, high)
            if end is not None and 1 <= end <= LARGEST_CAP]
    wanted = [0, 1, 2, prime, *ends, largest]
    sizes: list[int] = []
    outside = []
    for size in dict.fromkeys(wanted):
        if size != 0 and not _within(size, declared):
            outside.append(size)
        elif size == 0 or size not in sample.values() or len(set(sample.values())) > 1:
            sizes.append(size)
    note = (f"sizes outside the exporter's declared ranges not tried: "
            f"{', '.join(map(str, outside))}") if outside else None
    return sizes, note


def _within(size: int, declared: Mapping[str, tuple[int, int | None]]) -> bool:
    return all(low <= size and (high is None or size <= high)
               for low, high in declared.values())


def largest_size(specs: Sequence[InputSpec], arrays: Sequence[np.ndarray],
                 sample: Mapping[str, int], budget: Budget | None) -> int:
    """The largest size whose inputs fit the memory budget's share, within the caps.

    At most :data:`LARGEST_CAP`, and twice the sample's largest free size (at least 8).
    """
    cap = min(LARGEST_CAP, max(_LARGEST_FLOOR, _LARGEST_FACTOR * max(sample.values())))
    if budget is None or budget.size is None:
        return cap
    free = list(sample)
    for size in range(cap, 0, -1):
        shapes = _shapes(specs, arrays, dict.fromkeys(free, size))
        total = sum(array_bytes(shape, np.asarray(array).dtype)
                    for shape, array in zip(shapes, arrays, strict=True))
        if total * _INPUT_SHARE <= budget.size:
            return size
    return 1


def _shapes(specs: Sequence[InputSpec], arrays: Sequence[np.ndarray],
            sizes: Mapping[str, int]) -> list[tuple[int, ...]]:
    """Every input's shape with the free dimensions at ``sizes`` (the sample's elsewhere)."""
    shapes = []
    for spec, array in zip(specs, arrays, strict=True):
        shape = list(np.shape(array))
        for axis, dim in enumerate(spec.shape or ()):
            key = _dim_key(spec, axis, None if isinstance(dim, int) else dim)
            if not isinstance(dim, int) and key in sizes and axis < len(shape):
                shape[axis] = sizes[key]
        shapes.append(tuple(shape))
    return shapes


def sweep_inputs(specs: Sequence[InputSpec], arrays: Sequence[np.ndarray],
                 sizes: Mapping[str, int], scale: str, seed: int) -> list[np.ndarray]:
    """One combination's inputs: floats drawn at ``scale``, integers within the sample's range."""
    rng = np.random.default_rng(seed)
    made = []
    for shape, array in zip(_shapes(specs, arrays, sizes), arrays, strict=True):
        array = np.asarray(array)
        if array.dtype.kind in "fc":
            drawn = rng.standard_normal(shape)
            if scale != SCALES[0]:
                drawn = np.abs(drawn) * (-100.0 if scale.endswith("negative") else 100.0)
            made.append(drawn.astype(array.dtype))
        elif array.size == 0:
            made.append(np.zeros(shape, dtype=array.dtype))
        else:  # integers and booleans: within what the sample holds (token ids, masks)
            low, high = int(array.min()), int(array.max())
            made.append(rng.integers(low, high + 1, size=shape).astype(array.dtype))
    return made


def run_sweep(specs: Sequence[InputSpec], arrays: list[np.ndarray], compare: CompareOutputs,
              *, budget: Budget | None = None,
              declared: Mapping[str, tuple[int, int | None]] | None = None,
              ) -> tuple[SweepTable, list[np.ndarray]]:
    """Try the combinations in order until one fails: the table, and the inputs to bisect.

    Those are the first failing combination's, else the sample's own.
    """
    sample_sizes = free_dim_sizes(specs, arrays)
    free = tuple(sample_sizes)
    declared = {name: span for name, span in (declared or {}).items() if name in free}
    notes = []
    if free:
        sizes, note = sweep_sizes(sample_sizes, largest_size(specs, arrays, sample_sizes,
                                                             budget), declared)
        notes.append(note)
    else:
        sizes = [0]
        notes.append("the ONNX graph has no free dimension: only the sample's shape was "
                     "swept, at each scale")
    combinations = [_Combination({}, SAMPLE)] + [
        _Combination(sample_sizes if size == 0 else dict.fromkeys(free, size), scale)
        for size in sizes for scale in SCALES]
    rows: list[SweepRow] = []
    for seed, combination in enumerate(combinations):
        inputs = (arrays if combination.scale == SAMPLE else
                  sweep_inputs(specs, arrays, combination.sizes, combination.scale, seed))
        outcome = compare(inputs)
        rows.append(SweepRow(tuple(np.shape(each) for each in inputs), combination.scale,
                             outcome.max_abs_error, outcome.verdict, outcome.reason))
        if rows[-1].failed:
            return _table(specs, free, rows, notes, bisected=len(rows) - 1), inputs
    return _table(specs, free, rows, notes, bisected=None), arrays


def _table(specs: Sequence[InputSpec], free: tuple[str, ...], rows: list[SweepRow],
           notes: list[str | None], *, bisected: int | None) -> SweepTable:
    said = [note for note in notes if note]
    return SweepTable(input_names=tuple(spec.name for spec in specs), free_dims=free,
                      rows=tuple(rows), bisected=bisected,
                      note="; ".join(said) if said else None)


def outcome_of(records: Sequence[Record]) -> Outcome:
    """One combination's outcome from its final outputs' records."""
    return _outcome([record.figures.max_abs_error for record in records],
                    any(record.failed for record in records))


def _outcome(errors: Sequence[float | None], failed: bool) -> Outcome:
    known = [error for error in errors if error is not None]
    worst = max(known) if known and len(known) == len(errors) else None
    if worst is not None and math.isnan(worst):
        worst = math.inf
    return Outcome(worst, FAILED if failed else PASSED)


def refused(error: Exception) -> Outcome:
    """A combination the runtime under test refused to run: at which node, and why."""
    from bisect_onnx.runtime.onnxruntime.sessions import refusal

    said = refusal("", error)  # ONNX Runtime's words parsed; others' kept as they are
    if said.node is None:
        return Outcome(None, REFUSED, said.reason)
    return Outcome(None, REFUSED, f"at node {said.node!r} ({said.op_type}): {said.reason}")


def skipped(error: Exception) -> Outcome:
    """A combination the reference could not run: not the export's fault."""
    return Outcome(None, SKIPPED, one_line(error))


def bisect_swept(sample: Sample, sweep: Callable[[list[np.ndarray]], tuple[SweepTable,
                                                                         list[np.ndarray]]],
                 run_sample: RunSample, *, repro_dir: str | Path | None) -> Report:
    """The sweep from ``sample``, then its first failing combination (else ``sample``) bisected.

    The report is that combination's, with the sweep's table (``report.sweep``).
    """
    from bisect_onnx.pipeline.samples import compare_samples

    arrays, description = sample
    table, chosen = sweep(arrays)
    failing = table.failing
    if failing is not None:
        description = (f"the sweep's combination {table.bisected + 1}: {failing.scale} at "
                       f"{shapes_text(table.input_names, failing.shapes)}")
    try:
        report = compare_samples([(chosen, description)], run_sample, repro_dir=repro_dir,
                                 kind=None)
    except RuntimeRefused as error:  # the refusal is the answer; the table says what led to it
        raise RuntimeRefused(f"{error}; found by the sweep: {description}", node=error.node,
                             op_type=error.op_type, reason=error.reason, module=error.module,
                             source=error.source, baked=error.baked, sweep=table) from error
    return amended(report, sweep=table)


def swept(settings: Settings, sample: Sample, run_sample: RunSample, *,
          repro_dir: str | Path | None) -> Report:
    """:func:`bisect_swept` against PyTorch: its forward, and production's final outputs."""
    candidate = settings.prepared.candidate
    settings.parking.restore()  # PyTorch runs every combination: its weights in memory
    compare = torch_outputs_compared(settings)
    return bisect_swept(sample, lambda arrays: run_sweep(
        candidate.inputs, arrays, compare, budget=settings.input_budget,
        declared=declared_ranges(settings.reference)), run_sample, repro_dir=repro_dir)


def torch_outputs_compared(settings: Settings) -> CompareOutputs:
    """PyTorch's forward (no hooks) against one production session's final outputs."""
    import torch

    from bisect_onnx.pipeline.torch_comparison import compare_final_outputs
    from bisect_onnx.pytorch.module_side import final_outputs, split_keywords, to_tensor

    model = settings.reference.exportable
    if isinstance(model, torch.export.ExportedProgram):
        model = model.module()
    candidate, keywords = settings.prepared.candidate, settings.prepared.keywords
    session, _ = candidate.probe_session(None)  # production, made once for every run

    def compare(arrays: list[np.ndarray]) -> Outcome:
        args, kwargs = split_keywords([to_tensor(array.copy()) for array in arrays], keywords)
        try:
            with torch.no_grad():
                expected = final_outputs(model(*args, **kwargs), "")
        except Exception as error:  # noqa: BLE001 - the model's own error, said in the row
            if isinstance(error, (BisectOnnxError, MemoryError)):  # ours, or no combination's
                raise
            return skipped(error)
        try:
            produced = session.run(candidate.output_names, {
                spec.name: array for spec, array in zip(candidate.inputs, arrays, strict=True)})
        except Exception as error:  # noqa: BLE001 - the runtime's refusal, said in the row
            return refused(error)
        values = [CapturedValue(name, np.asarray(array), expected[0].provenance)
                  for name, array in zip(candidate.output_names, produced, strict=True)]
        return outcome_of(compare_final_outputs(expected, values, judge=settings.judge,
                                                warnings=[]))

    return compare


def declared_ranges(reference: TorchReference) -> dict[str, tuple[int, int | None]]:
    """The sizes a dynamo program declares for its free dimensions, by their ONNX names.

    Known for an ``ExportedProgram`` (or an ``ONNXProgram``'s): its range constraints,
    whose symbols (``s0``) name the ONNX graph's free dimensions.
    """
    import torch

    program = reference.exportable
    if not isinstance(program, torch.export.ExportedProgram):
        return {}
    ranges = {}
    for symbol, span in getattr(program, "range_constraints", {}).items():
        try:
            high = int(span.upper)
        except (TypeError, ValueError, OverflowError):  # unbounded (int_oo)
            high = None
        try:
            ranges[str(symbol)] = (max(int(span.lower), 1), high)
        except (TypeError, ValueError, OverflowError):
            continue
    return ranges


def onnx_outputs_compared(models: OnnxModels, candidate: Runner,
                          to_candidate: Callable[[list[np.ndarray]], list[np.ndarray]],
                          ) -> CompareOutputs:
    """The reference model's final outputs against one production session's of the candidate.

    Judged as a sample's final outputs are (the models' precision, a rule, a
    quantization step); ``to_candidate`` casts the inputs to the candidate's types.
    """
    from bisect_onnx.align.onnx_pairs import CandidateGroups, ValuePair
    from bisect_onnx.pipeline.onnx_comparison import pair_judge

    judge, _ = pair_judge(models, candidate)
    groups = CandidateGroups(candidate.model, str(candidate.path.resolve().parent))
    session, _ = candidate.probe_session(None)

    def compare(arrays: list[np.ndarray]) -> Outcome:
        try:
            expected = models.reference.run_outputs(arrays)
        except RuntimeRefused as error:  # a size the reference itself does not take
            return skipped(error)
        try:
            produced = session.run(candidate.output_names, dict(zip(
                (spec.name for spec in candidate.inputs), to_candidate(arrays), strict=True)))
        except Exception as error:  # noqa: BLE001 - the runtime's refusal, said in the row
            return refused(error)
        results = []
        for value, name, array in zip(expected, candidate.output_names, produced, strict=False):
            pair = ValuePair(value.name, name, None, "output", groups.quantization(name))
            results.append(judge.compare(value.array, array, pair, judge.tolerance(pair))[0])
        return _outcome([result.max_abs_error for result in results],
                        any(not result.passed for result in results))

    return compare
