"""The sample loop both comparison modes share: inputs in, the worst sample's report out."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.errors import InputError, issue_warnings
from bisect_onnx.judge.assembly import amended
from bisect_onnx.judge.records import Report
from bisect_onnx.pipeline.options import RandomInputs
from bisect_onnx.report.repro import attach_repro, check_repro_dir
from bisect_onnx.runtime.input_specs import InputSpec
from bisect_onnx.sources.input_samples import Samples
from bisect_onnx.sources.input_sizes import Budget
from bisect_onnx.sources.random_inputs import synthesize_inputs, vocabulary_limits

if TYPE_CHECKING:
    import onnx

__all__ = ["Sample", "GivenArrays", "as_arrays", "given_input_sets", "random_samples",
           "check_repro_folders", "compare_samples", "worst_report"]

Sample = tuple[list[np.ndarray], str]
"""One sample's arrays in the graph's input order, and how the report describes them."""

GivenArrays = list[np.ndarray] | dict[str, np.ndarray]
"""One set of the user's inputs as arrays: in ``forward``'s order, or by name."""

RunSample = Callable[[list[np.ndarray], str], tuple[Report, Callable[..., dict[str, Any]]]]
"""One sample's comparison: its report, and how to write its repro into a folder."""


RANDOM_SAMPLES = "random samples"
INPUT_SETS = "input sets"


def samples_kind(inputs: object) -> str | None:
    """What the run's samples are: random draws, the user's input sets, or one given set."""
    if inputs is None:
        return RANDOM_SAMPLES
    return INPUT_SETS if isinstance(inputs, Samples) else None


def check_repro_folders(repro_dir: str | Path | None, inputs: object, *, sweep: bool) -> None:
    """Before a run: the folders the samples' repros will go in hold none of the user's files.

    Each random draw or input set writes ``<repro_dir>/sample-<k>``; one given set, or
    a sweep's one bisected combination, ``repro_dir`` itself (:func:`compare_samples`).
    """
    check_repro_dir(repro_dir, per_sample=samples_kind(inputs) is not None and not sweep)


def compare_samples(samples: Iterable[Sample], run_sample: RunSample, *,
                    repro_dir: str | Path | None, kind: str | None) -> Report:
    """Compare every sample; attach each diverging one's repro; the worst one's report.

    ``kind``: :data:`RANDOM_SAMPLES` or :data:`INPUT_SETS`, each repro then in its own
    ``sample-<k>``; ``None`` for one given set of inputs.
    """
    reports = []
    for number, (arrays, description) in enumerate(samples, start=1):
        report, write_repro = run_sample(arrays, description)
        reports.append(attach_repro(report, repro_dir, sample=number if kind else None,
                                    write=write_repro))
    worst = worst_report(reports, kind or INPUT_SETS)
    issue_warnings(worst.warnings)  # notebooks and pytest show them where bisect was called
    return worst


def given_input_sets(inputs: object) -> list[tuple[GivenArrays, str]] | None:
    """The user's inputs as input sets, each with how the report describes it."""
    if inputs is None:
        return None
    if isinstance(inputs, Samples):
        return [(as_arrays(one), description) for one, description in inputs.described()]
    return [(as_arrays(inputs), "given")]


def random_samples(inputs: Sequence[InputSpec], model: onnx.ModelProto, random: RandomInputs, *,
                   budget: Budget | None = None) -> Iterator[Sample]:
    """Inputs drawn from the graph's input specification, one per sample.

    Each sample's size (from ``--dim``) is checked against ``budget`` before it is made.
    """
    limits = vocabulary_limits(model)
    for sample in range(random.samples):
        arrays = synthesize_inputs(inputs, seed=random.seed, dims=random.dims, sample=sample,
                                   int_high=limits, budget=budget)
        yield arrays, f"random (seed {random.seed}, sample {sample + 1} of {random.samples})"


def worst_report(reports: Sequence[Report], kind: str) -> Report:
    """The report of the worst sample: a divergence first, then the largest output error."""
    def severity(report: Report) -> tuple[bool, float]:
        needed = [record.figures.min_passing_atol for record in report.final_outputs
                  if record.failed]
        return report.diverged, max((math.inf if n is None else n for n in needed),
                                    default=0.0)

    worst = max(reports, key=severity)
    if len(reports) > 1:
        diverged = sum(report.diverged for report in reports)
        summary = (f"worst of {len(reports)} {kind} ({diverged} diverged): "
                   f"{worst.reference['inputs']}")
        return amended(worst, samples_note=summary)
    return worst


def as_arrays(inputs: object) -> GivenArrays:
    """Accept arrays, tensors, sequences and mappings of them; always numpy out."""
    if isinstance(inputs, Mapping):
        return {str(key): _to_array(value) for key, value in inputs.items()}
    if isinstance(inputs, (list, tuple)):
        return [_to_array(value) for value in inputs]
    return [_to_array(inputs)]


def _to_array(value: object) -> np.ndarray:
    # A torch.Tensor, recognised without importing torch.
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        return value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.dtype.kind not in "biufc":
        raise InputError(f"an input of type {type(value).__name__} is not numeric data "
                         f"(numpy makes it dtype {array.dtype}); pass arrays or tensors")
    # Big-endian data (saved on another machine) is fine for numpy, not for torch or ORT.
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))
