"""The per-step table of a decode run, and which step failed first and how.

A step fails when the logits or any layer's cache entry leaves tolerance
(``|runtime - torch| > atol + rtol * |torch|``). Its kind:

- ``introduced``: the teacher-forced run (the runtime fed PyTorch's cache and token)
  fails there first, so this step's own computation is wrong;
- ``accumulated``: every teacher-forced step up to it passes and the free-running run
  fails, so errors each within tolerance grew through the cache.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bisect_onnx.errors import InputError

if TYPE_CHECKING:
    from bisect_onnx.judge.records import Report

__all__ = ["Deviation", "StepComparison", "StepRow", "DecodeFinding", "DecodeReport",
           "find_failure", "INTRODUCED", "ACCUMULATED"]

INTRODUCED, ACCUMULATED = "introduced", "accumulated"


@dataclass(frozen=True)
class Deviation:
    """How far one value is from PyTorch's: the largest absolute error, and the verdict."""

    max_abs: float
    passed: bool

    def to_dict(self) -> dict[str, Any]:
        """As JSON data (a non-finite error as ``null``)."""
        finite = self.max_abs == self.max_abs and abs(self.max_abs) != float("inf")
        return {"max_abs": self.max_abs if finite else None, "pass": self.passed}


@dataclass(frozen=True)
class StepComparison:
    """One run of one step against PyTorch's: the logits and each layer's cache entries."""

    logits: Deviation
    keys: tuple[Deviation, ...]
    values: tuple[Deviation, ...]

    @property
    def passed(self) -> bool:
        """Whether the logits and every layer's key and value are within tolerance."""
        return self.logits.passed and all(d.passed for d in self.keys + self.values)

    def failing_layers(self) -> list[int]:
        """Layers whose key or value leaves tolerance, in order."""
        return [layer for layer, (key, value) in enumerate(zip(self.keys, self.values,
                                                                strict=True))
                if not (key.passed and value.passed)]

    def layer_error(self, layer: int) -> float:
        """The larger of the layer's key and value errors."""
        return max(self.keys[layer].max_abs, self.values[layer].max_abs)

    def to_dict(self) -> dict[str, Any]:
        """As JSON data."""
        return {"pass": self.passed, "logits": self.logits.to_dict(),
                "layers": [{"layer": layer, "key": key.to_dict(), "value": value.to_dict()}
                           for layer, (key, value) in enumerate(zip(self.keys, self.values,
                                                                    strict=True))]}


@dataclass(frozen=True)
class StepRow:
    """One step: where it starts, the token each run chose, each run's deviation."""

    step: int
    """0 for the prompt (the prefill), then 1, 2, ... for each decode step."""
    position: int
    """The position of the step's first token (the cache's length before it)."""
    length: int
    """How many tokens the step feeds (the prompt's length at step 0, then 1)."""
    reference_token: tuple[int, ...]
    """PyTorch's greedy next token, per batch row."""
    teacher_token: tuple[int, ...]
    free_token: tuple[int, ...]
    teacher: StepComparison
    free: StepComparison

    @property
    def phase(self) -> str:
        """``prefill`` (step 0) or ``decode``."""
        return "prefill" if self.step == 0 else "decode"

    def to_dict(self) -> dict[str, Any]:
        """As JSON data."""
        return {"step": self.step, "phase": self.phase, "position": self.position,
                "length": self.length,
                "tokens": {"reference": list(self.reference_token),
                           "teacher_forced": list(self.teacher_token),
                           "free_running": list(self.free_token)},
                "teacher_forced": self.teacher.to_dict(), "free_running": self.free.to_dict()}


@dataclass(frozen=True)
class DecodeFinding:
    """The first failing step, its kind, and where it points."""

    step: int
    kind: str
    """``introduced`` or ``accumulated``."""
    where: str
    """``prefill only``, ``prefill and decode``, ``decode``, ``decode, from position P``."""
    layer: int | None = None
    """Accumulated: the layer whose cache entries first leave tolerance (``None``: only
    the logits do)."""
    growth: tuple[float, ...] = ()
    """Accumulated: that layer's (or the logits') free-running error at each step."""
    culprit: str | None = None
    """Introduced: the step's bisection's verdict line (node, op, module, source line)."""

    @property
    def accumulated(self) -> bool:
        """Whether the error came through the cache (else it is introduced at the step)."""
        return self.kind == ACCUMULATED

    def to_dict(self) -> dict[str, Any]:
        """As JSON data."""
        return {"step": self.step, "kind": self.kind, "where": self.where,
                "layer": self.layer, "growth": [_finite(x) for x in self.growth],
                "culprit": self.culprit}


@dataclass(frozen=True)
class DecodeReport:
    """A decode run: the per-step table, the first failure, the step's bisection."""

    model: str
    onnx: str
    exporter: str | None
    rtol: float
    atol: float
    prompt: tuple[tuple[int, ...], ...]
    rows: tuple[StepRow, ...]
    finding: DecodeFinding | None = None
    bisection: Report | None = None
    """Introduced: the bisection of the failing step, on PyTorch's cache and token."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Where the time went: ``export``, ``torch``, ``runtime``, ``bisection``, ``total``."""
    warnings: tuple[str, ...] = ()
    """Cautions about the run (a model left in training mode)."""

    @property
    def verdict(self) -> str:
        """``parity`` or ``diverged``."""
        return "diverged" if self.finding is not None else "parity"

    @property
    def diverged(self) -> bool:
        """Whether some step failed."""
        return self.finding is not None

    def tokens(self, run: str = "reference") -> list[tuple[int, ...]]:
        """Each step's chosen token per batch row: ``reference`` or ``free_running``."""
        return [row.reference_token if run == "reference" else row.free_token
                for row in self.rows]

    def first_token_difference(self) -> int | None:
        """The first step whose free-running token is not PyTorch's (``None``: none)."""
        return next((row.step for row in self.rows if row.free_token != row.reference_token),
                    None)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON data (docs/decode.md describes it)."""
        return {"kind": "decode", "verdict": self.verdict, "model": self.model,
                "onnx": self.onnx, "exporter": self.exporter, "rtol": self.rtol,
                "atol": self.atol, "prompt": [list(row) for row in self.prompt],
                "steps": [row.to_dict() for row in self.rows],
                "first_token_difference": self.first_token_difference(),
                "first_failure": self.finding.to_dict() if self.finding else None,
                "bisection": self.bisection.to_dict() if self.bisection else None,
                "seconds": dict(self.seconds), "warnings": list(self.warnings)}

    def __str__(self) -> str:
        from bisect_onnx.decode.text import decode_text

        return decode_text(self)

    def _repr_html_(self) -> str:
        """The report in a notebook: verdict, chart of error by step and layer, table."""
        from bisect_onnx.decode.html import decode_fragment

        return decode_fragment(self)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the report to ``path`` (returned): HTML for ``.html``/``.htm``, else JSON.

        Raises:
            InputError: ``path`` cannot be written.
        """
        import json

        from bisect_onnx.decode.html import decode_html

        target = Path(path)
        html = target.suffix.lower() in (".html", ".htm")
        text = decode_html(self) if html else json.dumps(self.to_dict(), indent=1) + "\n"
        try:
            target.write_text(text, encoding="utf-8")
        except OSError as error:
            raise InputError(f"{target}: cannot write the report there ({error.strerror}); "
                             "pass a path in a folder you can write") from error
        return target


def find_failure(rows: tuple[StepRow, ...]) -> DecodeFinding | None:
    """The first failing step and its kind (the culprit of an introduced one comes later)."""
    teacher = next((row.step for row in rows if not row.teacher.passed), None)
    free = next((row.step for row in rows if not row.free.passed), None)
    if teacher is None and free is None:
        return None
    if teacher is not None and (free is None or teacher <= free):
        return DecodeFinding(teacher, INTRODUCED, _where(rows, teacher))
    assert free is not None
    failing = rows[free].free.failing_layers()
    layer = failing[0] if failing else None
    growth = tuple(row.free.layer_error(layer) if layer is not None else row.free.logits.max_abs
                   for row in rows)
    return DecodeFinding(free, ACCUMULATED, "prefill" if free == 0 else "decode", layer, growth)


def _where(rows: tuple[StepRow, ...], first: int) -> str:
    """Where teacher-forced steps fail: only the prefill, from a position on, or here and there."""
    later = [row.teacher.passed for row in rows[first + 1:]]
    if first == 0:
        return "prefill only" if all(later) else "prefill and decode"
    if later and not any(later):
        return f"decode, from position {rows[first].position} on"
    return "decode"


def _finite(value: float) -> float | None:
    return value if value == value and abs(value) != float("inf") else None
