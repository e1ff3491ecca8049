"""A check where torch cannot be imported: the culprit the run in one process names.

The interpreter that checks makes ``torch`` and ``onnxscript`` unimportable before
bisect-onnx is imported (``.ci/run`` also checks from a second environment that does
not have them installed at all).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import bisect_onnx
from fixtures.registry import FIXTURES, REPO_ROOT
from tests.planting import plant, scale_conv_weight

pytestmark = pytest.mark.filterwarnings("ignore::bisect_onnx.BisectOnnxWarning")

WORKTREE = REPO_ROOT
_WITHOUT_TORCH = ("import sys; sys.modules.update(torch=None, onnxscript=None); "
                  "from bisect_onnx.cli.command import main; "
                  "status = main(sys.argv[1:]); "
                  "assert 'torch' not in sys.modules or sys.modules['torch'] is None; "
                  "sys.exit(status)")


def without_torch(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(WORKTREE)}
    return subprocess.run([sys.executable, "-c", _WITHOUT_TORCH, *args], cwd=WORKTREE,
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("plant_id", [None, "conv-weight"])
def test_recorded_here_checked_where_torch_is_not(fixture_case, tmp_path, plant_id):
    model, inputs, onnx_path = fixture_case("resnet_like")
    if plant_id is not None:
        plant(onnx_path, tmp_path / "planted.onnx", scale_conv_weight("layer2.bn1", 1.003))
        onnx_path = tmp_path / "planted.onnx"
    report = bisect_onnx.bisect(model, inputs, onnx_model=onnx_path)
    reference = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                   onnx_model=onnx_path)
    result = without_torch("check", str(reference), "--json", str(tmp_path / "r.json"))
    assert result.returncode == (1 if report.diverged else 0), result.stderr
    checked = json.loads((tmp_path / "r.json").read_text())
    assert checked["verdict"] == report.verdict
    assert (checked["culprit"] or {}).get("onnx_node") == (
        report.culprit.onnx_node if report.culprit else None)


def test_the_pytorch_form_without_torch_names_the_extra():
    fixture = FIXTURES["tiny_mlp"]
    result = without_torch(fixture.factory, "--input", fixture.input_file)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert 'pip install "bisect-onnx[torch]"' in result.stderr


def test_assert_parity_against_a_reference_where_torch_is_not(fixture_case, tmp_path):
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    reference = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                   onnx_model=onnx_path)
    code = ("import sys; sys.modules.update(torch=None, onnxscript=None)\nimport bisect_onnx\n"
            "try:\n    bisect_onnx.assert_parity(sys.argv[1], None)\n"
            "except bisect_onnx.ParityError as error:\n"
            "    print(error.report.culprit.onnx_node, error.report.culprit.torch_module)")
    env = {**os.environ, "PYTHONPATH": str(WORKTREE)}
    result = subprocess.run([sys.executable, "-c", code, str(reference)], cwd=WORKTREE,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.stdout.split() == ["node_avg_pool2d", "pool"], result.stderr
