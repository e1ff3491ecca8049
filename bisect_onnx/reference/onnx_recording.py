"""Record a reference ONNX file's values: ``bisect-onnx REF.onnx --against CAND.onnx --record A``.

ONNX against ONNX runs as :func:`bisect_onnx.bisect_onnx_models` runs it, and the
reference file's value at every candidate value the comparison paired (its rows, the
values production's probes and the local checks were judged by, those inside kernels
the candidate's runtime fused, the final outputs) is written under the candidate's
value name: a check (``bisect-onnx check ARCHIVE --onnx CAND.onnx``) then pairs each
candidate value with its recorded reference by name, where the reference is not run.
Where the reference and the candidate are one file (run two ways), every value of the
reference is written, as the in-process run feeds them all to its local reruns.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.align.quantization import Conversion
from bisect_onnx.errors import UsageError
from bisect_onnx.reference.graph_digest import graph_digest
from bisect_onnx.reference.manifest import ONNX
from bisect_onnx.reference.writing import (
    ONE_SAMPLE,
    Kept,
    check_one_recorded_sample,
    embedded_onnx,
    write_reference,
)

if TYPE_CHECKING:
    from bisect_onnx.judge.records import Report
    from bisect_onnx.pipeline.onnx_sample import OnnxSample

__all__ = ["record_onnx_with_report", "is_onnx_model"]

#: Pairs whose candidate value is converted before it is compared (a QuantizeLinear's
#: integers dequantized, a float put through its QDQ pair): a check pairs by name, so
#: the manifest says how each was converted (``converted``).
_CONVERTED_HERE = frozenset({"dequantized", "requantized"})

CANDIDATE_TOO_LARGE = ("the candidate is over 2 GiB and cannot be kept inside the reference; "
                       "save it to a file and record and check with it")


def is_onnx_model(model: object) -> bool:
    """Whether ``model`` is an ONNX model (a ``ModelProto``, or a path to an ONNX file)."""
    from bisect_onnx.sources.file_kinds import looks_like_onnx

    if isinstance(model, (str, Path)):
        path = Path(model)
        if not path.is_file():
            return False
        with path.open("rb") as stream:
            return looks_like_onnx(stream.read(16))
    import onnx

    return isinstance(model, onnx.ModelProto)


def record_onnx_with_report(reference: object, candidate: object = None,
                            inputs: object = None, *, path: str | Path,
                            command: str | None = None,
                            **options: Any) -> tuple[Report, Path]:
    """Compare two ONNX models as :func:`bisect_onnx.bisect_onnx_models` does; write the archive.

    ``options``: :func:`bisect_onnx.bisect_onnx_models`'s keyword arguments. Returns the
    comparison's report and ``path``.
    """
    from bisect_onnx.pipeline.onnx_vs_onnx import compare_onnx_models
    from bisect_onnx.pipeline.options import Tolerance
    from bisect_onnx.sources.output_paths import check_run_files

    path = Path(path)
    given = Tolerance.of(options.get("tolerance"))
    check_one_recorded_sample(inputs)
    check_run_files({"path": path}, onnx_models={"reference": reference,
                                                 "candidate": candidate})
    with tempfile.TemporaryDirectory(prefix="bisect-onnx-record-") as folder:
        keeper = _Keeper(Path(folder), reference, candidate)
        report = compare_onnx_models(reference, candidate, inputs, keep_sample=keeper,
                                     **options)
        if keeper.kept is None:  # no sample ran: nothing to record
            raise UsageError("no input set was compared, so there is nothing to record")
        write_reference(path, report, keeper.kept, command, given)
    return report, path


class _Keeper:
    """Keeps what the archive needs of the one sample (``compare_onnx_models``'s hook)."""

    def __init__(self, folder: Path, reference: object, candidate: object) -> None:
        self.folder = folder
        self.given = candidate if candidate is not None else reference
        self.kept: Kept | None = None

    def __call__(self, sample: OnnxSample) -> None:
        if self.kept is not None:  # refused before: one input set
            raise UsageError(ONE_SAMPLE.format(what="several"))
        self.kept = self._keep(sample)

    def _keep(self, sample: OnnxSample) -> Kept:
        candidate, reference = sample.candidate, sample.models.reference
        kept = Kept(inputs=[(spec.name, array) for spec, array
                            in zip(candidate.inputs, sample.candidate_arrays, strict=True)],
                    reference_kind=ONNX, counterparts=tuple(
                        node.name for node in reference.model.graph.node if node.name))
        # In the order the run compared them (the reference graph's): a check keeps it.
        kept.values, kept.converted = _reference_values(sample)
        kept.outputs = [pair.candidate for pair in sample.paired.outputs]
        kept.digest = graph_digest(candidate.model, candidate.path.resolve().parent)
        if isinstance(self.given, (str, Path)):
            kept.onnx = {"path": str(Path(self.given).resolve())}
        else:  # a ModelProto: its file lives only as long as the run
            kept.onnx = {"member": "model.onnx"}
            kept.embedded = embedded_onnx(candidate.path, self.folder, CANDIDATE_TOO_LARGE)
        return kept


def _reference_values(sample: OnnxSample) -> tuple[dict[str, np.ndarray],
                                                     dict[str, Conversion]]:
    """The reference's value at each candidate value it was paired with, by candidate name.

    With how each value compared only once converted (``_CONVERTED_HERE``) was
    converted: a check pairs by name, and converts it as the run did.
    """
    capture, candidate = sample.reference_capture, sample.candidate
    producers = sample.paired.groups.producers
    by_name = {**{value.name: value.array for value in capture.outputs},
               **{name: value.array for name, value in capture.values.items()}}
    values: dict[str, np.ndarray] = {}
    converted: dict[str, Conversion] = {}
    if sample.models.reference.path == candidate.path:  # one file: every value pairs
        named = {output for node in candidate.nodes for output in node.outputs}
        values.update((name, array) for name, array in by_name.items() if name in named)
    for pair in (*sample.pairs, *sample.paired.uncaptured(capture)):
        array = by_name.get(pair.reference)
        if array is None or pair.candidate in values:
            continue
        values[pair.candidate] = array
        if pair.how in _CONVERTED_HERE:
            # Dequantized by the DequantizeLinear it pairs as, where it was that one's
            # integers the run dequantized; otherwise by its own pair.
            dequantize = producers.get(pair.reference)
            by_reference = (dequantize is not None and dequantize.op_type == "DequantizeLinear"
                            and dequantize.input[0] == pair.candidate)
            converted[pair.candidate] = Conversion(
                pair.how, pair.reference if by_reference else pair.candidate)
    return values, converted
