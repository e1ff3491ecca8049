"""A runtime plugs in through one base class and one registry line, from this file alone.

``BasicLevelRunner`` is ONNX Runtime at its ``basic`` optimization level, registered
under a name of its own: the PyTorch form, ONNX against ONNX and the command line run
through it, and every figure the report gives about the runtime is its.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import bisect_onnx
from bisect_onnx.cli.command import main
from bisect_onnx.runtime import registry
from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner
from bisect_onnx.runtime.registry import RuntimeEntry, register_runtime
from bisect_onnx.runtime.runner import ProductionCheck, Runner, RunnerSettings, RuntimeRun
from fixtures.registry import FIXTURES, repo_path
from tests.planting import plant, scale_conv_weight

NAME = "ort-basic"


class BasicLevelRunner(OnnxRuntimeRunner):
    """ONNX Runtime at the ``basic`` level, whatever the options say."""

    runtime = NAME

    def __init__(self, path: Path, *, promote: str = "fused") -> None:
        super().__init__(path, opt_level="basic", promote=promote)
        self.runs = 0

    def with_promotion(self, promote: str) -> BasicLevelRunner:
        return BasicLevelRunner(self.path, promote=promote)

    def run(self, inputs):
        self.runs += 1
        return super().run(inputs)


def _refuse_precision(settings: RunnerSettings) -> None:
    if settings.precision is not None:
        raise bisect_onnx.UsageError("ort-basic takes no precision")


@pytest.fixture
def basic_runtime(monkeypatch):
    """The runtime registered for one test, the registry as it was afterwards."""
    made: list[BasicLevelRunner] = []

    def make(path: Path, settings: RunnerSettings) -> Runner:
        made.append(BasicLevelRunner(path, promote=settings.promote))
        return made[-1]

    monkeypatch.setattr(registry, "_RUNTIMES", dict(registry._RUNTIMES))
    register_runtime(RuntimeEntry(NAME, "ONNX Runtime (basic)", "microsoft/onnxruntime",
                                  make, _refuse_precision))
    return made


@pytest.fixture(scope="module")
def planted(tmp_path_factory, fixture_case):
    model, inputs, path = fixture_case("resnet_like")
    target = tmp_path_factory.mktemp("planted") / "planted.onnx"
    node, _ = plant(path, target, scale_conv_weight("layer1.bn2", 1.5))
    return model, inputs, path, target, node


def test_the_pytorch_form_runs_in_a_registered_runtime(basic_runtime, planted):
    model, inputs, _, target, node = planted
    report = bisect_onnx.bisect(model, inputs, onnx_model=target,
                                runtime=bisect_onnx.RuntimeOptions(runtime=NAME))
    assert report.culprit is not None and report.culprit.onnx_node == node
    assert report.environment["runtime"] == NAME
    assert report.environment["opt_level"] == "basic"  # the runner's, not the options'
    assert basic_runtime and all(isinstance(runner, BasicLevelRunner) for runner in basic_runtime)
    assert basic_runtime[0].runs >= 1
    assert report.to_dict()["culprit"]["node"]["ran_in"]["runtime"] == NAME


def test_onnx_against_onnx_runs_the_candidate_in_a_registered_runtime(basic_runtime, planted):
    _, inputs, path, target, node = planted
    report = bisect_onnx.bisect_onnx_models(
        path, target, inputs, candidate_runtime=bisect_onnx.RuntimeOptions(runtime=NAME))
    assert report.culprit is not None and report.culprit.onnx_node == node
    assert report.environment["runtime"] == NAME
    assert report.environment["reference_runtime"] == "onnxruntime"
    clean = bisect_onnx.bisect_onnx_models(
        path, None, inputs, candidate_runtime=bisect_onnx.RuntimeOptions(runtime=NAME))
    assert not clean.diverged  # the same file at another level: parity


def test_the_command_line_offers_a_registered_runtime(basic_runtime, planted, tmp_path):
    fixture = FIXTURES["resnet_like"]
    out = tmp_path / "report.json"
    status = main([fixture.factory, "--input", str(repo_path(fixture.input_file)),
                   "--onnx", str(planted[3]), "--runtime", NAME, "--json", str(out), "-q"])
    assert status == 1
    assert json.loads(out.read_text())["environment"]["runtime"] == NAME


def test_a_registered_runtime_checks_its_settings_before_anything_runs(basic_runtime):
    with pytest.raises(bisect_onnx.UsageError, match="ort-basic takes no precision"):
        bisect_onnx.RuntimeOptions(runtime=NAME, precision="f32")
    with pytest.raises(bisect_onnx.UsageError, match="unknown runtime 'tensorrt'; choose one "
                       "of onnxruntime, openvino, ort-basic"):
        bisect_onnx.RuntimeOptions(runtime="tensorrt")


def test_a_run_returns_its_production_check_and_writes_nothing_on_the_runner(planted):
    _, inputs, path, _, _ = planted
    runner = OnnxRuntimeRunner(path)
    before = set(vars(runner))
    first = runner.run(list(inputs.values()))
    assert isinstance(first, RuntimeRun) and isinstance(first.production, ProductionCheck)
    # At level all the capture runs without the NCHWc layout (another rounding): the
    # check says by how much its outputs differ from production's own run.
    production = runner.run_outputs(list(inputs.values()))
    assert first.production.outputs is not None
    for given, theirs in zip(first.production.outputs, production, strict=True):
        assert np.array_equal(given, theirs.array)  # production's outputs, handed back
    largest = max(float(np.max(np.abs(ours.array.astype(np.float64) - theirs.array)))
                  for ours, theirs in zip(first.capture.outputs, production, strict=True))
    assert first.production.matches is (largest == 0)
    assert first.production.difference == (None if largest == 0 else largest)
    # Only the runner's own caches (the plan, sessions, the profile's kernels) are new,
    # and nothing of a run is left on it for another module to read.
    assert set(vars(runner)) == before
    for name in ("production_outputs", "outputs_match_production", "production_difference",
                 "production_check"):
        assert not hasattr(runner, name), name
    second = runner.run(list(inputs.values()))
    assert second.production is not first.production  # each run's own check
    described = runner.describe_capture(first.production)
    assert described["outputs_match_production"] is first.production.matches
    assert described["production_check"] == first.production.how


def test_every_runner_implements_the_whole_interface():
    from bisect_onnx.runtime.openvino.runner import OpenVinoRunner
    from bisect_onnx.runtime.reference_evaluator.runner import ReferenceEvaluatorRunner

    for runner in (OnnxRuntimeRunner, OpenVinoRunner, ReferenceEvaluatorRunner):
        assert issubclass(runner, Runner)
        assert not runner.__abstractmethods__, runner
        assert runner.runtime
