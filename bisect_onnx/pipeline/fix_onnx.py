"""The fix stage of an ONNX-against-ONNX run: its context from one sample's values."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["sample_fixes", "candidate_class", "session_settings"]

#: The precision names of judge/tolerances.py, as fix classes (a class names a search).
_CLASSES = {"float16": "float16", "bfloat16": "bfloat16", "int8 (QDQ)": "qdq"}


def candidate_class(reference: Any, candidate: Any) -> str | None:
    """The fix class of a candidate narrower than its float32 reference, else ``None``.

    "float16", "bfloat16" or "qdq": the conversion is what a fix undoes.
    """
    from bisect_onnx.judge.tolerances import precision_of

    if precision_of(reference) != "float32":
        return None
    return _CLASSES.get(precision_of(candidate))


def sample_fixes(report: Any, reference_path: Path, candidate_path: Path,
                 candidate_inputs: Sequence[Any], arrays: Sequence[np.ndarray],
                 values: Any, tolerance: Any, user_paths: Sequence[Any],
                 session: dict[str, Any] | None = None) -> Any:
    """``report`` with the fix searches' checked results for its culprit.

    ``values``: the sample's ``SampleValues`` (the reference's under the candidate's
    names), whose final outputs every fix's ``before`` is made from. ``session``: the
    candidate's ONNX Runtime settings (``provider``, ``opt_level``), where it runs there.
    """
    import onnx

    from bisect_onnx.fixes.stage import with_fixes

    reference, candidate = onnx.load(reference_path), onnx.load(candidate_path)
    outputs = [value.name for value in candidate.graph.output]
    if not all(name in values.reference and name in values.candidate for name in outputs):
        from bisect_onnx.judge.assembly import amended

        return amended(report, fix_notes=("no fix search: the run kept no final outputs",))
    user = [Path(path) for path in user_paths if isinstance(path, (str, Path))]
    return with_fixes(
        report, precision=candidate_class(reference, candidate), reference=reference,
        candidate=candidate, reference_path=user[0] if user else None,
        candidate_path=user[1] if len(user) > 1 else None,
        inputs={spec.name: array for spec, array in zip(candidate_inputs, arrays, strict=True)},
        reference_outputs=[values.reference[name] for name in outputs],
        candidate_outputs=[values.candidate[name] for name in outputs], tolerance=tolerance,
        **session_settings(session))


def session_settings(session: dict[str, Any] | None) -> dict[str, Any]:
    """The fix context's ``opt_level`` and ``session_keywords`` from a side's settings."""
    if not session:
        return {}
    return {"opt_level": session.get("opt_level"), "session_keywords": dict(session)}
