"""assert_parity (and the pytest plugin) against a reference recorded elsewhere."""

from __future__ import annotations

import pytest

import bisect_onnx
from bisect_onnx.pipeline import parity

pytestmark = pytest.mark.filterwarnings("ignore::bisect_onnx.BisectOnnxWarning")


def test_parity_holds_with_one_run_of_the_outputs(fixture_case, tmp_path, monkeypatch):
    model, inputs, onnx_path = fixture_case("tiny_mlp")
    reference = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                   onnx_model=onnx_path)
    monkeypatch.setattr(parity, "check", lambda *args, **kwargs: pytest.fail("bisected"))
    bisect_onnx.assert_parity(reference, None)
    bisect_onnx.assert_parity(bisect_onnx.Reference.load(reference), inputs, onnx_path)


def test_broken_parity_raises_with_the_check_and_its_artifacts(fixture_case, tmp_path):
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    reference = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                   onnx_model=onnx_path)
    output = bisect_onnx.OutputOptions(repro_dir=tmp_path / "artifacts", label="pool")
    with pytest.raises(bisect_onnx.ParityError, match="ONNX parity of pool broke") as raised:
        bisect_onnx.assert_parity(reference, None, output=output)
    assert raised.value.report.culprit.onnx_node == "node_avg_pool2d"
    assert raised.value.report.culprit.torch_module == "pool"
    assert (tmp_path / "artifacts" / "pool.json").exists()
    assert (tmp_path / "artifacts" / "pool.repro" / "repro.py").exists()


def test_the_pytest_fixture_takes_a_reference(fixture_case, tmp_path, onnx_parity):
    model, inputs, onnx_path = fixture_case("tiny_mlp")
    reference = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                   onnx_model=onnx_path)
    onnx_parity(str(reference), None)  # at parity: passes
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    diverging = bisect_onnx.record(model, inputs, path=tmp_path / "pool.npz",
                                   onnx_model=onnx_path)
    with pytest.raises(bisect_onnx.ParityError) as raised:
        onnx_parity(str(diverging), None)
    assert raised.value.report.culprit.torch_module == "pool"
    # Without PyTorch the advice sends the searches that need it to where it runs.
    assert "where PyTorch runs (the recorded command)" in raised.value.report.summary()


def test_a_deployment_runtime_is_held_to_the_reference(fixture_case, tmp_path):
    pytest.importorskip("openvino")
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    reference = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                   onnx_model=onnx_path)
    with pytest.raises(bisect_onnx.ParityError) as raised:
        bisect_onnx.assert_parity(reference, None,
                                  runtime=bisect_onnx.RuntimeOptions(runtime="openvino"))
    assert raised.value.report.environment["runtime"] == "openvino"
