"""Writing a reference archive: what a recording kept, with its manifest.

Shared by the two recordings, PyTorch's (:mod:`bisect_onnx.reference.recording`) and a
reference ONNX file's (:mod:`bisect_onnx.reference.onnx_recording`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.errors import UsageError
from bisect_onnx.reference.archive import MODEL, write_archive
from bisect_onnx.reference.manifest import ArrayEntry, Manifest, RowProvenance

if TYPE_CHECKING:
    from bisect_onnx.align.quantization import Conversion
    from bisect_onnx.judge.records import Report
    from bisect_onnx.pipeline.options import Tolerance

__all__ = ["Kept", "write_reference", "embedded_onnx", "check_one_recorded_sample", "ONE_SAMPLE",
           "EXPORT_TOO_LARGE"]

ONE_SAMPLE = ("a reference records one input set; give one (not {what}), and record "
              "another reference for each other input set")
#: The largest ONNX file kept inside the archive (protobuf's own limit).
_EMBEDDED_LIMIT = 2 ** 31 - 1
EXPORT_TOO_LARGE = ("the export is over 2 GiB and cannot be kept inside the reference; save it "
                    "(--save-onnx FILE), record with --onnx FILE and check with --onnx FILE")


@dataclass
class Kept:
    """What the recording keeps of its sample: arrays by name, and how each came."""

    inputs: list[tuple[str, np.ndarray]] = field(default_factory=list)
    values: dict[str, np.ndarray] = field(default_factory=dict)
    inner: dict[str, RowProvenance] = field(default_factory=dict)
    """Values that are no row: what PyTorch says of them."""
    outputs: list[str] = field(default_factory=list)
    op_segments: dict[str, tuple[int, ...]] = field(default_factory=dict)
    digest: Any = None
    onnx: dict[str, Any] = field(default_factory=dict)
    embedded: Path | None = None
    reference_kind: str = "pytorch"
    counterparts: tuple[str, ...] | None = None
    """The reference graph's node names, where the reference is an ONNX file."""
    converted: dict[str, Conversion] = field(default_factory=dict)
    """Values compared only once converted (a QDQ candidate's), by candidate name."""


def write_reference(path: Path, report: Report, kept: Kept, command: str | None,
                    given: Tolerance) -> None:
    """The archive of what ``kept`` holds, described as ``report`` shows it."""
    manifest = replace(_manifest(report, kept, command), given_rtol=given.rtol,
                       given_atol=given.atol)
    write_archive(path, manifest.to_json(), _arrays(manifest, kept), model=kept.embedded)


def check_one_recorded_sample(inputs: object) -> None:
    """Refuse several input sets: a reference holds the values of one."""
    from bisect_onnx.pipeline.options import RandomInputs
    from bisect_onnx.sources.input_samples import Samples

    if isinstance(inputs, Samples) and len(inputs.inputs) > 1:
        raise UsageError(ONE_SAMPLE.format(what=f"{len(inputs.inputs)} input sets"))
    if isinstance(inputs, RandomInputs) and inputs.samples > 1:
        raise UsageError(ONE_SAMPLE.format(what=f"{inputs.samples} random samples"))


def embedded_onnx(path: Path, folder: Path, too_large: str = EXPORT_TOO_LARGE) -> Path:
    """The ONNX file at ``path``, its weights inside, in ``folder``, to keep in the archive."""
    import onnx

    model = onnx.load(str(path))
    if model.ByteSize() > _EMBEDDED_LIMIT:
        raise UsageError(too_large)
    target = folder / MODEL
    onnx.save(model, str(target))
    return target


def _manifest(report: Report, kept: Kept, command: str | None) -> Manifest:
    """The manifest of what ``kept`` holds, with the report's rows and description."""
    from dataclasses import asdict

    values = [ArrayEntry(name, f"values/{index}.npy", str(array.dtype), array.shape)
              for index, (name, array) in enumerate(kept.values.items())]
    inputs = [ArrayEntry(name, f"inputs/{index}.npy", str(array.dtype), array.shape)
              for index, (name, array) in enumerate(kept.inputs)]
    shown = (report.culprit or report.first_divergence)
    coverage = asdict(report.coverage)
    coverage["granularity"] = str(report.coverage.granularity)
    return Manifest(
        graph=kept.digest, inputs=tuple(inputs), values=tuple(values),
        rows=tuple(RowProvenance.of(row) for row in report.comparisons),
        final_outputs=tuple(RowProvenance.of(row) for row in report.final_outputs),
        provenance={name: row for name, row in kept.inner.items()
                    if name not in {row.onnx_value for row in report.comparisons}},
        rtol=report.rtol, atol=report.atol, tolerance_basis=report.tolerance_basis,
        coverage=coverage, environment=_json_safe(report.environment),
        recorded=_json_safe({"reference": report.reference, "candidate": report.candidate,
                             "verdict": str(report.verdict),
                             "culprit": None if shown is None else {
                                 "onnx_value": shown.onnx_value,
                                 "onnx_node": shown.onnx_node}}),
        onnx=kept.onnx, command=command, op_segments=kept.op_segments,
        reference_kind=kept.reference_kind, counterparts=kept.counterparts,
        converted=kept.converted)


def _arrays(manifest: Manifest, kept: Kept) -> Iterator[tuple[str, np.ndarray]]:
    """Each member and its array, in the manifest's order (inputs, then values)."""
    inputs = dict(kept.inputs)
    for entry in manifest.inputs:
        yield entry.member, inputs[entry.name]
    for entry in manifest.values:
        yield entry.member, kept.values[entry.name]


def _json_safe(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with what JSON cannot hold as text (a non-finite float as ``None``)."""
    import json
    import math

    def safe(item: Any) -> Any:
        if isinstance(item, float) and not math.isfinite(item):
            return None
        if isinstance(item, Mapping):
            return {str(key): safe(value) for key, value in item.items()}
        if isinstance(item, (list, tuple)):
            return [safe(value) for value in item]
        return item if isinstance(item, (str, int, float, bool, type(None))) else str(item)

    return json.loads(json.dumps(safe(dict(data))))
