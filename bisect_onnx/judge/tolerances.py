"""Tolerances that follow the candidate's precision, and per-value tolerances from a file.

When an ONNX model is compared with its float16 conversion or its quantized form, the
float32 defaults would flag every value: rounding alone puts a float16 tensor about
1e-3 off. Defaults are therefore chosen by the narrower precision of the two models
(:func:`precision_of`), and a quantized value gets an absolute tolerance in steps of
its own quantization scale.

A tolerance file loosens (or tightens) chosen values. One rule a line, the first rule
whose pattern matches a value's name wins; ``#`` starts a comment::

    # value-name pattern (fnmatch: * ? [..])   rtol    atol
    relu_*                                     1e-2    1e-3
    linear                                     0.1     0.05
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from bisect_onnx.errors import InputError
from bisect_onnx.judge.compare import DEFAULT_ATOL, DEFAULT_RTOL, check_tolerances

if TYPE_CHECKING:
    import onnx

    from bisect_onnx.judge.records import Record

__all__ = ["Tolerance", "ToleranceRule", "PRECISION_DEFAULTS", "QUANTIZED", "QUANT_STEPS",
           "precision_of", "default_tolerance", "quantized_tolerance", "read_tolerance_file",
           "rule_for", "tolerance_rules", "judged_by", "Judge"]

QUANTIZED = "int8 (QDQ)"


@dataclass(frozen=True)
class Tolerance:
    """An element fails when ``|candidate - reference| > atol + rtol * |reference|``."""

    rtol: float
    atol: float


#: Defaults by the narrower precision of the two models. float32: ~7 significant digits,
#: of which a few hundred accumulated roundings cost about three. float16 (10-bit
#: mantissa, eps ~1e-3) and bfloat16 (7-bit, eps ~8e-3): about ten eps of relative
#: error, and an atol for values near zero that rounding of their inputs pushes off.
PRECISION_DEFAULTS = {
    "float32": Tolerance(DEFAULT_RTOL, DEFAULT_ATOL),
    "float16": Tolerance(1e-2, 1e-3),
    "bfloat16": Tolerance(5e-2, 1e-2),
    # Quantized values get atol = QUANT_STEPS * their scale (see quantized_tolerance).
    QUANTIZED: Tolerance(5e-2, 1e-2),
}
#: A quantized value may be off by this many steps of its scale: one step of rounding
#: per QDQ pair upstream adds up (up to 5 steps measured on a 10-conv ResNet), and 16 of
#: 256 levels is still far below what a wrong weight or attribute does.
QUANT_STEPS = 16

_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
# Narrowest first: the looser default wins when the two models differ.
_ORDER = (QUANTIZED, "bfloat16", "float16", "float32")


def precision_of(model: onnx.ModelProto) -> str:
    """The narrowest precision a model computes in.

    ``int8 (QDQ)``, ``bfloat16``, ``float16`` or ``float32`` (a float64 model, or one
    with no float values, counts as float32: its defaults would be the same).
    """
    import onnx

    graph = model.graph
    if any(node.op_type in _QDQ_OPS or node.op_type.startswith("QLinear")
           for node in graph.node):
        return QUANTIZED
    types = {tensor.data_type for tensor in graph.initializer}
    types.update(info.type.tensor_type.elem_type
                 for info in (*graph.input, *graph.output, *graph.value_info))
    for node in graph.node:
        if node.op_type == "Cast":
            types.update(attribute.i for attribute in node.attribute if attribute.name == "to")
    if onnx.TensorProto.BFLOAT16 in types:
        return "bfloat16"
    if onnx.TensorProto.FLOAT16 in types:
        return "float16"
    return "float32"


def default_tolerance(*precisions: str) -> tuple[Tolerance, str]:
    """The default for the narrowest of ``precisions``, and that precision's name."""
    narrowest = min(precisions, key=_ORDER.index)
    return PRECISION_DEFAULTS[narrowest], narrowest


def quantized_tolerance(base: Tolerance, scale: float) -> Tolerance:
    """A quantized value's tolerance: ``QUANT_STEPS`` steps of its scale, at least ``base``."""
    return Tolerance(base.rtol, max(base.atol, QUANT_STEPS * scale))


class Judge(Protocol):
    """What a stage needs of a run's tolerance: the base, and what a record was judged by.

    :class:`~bisect_onnx.judge.tolerance_judge.ToleranceJudge` (against PyTorch) and
    :class:`~bisect_onnx.judge.value_judge.PairJudge` (against ONNX) are the two.
    """

    base: Tolerance

    def of(self, record: Record | None) -> Tolerance:
        """The tolerance ``record`` was judged by."""


def judged_by(record: Record | None, base: Tolerance) -> Tolerance:
    """The tolerance ``record`` was judged by: its own (a rule's, a scale's), else ``base``."""
    if record is None or record.figures.rtol is None or record.figures.atol is None:
        return base
    return Tolerance(record.figures.rtol, record.figures.atol)


@dataclass(frozen=True)
class ToleranceRule:
    """One line of a tolerance file."""

    pattern: str
    tolerance: Tolerance
    where: str
    """``FILE:LINE``, for messages."""

    def matches(self, names: Sequence[str]) -> bool:
        """Whether the pattern matches any of a value's names (reference or candidate)."""
        return any(fnmatch.fnmatchcase(name, self.pattern) for name in names)


def rule_for(rules: Sequence[ToleranceRule], *names: str) -> ToleranceRule | None:
    """The first rule matching any of ``names``; ``None`` when none does."""
    return next((rule for rule in rules if rule.matches(names)), None)


def tolerance_rules(tolerances: str | Path | Mapping[str, tuple[float, float]] | None,
                    ) -> list[ToleranceRule]:
    """Per-value rules from a tolerance file, a ``{pattern: (rtol, atol)}`` mapping, or none."""
    if tolerances is None:
        return []
    if not isinstance(tolerances, Mapping):
        return read_tolerance_file(tolerances)
    rules = []
    for pattern, pair in tolerances.items():
        rtol, atol = pair
        check_tolerances(rtol, atol)
        rules.append(ToleranceRule(str(pattern), Tolerance(float(rtol), float(atol)),
                                   f"tolerances[{pattern!r}]"))
    return rules


def read_tolerance_file(path: str | Path) -> list[ToleranceRule]:
    """Parse a tolerance file (see the module docstring); one-line errors name file and line."""
    path = Path(path)
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise InputError(f"tolerance file {path} {what}; pass a text file of lines "
                         "'PATTERN RTOL ATOL' to --tolerances")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM (Notepad) is not a pattern
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read tolerance file {path} ({type(error).__name__}); pass "
                         "a UTF-8 text file of lines 'PATTERN RTOL ATOL'") from error
    rules = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        where = f"{path}:{number}"
        if len(fields) != 3:
            raise InputError(f"{where}: expected 'PATTERN RTOL ATOL' (three fields), got "
                             f"{line.strip()!r}")
        rtol, atol = (_number(text, where, label) for text, label in
                      ((fields[1], "rtol"), (fields[2], "atol")))
        rules.append(ToleranceRule(fields[0], Tolerance(rtol, atol), where))
    return rules


def _number(text: str, where: str, label: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise InputError(f"{where}: {label} {text!r} is not a finite number >= 0 "
                         "(write it like 1e-3)")
    return value
