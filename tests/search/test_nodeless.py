"""A computation PyTorch runs that the ONNX graph has no node for is named as the culprit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import bisect_onnx
from bisect_onnx.graph.provenance import Provenance
from bisect_onnx.judge.record_parts import ComparisonFigures
from bisect_onnx.judge.records import Record
from bisect_onnx.judge.tolerances import Tolerance
from bisect_onnx.runtime.sides import CapturedValue
from bisect_onnx.search.nodeless import at_module_level
from fixtures.registry import FIXTURES, repo_path
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED, TORCH_JIT_DEPRECATED

FIXTURE = FIXTURES["functional_attention"]  # fc1 -> gelu -> drop (Dropout) -> fc2
EXPORTS = {"dynamo": FIXTURE.onnx_file, "torchscript": FIXTURE.torchscript_onnx_file}
TOLERANCE = Tolerance(1e-3, 1e-5)


@pytest.mark.parametrize("granularity", [None, "module"])
@pytest.mark.parametrize("exporter", EXPORTS)
def test_a_dropout_left_in_training_mode_is_the_culprit_and_eval_the_fix(
        fixture_case, exporter, granularity):
    model, inputs, _ = fixture_case(FIXTURE.name)
    model.drop.train()
    try:
        report = bisect_onnx.bisect(model, inputs, onnx_model=repo_path(EXPORTS[exporter]),
                                    search=bisect_onnx.SearchOptions(granularity=granularity))
    finally:
        model.eval()
    culprit = report.culprit
    assert culprit is not None and culprit.onnx_node is None  # no ONNX node is blamed
    assert culprit.torch_module == "drop"
    assert report.attribution.classification["kind"] == "pytorch mode"
    headline = report.summary().splitlines()[0]
    assert "drop" in headline and "no ONNX node" in headline and "eval()" in headline
    # The nodes after it only inherit: none of them is named as introducing the error.
    assert not any(row.local.introduced_here for row in report.comparisons)


class _Gate(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent: the trace keeps the branch it took
            return x * 2
        return x


class _Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.gate = _Gate()
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc2(self.gate(self.fc1(x)))


@LEGACY_EXPORTER_DEPRECATED
@TORCH_JIT_DEPRECATED
def test_a_branch_the_trace_left_out_is_named_at_its_module(tmp_path):
    torch.manual_seed(0)
    model = _Gated().eval()
    with torch.no_grad():
        model.fc1.bias.zero_()  # fc1(-x) sums to -fc1(x): one sign takes each branch
        x = torch.randn(1, 8)
        positive = x if model.fc1(x).sum() > 0 else -x
    path = tmp_path / "gated.onnx"
    # Traced where the gate hands its input on: the graph has no node for it.
    torch.onnx.export(model, (-positive,), str(path), dynamo=False)
    report = bisect_onnx.bisect(model, positive.numpy(), onnx_model=path,
                                search=bisect_onnx.SearchOptions(granularity="module"))
    assert report.diverged and report.culprit is not None, report.summary()
    assert report.culprit.onnx_node is None and report.culprit.torch_module == "gate"
    assert report.attribution.classification["kind"] == "missing in the export"


def _value(name: str, array) -> CapturedValue:
    return CapturedValue(name, np.asarray(array, dtype=np.float32), Provenance(position=0))


def _row(module: str) -> Record:
    return Record(index=1, onnx_node="n", onnx_op="Gemm", onnx_value="v", torch_module=module,
                  torch_op=None, source=None, shape=[2], dtype="float32", candidate_shape=[2],
                  candidate_dtype="float32", figures=ComparisonFigures(max_abs_error=1.0,
                                                                       max_rel_error=1.0,
                                                                       mismatch_fraction=1.0,
                                                                       min_passing_atol=1.0,
                                                                       nan_mismatch=0,
                                                                       status="fail"))


@pytest.mark.parametrize(("before", "after", "onnx", "found"), [
    ([1, 2], [2, 4], [1, 2], True),    # changes its input; ONNX hands the input on
    ([1, 2], [1, 2], [1, 2], False),   # hands its input on: not where the data changes
    ([1, 2], [2, 4], [5, 5], False),   # ONNX already differs before it: upstream
])
def test_a_call_is_named_only_where_it_alone_explains_the_failure(before, after, onnx, found):
    values = {"drop (input)": _value("drop (input)", before), "drop": _value("drop", after),
              "fc2 (input)": _value("fc2 (input)", after), "fc2": _value("fc2", [0, 0])}
    named = at_module_level(_row("fc2"), values, {"v": np.asarray(onnx, np.float32)},
                            TOLERANCE, training={"drop": "Dropout"}, computed_in={"fc2"})
    assert (named is not None) == found
    if found:
        assert named.record.torch_module == "drop" and named.training
        assert named.record.onnx_node is None and named.before == "drop (input)"


@pytest.mark.parametrize("computed_in", [{"fc2", "drop"}, {"fc2", "drop.inner"}, None])
def test_a_call_the_failing_check_computes_is_not_missing(computed_in):
    # The check's nodes run in the call (a Conv fused with the norm after it), or in a
    # node of unknown scope (an inserted one): the call is not one the graph lacks.
    values = {"drop (input)": _value("drop (input)", [1, 2]), "drop": _value("drop", [2, 4]),
              "fc2 (input)": _value("fc2 (input)", [2, 4]), "fc2": _value("fc2", [0, 0])}
    assert at_module_level(_row("fc2"), values, {"v": np.asarray([1, 2], np.float32)},
                           TOLERANCE, training=(), computed_in=computed_in) is None
