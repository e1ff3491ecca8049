"""Check a runtime against a recorded reference: ``bisect-onnx check REF``.

Where the runtime runs and PyTorch does not, a reference recorded where it does
(:mod:`bisect_onnx.reference`) stands for PyTorch. The comparison is ONNX against
ONNX's (:data:`~bisect_onnx.pipeline.onnx_sample.ONNX_STAGES`: the capture under
production's kernels, production probed, local reruns fed the reference's values,
the culprit, the ONNX fix searches) with the recorded values as its reference
(:class:`~bisect_onnx.runtime.recorded.runner.RecordedRunner`), and its rows shown
as the recording showed them (:mod:`bisect_onnx.pipeline.recorded_rows`).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.errors import InputError, UsageError
from bisect_onnx.events import BISECTION_STARTED, emit
from bisect_onnx.pipeline.check_stages import CHECK_STAGES, CheckModels
from bisect_onnx.pipeline.onnx_sample import OnnxSample
from bisect_onnx.pipeline.options import (
    FixOptions,
    OutputOptions,
    RuntimeOptions,
    SearchOptions,
    Tolerance,
)
from bisect_onnx.pipeline.repro import write_sample_repro
from bisect_onnx.pipeline.samples import as_arrays, compare_samples
from bisect_onnx.pipeline.stages import run_stages
from bisect_onnx.reference.archive import MODEL
from bisect_onnx.reference.graph_digest import GraphDigest, difference, graph_digest
from bisect_onnx.reference.loaded import Reference
from bisect_onnx.reference.manifest import PYTORCH, Manifest
from bisect_onnx.report.repro import check_repro_dir
from bisect_onnx.runtime.heap import give_back, kept_in_heap
from bisect_onnx.runtime.recorded.runner import RecordedRunner
from bisect_onnx.runtime.runner import Runner
from bisect_onnx.search.modes import over_budget
from bisect_onnx.sources.arrangement import arrange_inputs
from bisect_onnx.sources.file_kinds import check_onnx_file
from bisect_onnx.sources.graph_inputs import check_against_onnx
from bisect_onnx.sources.output_paths import check_run_files

if TYPE_CHECKING:
    from bisect_onnx.judge.records import Report
    from bisect_onnx.judge.tolerances import Judge, ToleranceRule
    from bisect_onnx.runtime.sides import SampleArrays

__all__ = ["check", "reference_onnx_path", "check_models", "digest_while_planning",
           "recorded_inputs"]

OTHER_FILE = ("{onnx} is not the graph the reference was recorded on: {why}; check the file "
              "it was recorded on, or --allow-other-file to compare values by name")
OTHER_FILE_WARNING = ("{onnx} is not the graph the reference was recorded on ({why}): "
                      "values compared by name, {matched} of {recorded} recorded values "
                      "named in it")
NO_ONNX = ("the reference names no ONNX file that is here ({where}); pass the file it was "
           "recorded on with --onnx FILE")


def check(reference: str | Path | Reference, onnx_model: str | Path | None = None,
          inputs: object = None, *, runtime: RuntimeOptions | None = None,
          tolerance: Tolerance | tuple[float, float] | None = None,
          search: SearchOptions | None = None, output: OutputOptions | None = None,
          suggest_fix: bool | FixOptions | None = None,
          allow_other_file: bool = False) -> Report:
    """Check the runtime against a reference recorded where PyTorch runs.

    Args:
        reference: The archive ``bisect-onnx MODEL ... --record REF`` (or
            :func:`bisect_onnx.record`) wrote, or a :class:`~bisect_onnx.Reference`.
        onnx_model: The ONNX file to run; by default the one the reference holds, or
            the path it was recorded with. Its graph must be the recorded one.
        inputs: The recorded inputs, to confirm them (others are refused); ``None``:
            the recorded inputs.
        runtime: The runtime, provider, level and promotion, as for
            :func:`bisect_onnx.bisect`; ``max_memory`` bounds what the archive's
            arrays may take.
        tolerance: ``None``: the recorded tolerance.
        search: ``all_culprits``, as for :func:`bisect_onnx.bisect_onnx_models`; the
            granularity is the recording's.
        output: The repro folder and label, as for :func:`bisect_onnx.bisect`.
        suggest_fix: The ONNX fix searches (optimizer, float16, QDQ); those that need
            PyTorch are named as not run.
        allow_other_file: Compare with an ONNX file whose graph is not the recorded
            one, value by value name (a warning says how many matched).

    Returns:
        The :class:`~bisect_onnx.Report`, its rows as the recording showed them.
    """
    runtime, search = runtime or RuntimeOptions(), search or SearchOptions()
    output, fixes = output or OutputOptions(), FixOptions.of(suggest_fix)
    if search.granularity is not None:
        raise UsageError("granularity is the recording's; drop it from search")
    if search.sweep:
        raise UsageError("a sweep runs the PyTorch model at other inputs, and a recorded "
                         "reference holds only its own: drop sweep, or sweep where PyTorch runs")
    loaded = (reference if isinstance(reference, Reference)
              else Reference.load(reference, max_memory=runtime.max_memory))
    # Without onnx_model, the file it was recorded on is read: nothing written over it.
    read = onnx_model if onnx_model is not None else loaded.recorded_onnx
    check_run_files({"output.repro_dir": output.repro_dir},
                    onnx_models={"onnx_model" if onnx_model is not None
                                 else "the recorded ONNX file": read},
                    folders={"output.repro_dir"})
    check_repro_dir(output.repro_dir, per_sample=False)
    from bisect_onnx.fixes.stage import check_write_fixed, write_fixed

    check_write_fixed(fixes.write_fixed, (loaded.path, read))
    emit(BISECTION_STARTED, output.label or str(loaded.path))
    with tempfile.TemporaryDirectory(prefix="bisect-onnx-check-") as workdir:
        path = reference_onnx_path(loaded, onnx_model, Path(workdir))
        candidate = runtime.runner(path)
        try:
            with kept_in_heap(candidate.holds_weights_once):
                digest = digest_while_planning(candidate, loaded, runtime.budget())
                models = replace(check_models(loaded, candidate, Tolerance.of(tolerance),
                                              search, fixes, allow_other_file, onnx_model,
                                              digest=digest),
                                 recorded=loaded, budget=runtime.budget())
                arrays = recorded_inputs(loaded, candidate, inputs)
                report = compare_samples(
                    [(arrays, "recorded")], partial(_run_sample, models, candidate),
                    repro_dir=output.repro_dir, kind=None)
            return write_fixed(report, fixes.write_fixed, (loaded.path, read))
        finally:
            candidate.release()
            give_back()


def reference_onnx_path(loaded: Reference, onnx_model: str | Path | None, folder: Path) -> Path:
    """The ONNX file to run: given, kept inside the archive, or where it was recorded."""
    if onnx_model is not None:
        check_onnx_file(Path(onnx_model), "--onnx")
        return Path(onnx_model)
    embedded = loaded.model_bytes()
    if embedded is not None:
        path = folder / MODEL
        path.write_bytes(embedded)
        return path
    if loaded.recorded_onnx is None:
        raise UsageError(NO_ONNX.format(where=loaded.manifest.onnx.get("path")
                                        or "none recorded"))
    return loaded.recorded_onnx


def digest_while_planning(candidate: Runner, loaded: Reference,
                          budget: int | None) -> GraphDigest:
    """The candidate graph's digest, hashed while the runtime plans and makes its capture.

    Hashing every weight (a quarter of a second for BERT-base's 440 MB) and making
    ONNX Runtime's sessions (the planning session on production's optimized graph, then
    the capture's) both let go of Python's lock: side by side, the check pays for the
    longer one only. Only where the sample will be captured (within the memory
    ``budget``) and the runtime's planning leaves a core free (a compiling runtime's
    takes every core). A planning that fails is not reported here: the capture plans
    again in its place, after the graph and the inputs were checked, and says why then.
    A graph found not to be the recorded one is refused then, before any run.
    """
    folder = candidate.path.resolve().parent
    if not candidate.prepares_on_one_core or over_budget(candidate, loaded.inputs(), budget):
        return graph_digest(candidate.model, folder)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bisect-onnx-digest") as pool:
        digest = pool.submit(graph_digest, candidate.model, folder)
        with contextlib.suppress(Exception):  # the capture plans again, and says why
            candidate.prepare_sessions()
        return digest.result()


def check_models(loaded: Reference, candidate: Runner, tolerance: Tolerance,
            search: SearchOptions, fixes: FixOptions, allow_other_file: bool,
            onnx_model: str | Path | None, *, digest: GraphDigest | None = None,
            ) -> CheckModels:
    """The recorded reference beside the candidate, its graph checked to be the recorded one.

    ``digest``: the candidate graph's, where it was hashed already.
    """
    manifest = loaded.manifest
    if digest is None:
        digest = graph_digest(candidate.model, candidate.path.resolve().parent)
    why = difference(manifest.graph, digest)
    shown = onnx_model or (f"the recorded ONNX file {manifest.onnx.get('path')}"
                           if manifest.onnx.get("member") is None
                           else "the ONNX file the archive holds")
    other = None
    if why is not None:
        if not allow_other_file:
            raise InputError(OTHER_FILE.format(onnx=shown, why=why))
        named = {output for node in candidate.nodes for output in node.outputs}
        matched = sum(name in named for name in loaded.value_names)
        if not matched:
            raise InputError(f"{shown} names none of the {len(loaded.value_names)} recorded "
                             f"values ({why}); check the file the reference was recorded on")
        other = OTHER_FILE_WARNING.format(onnx=shown, why=why, matched=matched,
                                          recorded=len(loaded.value_names))
    recorded = RecordedRunner(
        candidate, values=(loaded.values if other is None or not manifest.converted
                           else _by_name_only(loaded)),
        outputs=[row.onnx_value for row in manifest.final_outputs],
        inputs=loaded.inputs(), description={
            "kind": "recorded reference", "reference": str(loaded.path),
            "recorded": dict(manifest.recorded.get("reference", {}))})
    if manifest.reference_kind == PYTORCH:
        (rtol, atol), basis = _tolerance(manifest, tolerance, candidate)
        rules = [*tolerance.per_value(), *_recorded_rules(manifest, loaded.path)]
    else:  # as ONNX against ONNX judges: the file's precision, each QDQ value's scale
        rtol = tolerance.rtol if tolerance.rtol is not None else manifest.given_rtol
        atol = tolerance.atol if tolerance.atol is not None else manifest.given_atol
        basis, rules = None, tolerance.per_value()
    return CheckModels(
        recorded, labels=(str(loaded.path), str(onnx_model or candidate.path.name)),
        rtol=rtol, atol=atol, rules=rules,
        all_culprits=search.all_culprits, fixes=fixes,
        user_paths=(onnx_model, onnx_model), manifest=manifest, other_file=other,
        converted=manifest.converted if other is None else {},
        tolerance_basis=basis, op_segments={} if other is not None else {
            name: [candidate.nodes[index] for index in nodes]
            for name, nodes in manifest.op_segments.items()})


def _by_name_only(loaded: Reference) -> Callable[[Collection[str] | None], dict[str, np.ndarray]]:
    """The recorded values, less those compared only once converted.

    A file other than the recorded one has its own Q/DQ pairs: how a value was
    converted there says nothing here, and compared unconverted by name (a float
    against int8) it would fail for no fault of the file.
    """
    converted = set(loaded.manifest.converted)

    def values(names: Collection[str] | None = None) -> dict[str, np.ndarray]:
        wanted = loaded.value_names if names is None else names
        return loaded.values([name for name in wanted if name not in converted])

    return values


def _tolerance(manifest: Manifest, tolerance: Tolerance, candidate: Runner,
               ) -> tuple[tuple[float, float], str | None]:
    """The check's base tolerance, and why it is not float32's where it is not.

    Given here, else given at the recording, else (as against PyTorch) the default of
    the precision the candidate computes in: a check in OpenVINO's bf16 is judged as a
    comparison with PyTorch in bf16 would be.
    """
    from bisect_onnx.judge.tolerances import PRECISION_DEFAULTS
    from bisect_onnx.pipeline.torch_settings import computed_precision

    rtol = tolerance.rtol if tolerance.rtol is not None else manifest.given_rtol
    atol = tolerance.atol if tolerance.atol is not None else manifest.given_atol
    if rtol is not None and atol is not None:
        return (rtol, atol), None
    precision, basis = computed_precision(candidate)
    default = PRECISION_DEFAULTS[precision]
    return (default.rtol if rtol is None else rtol, default.atol if atol is None else atol), basis


def _recorded_rules(manifest: Manifest, path: Path) -> list[ToleranceRule]:
    """Each value the recording judged by a tolerance of its own, judged so again."""
    from bisect_onnx.judge.tolerances import Tolerance as ValueTolerance
    from bisect_onnx.judge.tolerances import ToleranceRule

    rules = {}
    for row in (*manifest.rows, *manifest.final_outputs):
        if row.rtol is not None and row.atol is not None and row.onnx_value not in rules:
            pattern = "".join(f"[{char}]" if char in "*?[]" else char for char in row.onnx_value)
            rules[row.onnx_value] = ToleranceRule(pattern, ValueTolerance(row.rtol, row.atol),
                                                  f"{path}:{row.onnx_value}")
    return list(rules.values())


def recorded_inputs(loaded: Reference, candidate: Runner, inputs: object,
                     ) -> list[np.ndarray]:
    """The recorded inputs; those given must be the same (the runner checks them)."""
    recorded = loaded.inputs()
    try:
        check_against_onnx(recorded, candidate.inputs)
    except InputError as error:  # a file of another model, let through by name
        raise InputError(f"the recorded inputs do not fit {candidate.path}: {error}; check "
                         "the file the reference was recorded on") from None
    if inputs is None:
        return recorded
    arrays = arrange_inputs(as_arrays(inputs),
                            forward_names=[spec.name for spec in candidate.inputs])
    check_against_onnx(arrays, candidate.inputs)
    RecordedRunner.check_given(candidate.inputs, arrays, recorded)
    return arrays


def _run_sample(models: CheckModels, candidate: Runner, arrays: list[np.ndarray],
                description: str):
    """The one sample through :data:`CHECK_STAGES`: its report, and its repro writer."""
    sample = run_stages(CHECK_STAGES, OnnxSample(models, candidate, arrays, arrays,
                                                 description))
    label = ("PyTorch (recorded)" if models.manifest.reference_kind == PYTORCH
             else "the reference model (recorded)")
    return sample.report, partial(_write_repro, report=sample.report,
                                  candidate=sample.candidate, values=sample.values,
                                  judge=sample.paired.judge, label=label)


def _write_repro(folder: Path, report: Report, candidate: Runner, values: SampleArrays,
                 judge: Judge, label: str) -> dict[str, Any]:
    """The first culprit's repro, the recorded values as the expected."""
    record = report.culprit or report.first_divergence
    if record.onnx_value not in values.candidate:
        record = report.first_divergence
    return write_sample_repro(folder, report=report, candidate=candidate,
                              failing_value=record.onnx_value, values=values,
                              tolerance=judge.of(record),
                              reference_label=label)
