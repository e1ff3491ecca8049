"""assert_parity, unittest, and the pytest plugin (run with pytester)."""

from __future__ import annotations

import io
import json
import unittest

import pytest

import bisect_onnx
from bisect_onnx.events import BISECTION_STARTED, SESSION_CREATED
from fixtures.registry import repo_path
from tests.torch_warnings import DYNAMO_LEAFSPEC_DEPRECATED

pytest_plugins = ["pytester"]


def kinds(events):
    return [event.kind for event in events]


def test_passing_check_builds_one_plain_session_and_no_bisection(fixture_case):
    model, inputs, exported = fixture_case("resnet_like")
    seen = []
    with bisect_onnx.events.listening(seen.append):
        bisect_onnx.assert_parity(model, inputs, exported)
    assert kinds(seen).count(SESSION_CREATED) == 1
    assert BISECTION_STARTED not in kinds(seen)


def test_failing_check_bisects_and_names_the_culprit(fixture_case, tmp_path):
    model, inputs, exported = fixture_case("avgpool_divisor")
    seen = []
    with bisect_onnx.events.listening(seen.append), \
            pytest.raises(bisect_onnx.ParityError) as raised:
        bisect_onnx.assert_parity(
            model, inputs, exported,
            output=bisect_onnx.OutputOptions(repro_dir=tmp_path, label="pool model"))
    assert isinstance(raised.value, AssertionError)
    assert BISECTION_STARTED in kinds(seen)
    message = str(raised.value)
    assert "DIVERGED" in message and "module pool" in message and ">>" in message
    assert raised.value.report.first_divergence.onnx_node == "node_avg_pool2d"
    written = json.loads((tmp_path / "pool_model.json").read_text())
    assert written["first_divergence"]["torch_module"] == "pool"
    assert bisect_onnx.Report.load(tmp_path / "pool_model.json") == raised.value.report
    assert "node_avg_pool2d" in (tmp_path / "pool_model.html").read_text()
    assert (tmp_path / "pool_model.repro" / "repro.py").is_file()


def test_unittest_failure_message_holds_the_verdict(fixture_case):
    model, inputs, exported = fixture_case("avgpool_divisor")

    class ParityTest(unittest.TestCase):
        def test_export(self):
            bisect_onnx.assert_parity(model, inputs, exported)

    stream = io.StringIO()
    result = unittest.TextTestRunner(stream=stream).run(
        unittest.defaultTestLoader.loadTestsFromTestCase(ParityTest))
    assert len(result.failures) == 1 and not result.errors  # a failure, not an error
    assert "DIVERGED: culprit ONNX node 'node_avg_pool2d'" in result.failures[0][1]


PARITY_TESTS = """
from fixtures.registry import FIXTURES, build_model, load_inputs, repo_path

def check(onnx_parity, name):
    fixture = FIXTURES[name]
    onnx_parity(build_model(fixture), load_inputs(fixture), repo_path(fixture.onnx_file))

def test_mlp_export(onnx_parity):
    import bisect_onnx

    seen = []
    with bisect_onnx.events.listening(seen.append):
        check(onnx_parity, "tiny_mlp")
    assert "bisection_started" not in [event.kind for event in seen]

def test_pool_export(onnx_parity):
    check(onnx_parity, "avgpool_divisor")
"""


def test_plugin_reports_where_parity_broke(pytester, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(repo_path(".")))  # the fixtures package
    pytester.makepyfile(test_exports=PARITY_TESTS)
    artifacts = tmp_path / "artifacts"
    result = pytester.runpytest_subprocess("--bisect-onnx-artifacts", str(artifacts), "-p",
                                           "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    output = result.stdout.str()
    assert "bisect-onnx" in output
    assert "node_avg_pool2d" in output and "module pool" in output
    assert "where ONNX parity broke" in output
    assert "test_exports.py::test_pool_export" in output
    written = sorted(path.name for path in artifacts.iterdir())
    assert written == ["test_exports.py_test_pool_export.html",
                       "test_exports.py_test_pool_export.json",
                       "test_exports.py_test_pool_export.repro"]


def test_plugin_options_are_in_one_group(pytester):
    result = pytester.runpytest_subprocess("--help")
    help_text = result.stdout.str()
    assert "ONNX parity checks (bisect-onnx)" in help_text
    for option in ("--bisect-onnx-artifacts", "--bisect-onnx-rtol", "--bisect-onnx-atol"):
        assert option in help_text


@DYNAMO_LEAFSPEC_DEPRECATED
def test_an_onnx_program_is_checked_as_it_is(fixture_case):
    import numpy as np
    import onnx_ir
    import torch

    model, inputs, _ = fixture_case("tiny_mlp")
    program = torch.onnx.export(model, (torch.from_numpy(inputs["x"]),), dynamo=True,
                                verbose=False)
    bisect_onnx.assert_parity(program, inputs)
    weight = program.model.graph.initializers["fc2.weight"]
    weight.const_value = onnx_ir.tensor(weight.const_value.numpy() * np.float32(1.5))
    with pytest.raises(bisect_onnx.ParityError, match="fc2"):
        bisect_onnx.assert_parity(program, inputs)
