"""docs/json-schema.md and ``Report.to_dict`` name the same keys.

The document has one table per JSON object, under a heading ```## `name` ```, whose first
column is the key in backticks. Three real reports are read back (a divergence with its
repro, the same found by probes, an ONNX-against-ONNX run, a sweep) so that each object appears in
the shapes the drivers write it in.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

import bisect_onnx
from fixtures.registry import REPO_ROOT

SCHEMA_DOC = REPO_ROOT / "docs" / "json-schema.md"

_HEADING = re.compile(r"^## `([^`]+)`")
_ROW = re.compile(r"^\| `([^`]+)` \|")

# Objects these reports write with every documented key. The others only some runs fill
# in full: `reference` (`module_calls` comes from a .pt2 or TorchScript model) and
# `attribution.inside_op` (a divergence inside an op made of several ONNX nodes); for those only the
# keys written are checked.
WRITTEN_IN_FULL = frozenset({
    "report", "record", "record.source", "coverage", "unaligned[]", "environment",
    "candidate", "capture", "search", "search.probes[]", "attribution",
    "attribution.classification", "culprit.node", "culprit.node.inputs[]", "repro",
    "culprit.node.ran_in.kernel", "sweep", "sweep.rows[]",
})
OBJECTS = WRITTEN_IN_FULL | {"reference", "attribution.inside_op"}

_RECORD_LISTS = ("final_outputs", "comparisons", "hidden_divergences", "op_comparisons")
_SINGLE_RECORDS = ("first_divergence", "nan_origin")
_PLAIN_OBJECTS = ("coverage", "environment", "reference", "candidate", "capture", "search",
                  "attribution", "repro", "sweep")


def documented_keys(text: str) -> dict[str, set[str]]:
    """Each object's keys, as the document's tables list them."""
    keys: dict[str, set[str]] = {}
    current = None
    for line in text.splitlines():
        heading = _HEADING.match(line)
        if heading:
            current = heading.group(1)
            keys[current] = set()
        elif current is not None and (row := _ROW.match(line)):
            keys[current].add(row.group(1))
    return keys


def _objects(data: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every documented object in one report's data, named as the document names it."""
    yield "report", data
    records = [data[name] for name in _SINGLE_RECORDS if data[name] is not None]
    culprit = data["culprit"]
    if culprit is not None:  # a record, with its node in the graph
        records.append({key: value for key, value in culprit.items() if key != "node"})
    records += [record for name in _RECORD_LISTS for record in data[name]]
    records += data["culprits"] or []
    for record in records:
        yield "record", record
        if record["source"] is not None:
            yield "record.source", record["source"]
    for item in data["unaligned"] + data["onnx_unaligned"]:
        yield "unaligned[]", item
    for name in _PLAIN_OBJECTS:
        if data[name]:  # null, or an empty capture
            yield name, data[name]
    for probe in (data["search"] or {}).get("probes", []):
        yield "search.probes[]", probe
    if data["attribution"] and data["attribution"]["classification"]:
        yield "attribution.classification", data["attribution"]["classification"]
    if data["attribution"] and data["attribution"].get("inside_op"):
        yield "attribution.inside_op", data["attribution"]["inside_op"]
    for row in (data.get("sweep") or {}).get("rows", []):
        yield "sweep.rows[]", row
    if culprit is not None and culprit["node"] is not None:
        yield "culprit.node", culprit["node"]
        for tensor in culprit["node"]["inputs"] + culprit["node"]["outputs"]:
            yield "culprit.node.inputs[]", tensor
        if (culprit["node"]["ran_in"] or {}).get("kernel"):
            yield "culprit.node.ran_in.kernel", culprit["node"]["ran_in"]["kernel"]


def written_keys(reports: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Each object's keys, over every report (a key some drivers omit still counts)."""
    keys: dict[str, set[str]] = {}
    for data in reports:
        for name, obj in _objects(data):
            keys.setdefault(name, set()).update(obj)
    return keys


def key_differences(name: str, documented: set[str], written: set[str]) -> list[str]:
    """What the document and the reports disagree on for one object, in words."""
    problems = []
    if written - documented:
        problems.append(f"`{name}`: written but not in {SCHEMA_DOC.name}: "
                        f"{sorted(written - documented)}")
    if name in WRITTEN_IN_FULL and documented - written:
        problems.append(f"`{name}`: in {SCHEMA_DOC.name} but not written: "
                        f"{sorted(documented - written)}")
    return problems


@pytest.fixture(scope="module")
def reports(fixture_case, tmp_path_factory) -> list[dict[str, Any]]:
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    repro = tmp_path_factory.mktemp("repro")
    diverged = bisect_onnx.bisect(model, inputs, onnx_model=onnx_path,
                                  output=bisect_onnx.OutputOptions(repro_dir=repro))
    # A budget nothing fits in: ONNX Runtime's values are probed, `search` in full.
    probed = bisect_onnx.bisect(model, inputs, onnx_model=onnx_path,
                                runtime=bisect_onnx.RuntimeOptions(max_memory=1))
    against = bisect_onnx.bisect_onnx_models(onnx_path, inputs=inputs,
                                             reference_runtime="onnx.reference")
    swept = bisect_onnx.bisect(model, inputs, onnx_model=onnx_path,
                               search=bisect_onnx.SearchOptions(sweep=True))
    assert probed.search.mode == "bisection"
    return [diverged.to_dict(), probed.to_dict(), against.to_dict(), swept.to_dict()]


@pytest.fixture(scope="module")
def documented() -> dict[str, set[str]]:
    return documented_keys(SCHEMA_DOC.read_text(encoding="utf-8"))


def test_document_has_a_table_for_each_object_and_no_other(documented):
    assert set(documented) == OBJECTS
    empty = [name for name, keys in documented.items() if not keys]
    assert not empty, f"headings without a key table: {empty}"


def test_each_object_written_is_documented(reports, documented):
    written = written_keys(reports)
    assert set(written) - {"attribution.inside_op"} == OBJECTS - {"attribution.inside_op"}, (
        "these reports no longer write every object the test expects")
    problems = [problem for name in sorted(written)
                for problem in key_differences(name, documented[name], written[name])]
    assert not problems, "\n".join(problems)


def test_a_key_added_to_the_report_alone_is_named(reports, documented):
    data = {**reports[0], "new_key": 1}
    data["coverage"] = {**data["coverage"], "new_count": 2}
    data["comparisons"] = [{**data["comparisons"][0], "new_figure": 0.5}]
    written = written_keys([data])
    for name, key in (("report", "new_key"), ("coverage", "new_count"),
                      ("record", "new_figure")):
        problems = key_differences(name, documented[name], written[name])
        assert any("written but not in" in problem and repr(key) in problem
                   for problem in problems), (name, problems)


def test_a_documented_key_no_longer_written_is_named(documented):
    written = {"schema"}
    problems = key_differences("report", documented["report"], written)
    assert len(problems) == 1 and "in json-schema.md but not written" in problems[0]
    assert "'verdict'" in problems[0]
