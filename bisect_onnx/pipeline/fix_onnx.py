"""The fix stage of an ONNX-against-ONNX run: its context from one sample's values."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

    from bisect_onnx.fixes.stage import FixesFound
    from bisect_onnx.pipeline.onnx_sample import OnnxSample

__all__ = ["onnx_sample_fixes", "candidate_class", "session_settings"]

#: The precision names of judge/tolerances.py, as fix classes (a class names a search).
_CLASSES = {"float16": "float16", "bfloat16": "bfloat16", "int8 (QDQ)": "qdq"}


def candidate_class(reference: onnx.ModelProto, candidate: onnx.ModelProto) -> str | None:
    """The fix class of a candidate narrower than its float32 reference, else ``None``.

    "float16", "bfloat16" or "qdq": the conversion is what a fix undoes.
    """
    from bisect_onnx.judge.tolerances import precision_of

    if precision_of(reference) != "float32":
        return None
    return _CLASSES.get(precision_of(candidate))


def onnx_sample_fixes(sample: OnnxSample) -> FixesFound:
    """The fix searches' checked results for the culprit the sample's findings name.

    The sample's values (the reference's under the candidate's names) give the final
    outputs every fix's ``before`` is made from; the candidate's ONNX Runtime settings
    (``provider``, ``opt_level``), where it runs there, are the fixes' too.
    """
    import onnx

    from bisect_onnx.fixes.stage import FixesFound, search_fixes
    from bisect_onnx.judge.reading import Reading

    values, candidate_runner = sample.values, sample.candidate
    reference_path, candidate_path = sample.models.reference.path, candidate_runner.path
    user_paths, tolerance = sample.models.user_paths, sample.paired.judge.base
    session = candidate_runner.optimizer_settings()

    reference, candidate = onnx.load(reference_path), onnx.load(candidate_path)
    outputs = [value.name for value in candidate.graph.output]
    if not all(name in values.reference and name in values.candidate for name in outputs):
        return FixesFound(notes=("no fix search: the run kept no final outputs",))
    user = [Path(path) for path in user_paths if isinstance(path, (str, Path))]
    return search_fixes(
        Reading(sample.findings), precision=candidate_class(reference, candidate),
        reference=reference, candidate=candidate, reference_path=user[0] if user else None,
        candidate_path=user[1] if len(user) > 1 else None,
        inputs={spec.name: array for spec, array in zip(candidate_runner.inputs,
                                                        sample.candidate_arrays, strict=True)},
        reference_outputs=[values.reference[name] for name in outputs],
        candidate_outputs=[values.candidate[name] for name in outputs], tolerance=tolerance,
        **session_settings(session))


def session_settings(session: dict[str, Any] | None) -> dict[str, Any]:
    """The fix context's ``opt_level`` and ``session_keywords`` from a side's settings."""
    if not session:
        return {}
    return {"opt_level": session.get("opt_level"), "session_keywords": dict(session)}
