"""A report's JSON data both ways: where each part is written, and how it reads back.

:meth:`~bisect_onnx.judge.records.Report.to_dict` writes each fact once, so a few
of a report's fields are not written as they are held; reading back restores them
from what is written:

- the culprit's node (``culprit_node``) is written under ``culprit.node`` without its
  name, module, op and source, which the culprit's record gives back;
- ``attribution`` is written without ``first_culprit`` (the culprit's value) and with
  ``inside_op`` added;
- the report's references to its own rows (the first divergence, the culprit, the
  culprits, the NaN origin) are written as the records they name: each reads back as
  the list whose row it is, and a culprit no list holds (a value inside a fused kernel)
  as one of ``kernel_values``.

What schema 2 does not hold reads back as close as it can, and is documented in
docs/json-schema.md: a non-finite figure (``null``) as ``None``, a tuple inside a
mapping as a list, a warning as its text (no ``code``), ``kernel_values`` as the
records the culprits name, and ``culprit_node`` only where the culprit names it.

The records module imports this one: records are made by the constructors it passes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from bisect_onnx.align.modules import Unaligned
from bisect_onnx.errors import InputError
from bisect_onnx.judge.refs import COMPARISONS, FINAL_OUTPUTS, KERNEL_VALUES, RowRef
from bisect_onnx.judge.report_parts import (
    Attribution,
    CulpritNode,
    CulpritSegment,
    InsideOp,
    ReproFolder,
    Search,
)
from bisect_onnx.judge.sweep_table import SweepTable
from bisect_onnx.judge.vocabulary import Verdict
from bisect_onnx.version import __version__

if TYPE_CHECKING:  # types only: records import this module to write and read themselves
    from bisect_onnx.fixes.trial import FixResult
    from bisect_onnx.judge.records import Coverage, Record, Report

__all__ = ["SCHEMA_VERSION", "culprit_data", "attribution_data", "report_fields"]

SCHEMA_VERSION = 2
# Schema 2 (from 1): ``culprit`` is the answer, the first node that introduces the
# error (schema 1's ``first_culprit``); the node's graph neighbourhood is
# ``culprit.node`` (schema 1's top-level ``culprit``); ``inside_op`` moved into
# ``attribution``, which no longer repeats the culprit's value name or the culprits'.

_Part = TypeVar("_Part")
#: What to pass instead of a file or data that is no report.
_EXPECTED = "pass a JSON report that bisect-onnx --json or Report.save wrote"


def culprit_data(report: Report) -> dict[str, Any] | None:
    """The culprit's record with its node in the graph, or ``None``."""
    culprit = report.culprit
    if culprit is None:
        return None
    node = report.culprit_node
    if node is None or node.node != culprit.onnx_node:
        # None, or described for the first divergence, not for the culprit
        return {**culprit.to_dict(), "node": None}
    # The record already says the node's name, module, op and source.
    return {**culprit.to_dict(), "node": {key: value for key, value in node.to_dict().items()
                                          if key not in CulpritNode.RECORD_KEYS}}


def attribution_data(report: Report) -> dict[str, Any] | None:
    """The evidence behind the culprit, each fact once (the names are in ``culprit``)."""
    if report.attribution is None and report.inside_op is None:
        return None
    evidence = report.attribution.to_dict() if report.attribution is not None else {}
    return {**evidence, "inside_op": report.inside_op.to_dict() if report.inside_op else None}


def report_fields(data: Any, *, record: Callable[[Mapping[str, Any]], Record],
                  coverage: Callable[[Mapping[str, Any]], Coverage]) -> dict[str, Any]:
    """A report's fields from its JSON data; ``record`` and ``coverage`` read those parts.

    Raises:
        InputError: ``data`` is not a report of schema :data:`SCHEMA_VERSION`.
    """
    _check_schema(data)
    try:
        return _fields(data, record, coverage)
    except (KeyError, TypeError, ValueError) as error:
        what = f"no key {error}" if isinstance(error, KeyError) else str(error)
        raise InputError(f"not a bisect-onnx JSON report of schema {SCHEMA_VERSION} "
                         f"({what}); {_EXPECTED}") from error


def _check_schema(data: object) -> None:
    """Refuse what is no bisect-onnx report, or a report of another schema version."""
    if not isinstance(data, Mapping):
        raise InputError(f"not a bisect-onnx JSON report (it holds a JSON "
                         f"{_json_kind(data)}, not an object); {_EXPECTED}")
    if "schema" not in data or "verdict" not in data:
        raise InputError(f"not a bisect-onnx JSON report (it has no \"schema\" and "
                         f"\"verdict\" keys); {_EXPECTED}")
    if data["schema"] != SCHEMA_VERSION:
        raise InputError(f"a report of schema {data['schema']!r}, and bisect-onnx "
                         f"{__version__} reads schema {SCHEMA_VERSION} only; write it again "
                         "with this version (docs/json-schema.md says what changed)")


def _json_kind(data: object) -> str:
    """What JSON value ``data`` is, in a message."""
    kinds = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return kinds.get(type(data), "null")


def _fields(data: Mapping[str, Any], record: Callable[[Mapping[str, Any]], Record],
            coverage: Callable[[Mapping[str, Any]], Coverage]) -> dict[str, Any]:
    """Every field of the report ``data`` holds (see the module's docstring)."""
    def rows(key: str) -> list[Record]:
        return [record(item) for item in data[key]]

    def named(key: str) -> Record | None:
        return record(data[key]) if data[key] is not None else None

    tables = {COMPARISONS: rows("comparisons"), FINAL_OUTPUTS: rows("final_outputs"),
              KERNEL_VALUES: []}
    culprit = named("culprit")
    culprit_ref = _ref_to(culprit, tables, kernel=True)
    culprit_refs = (tuple(_ref_to(item, tables, kernel=True) for item in rows("culprits"))
                    if data["culprits"] is not None else None)
    attribution, inside_op = _attribution(data["attribution"], culprit_ref or (
        culprit_refs[0] if culprit_refs else None))
    return {
        "verdict": Verdict(data["verdict"]), "rtol": data["rtol"], "atol": data["atol"],
        "environment": dict(data["environment"]), "reference": dict(data["reference"]),
        "candidate": dict(data["candidate"]),
        "final_outputs": tables[FINAL_OUTPUTS], "comparisons": tables[COMPARISONS],
        "coverage": coverage(data["coverage"]),
        "unaligned": [Unaligned(**item) for item in data["unaligned"]],
        "onnx_unaligned": [Unaligned(**item) for item in data["onnx_unaligned"]],
        "op_comparisons": rows("op_comparisons"),
        "warnings": list(data["warnings"]), "note": data["note"],
        "repro": _part(ReproFolder.from_dict, data["repro"]),
        "attribution": attribution, "capture": dict(data["capture"]), "inside_op": inside_op,
        "culprit_node": _culprit_node(data["culprit"], culprit),
        "tolerance_basis": data["tolerance_basis"], "search": Search.from_dict(data["search"]),
        "kernel_values": tables[KERNEL_VALUES],
        "culprit_segment": _part(CulpritSegment.from_dict, data["culprit_segment"]),
        "fixes": _fixes(data["fixes"]), "fix_notes": tuple(data["fix_notes"]),
        # Written since the sweep: a report of the same schema from before has none.
        "sweep": SweepTable.from_dict(data["sweep"]) if data.get("sweep") else None,
        "first_divergence_ref": _ref_to(named("first_divergence"), tables, kernel=False),
        "culprit_ref": culprit_ref, "culprit_refs": culprit_refs,
        "nan_origin_ref": _ref_to(named("nan_origin"), tables, kernel=False),
    }


def _ref_to(record: Record | None, tables: Mapping[str, list[Record]], *,
            kernel: bool) -> RowRef | None:
    """The reference to the list whose row ``record`` is.

    With ``kernel``, a record no list holds joins ``kernel_values``: a culprit inside
    a fused kernel, which the JSON report writes only as the culprit.
    """
    if record is None:
        return None
    for table in (COMPARISONS, FINAL_OUTPUTS, KERNEL_VALUES):
        ref = RowRef(record.onnx_value, table)
        if ref.find(tables[table]) == record:
            return ref
    if not kernel:
        raise ValueError(f"it names the value {record.onnx_value!r}, which no row holds")
    tables[KERNEL_VALUES].append(record)
    return RowRef(record.onnx_value, KERNEL_VALUES)


def _attribution(data: Mapping[str, Any] | None, culprit: RowRef | None,
                 ) -> tuple[Attribution | None, InsideOp | None]:
    """``attribution`` and ``inside_op``, from the JSON's ``attribution``.

    ``first_culprit`` is the first culprit the evidence holds: the culprit, else the
    first of the culprits listed. Written with ``inside_op`` alone, it held no evidence.
    """
    if data is None:
        return None, None
    evidence = dict(data)
    inside_op = _part(InsideOp.from_dict, evidence.pop("inside_op"))
    if not evidence:
        return None, inside_op
    return Attribution.from_dict(evidence, culprit.value if culprit else None), inside_op


def _culprit_node(data: Mapping[str, Any] | None, culprit: Record | None) -> CulpritNode | None:
    """The culprit's node in its graph, its record's names put back."""
    node = data["node"] if data is not None else None
    if node is None or culprit is None:
        return None
    return replace(CulpritNode.from_dict({**node, "node": culprit.onnx_node}),
                   torch_module=culprit.torch_module, torch_op=culprit.torch_op,
                   source=culprit.source)


def _part(read: Callable[[Mapping[str, Any]], _Part], data: Mapping[str, Any] | None,
          ) -> _Part | None:
    """The part ``read`` makes of ``data``; ``None`` where the JSON holds ``null``."""
    return read(data) if data is not None else None


def _fixes(data: Sequence[Mapping[str, Any]]) -> tuple[FixResult, ...]:
    """The checked fixes (:class:`~bisect_onnx.fixes.trial.FixResult`)."""
    if not data:
        return ()
    from bisect_onnx.fixes.trial import FixResult

    return tuple(FixResult.from_dict(item) for item in data)
