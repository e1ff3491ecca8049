"""A record's figures, in three small parts: its comparison, its local check, its match.

A :class:`~bisect_onnx.judge.records.Record` holds where a value came from on both
sides, and these: what comparing it found (:class:`ComparisonFigures`), what its own
node(s) did when fed the reference's exact inputs (:class:`LocalOutcome`), and how
its two sides were matched (:class:`MatchInfo`). The JSON report writes a record flat,
each part's fields under their own names (docs/json-schema.md, ``record``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from bisect_onnx.judge.vocabulary import Status
from bisect_onnx.runtime.sides import JsonObject

__all__ = ["ComparisonFigures", "LocalOutcome", "MatchInfo"]


@dataclass(frozen=True)
class ComparisonFigures:
    """What comparing the value found, and the tolerance it was judged by."""

    max_abs_error: float | None
    max_rel_error: float | None
    mismatch_fraction: float | None
    min_passing_atol: float | None
    nan_mismatch: int
    status: str
    sqnr_db: float | None = None
    """ONNX against ONNX, for a quantized or narrower-precision candidate value: the
    signal-to-quantization-noise ratio, ``10 log10(sum(ref^2) / sum((ref - cand)^2))``."""
    rtol: float | None = None
    atol: float | None = None
    """The tolerance this value was judged by, when it is not the report's (a per-value
    rule from a tolerance file, a quantized value's scale)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ComparisonFigures:
        """The figures among a JSON record's keys (a non-finite one ``null``: ``None``)."""
        return cls(**{**_own(cls, data), "status": Status(data["status"])})


@dataclass(frozen=True)
class LocalOutcome:
    """A failing value's local check: its node(s) fed the reference's exact inputs.

    All ``None`` where it was not checked (passing values, and failing ones the search
    did not need).
    """

    introduced_here: bool | None = None
    """Whether those nodes are still out of tolerance (the error starts here)."""
    max_abs_error: float | None = None
    """The error of those nodes alone, on the reference's inputs."""
    status: str | None = None
    nan_mismatch: int | None = None
    """Elements with NaN or Inf in different places in that local result."""
    error_growth: float | None = None
    """This value's error over the largest error of its inputs (max abs)."""
    classification: str | None = None
    """For a value that introduces error: ``graph semantics``, ``runtime kernel``,
    ``float precision`` or ``unclassified`` (see docs/how-it-decides.md)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LocalOutcome:
        """The local check's figures among a JSON record's keys (``local_status``...)."""
        local = data["local_status"]
        return cls(introduced_here=data["introduced_here"],
                   max_abs_error=data["local_max_abs_error"],
                   status=Status(local) if local is not None else None,
                   nan_mismatch=data["local_nan_mismatch"], error_growth=data["error_growth"],
                   classification=data["classification"])

    def to_dict(self) -> JsonObject:
        """The JSON record's keys for these figures, in the schema's order."""
        return {"introduced_here": self.introduced_here,
                "local_max_abs_error": self.max_abs_error, "local_status": self.status,
                "local_nan_mismatch": self.nan_mismatch, "error_growth": self.error_growth,
                "classification": self.classification}


@dataclass(frozen=True)
class MatchInfo:
    """How the value's two sides were matched, and what the ops inside it showed."""

    ops_compared: int | None = None
    """Module rows with op data: how many ops inside the module call were compared."""
    ops_failed: int | None = None
    first_failing_op: str | None = None
    """Module rows with op data: the FX node of the first failing op inside the call."""
    match_confidence: float | None = None
    """Structural fallback (a file of unknown origin): how sure the match is, 0 to 1."""
    matched_by: str | None = None
    """Structural fallback: ``topology``, ``region``, ``values``, ``position``..."""
    reference_value: str | None = None
    """ONNX against ONNX: the reference's value name (``onnx_value`` is the candidate's)."""
    reference_node: str | None = None
    """ONNX against ONNX: the reference's node that computed it."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MatchInfo:
        """The match's fields among a JSON record's keys."""
        return cls(**_own(cls, data))


def _own(part: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``data`` that are ``part``'s fields (each one must be there)."""
    return {item.name: data[item.name] for item in fields(part)}
