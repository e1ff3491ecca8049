"""stdout and stderr hold the command's own lines: the libraries' chatter is in -v's log.

Each run is a real process, as a user's: what the exporters print (the TorchScript
exporter's C++ code writes straight to the process's stdout) is only seen there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from fixtures.registry import FIXTURES, REPO_ROOT

MLP = FIXTURES["tiny_mlp"]

# numpy overflows and the model warns in forward, in eager and in the export's trace;
# histc has no TorchScript translation, and that exporter dumps its graph on failing.
MODELS = '''
import warnings

import numpy as np
import torch


class Noisy(torch.nn.Module):
    def forward(self, x):
        np.float32(3e38) * np.float32(10)
        warnings.warn("the model's own warning")
        return x + 1


class Histc(torch.nn.Module):
    def forward(self, x):
        return torch.histc(x, bins=4)


def noisy():
    return Noisy().eval()


def histc():
    return Histc().eval()
'''


def cli(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bisect_onnx", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def own_lines_only(stderr: str) -> bool:
    """Whether every line on stderr is the command's (its log and its errors)."""
    return all(line.startswith("bisect-onnx: ") for line in stderr.splitlines())


@pytest.fixture
def models(tmp_path):
    (tmp_path / "models.py").write_text(MODELS)
    np.save(tmp_path / "x.npy", np.ones((3, 3), dtype=np.float32))
    return tmp_path


def test_a_live_dynamo_export_prints_the_verdict_only():
    result = cli(MLP.factory, "--input", MLP.input_file, "-q")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.splitlines() == [result.stdout.strip()]
    assert result.stdout.startswith("PARITY")


def test_numpy_s_and_the_model_s_warnings_are_logged_not_printed(models):
    # At -v, to see them logged: without it, the log's INFO records are not shown.
    result = cli("models.py:noisy", "--input", "x.npy", "-q", "-v", cwd=models)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("PARITY") and len(result.stdout.splitlines()) == 1
    assert own_lines_only(result.stderr), result.stderr
    assert "RuntimeWarning: overflow encountered" in result.stderr
    assert "UserWarning: the model's own warning" in result.stderr


def test_the_torchscript_exporter_s_graph_dump_is_logged_not_printed(models):
    result = cli("models.py:histc", "--input", "x.npy", "--exporter", "torchscript", "-v",
                 cwd=models)
    assert result.returncode == 3, result.stderr
    assert result.stdout == ""
    assert own_lines_only(result.stderr), result.stderr
    assert "the torchscript exporter printed: Torch IR graph at exception" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("bisect-onnx: error: the torchscript")


def test_onnx_runtime_s_warnings_stay_off_stderr(tmp_path):
    # ONNX Runtime warns, at its default severity, of an initializer no node uses.
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "unused_weight",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=[helper.make_tensor("unused", TensorProto.FLOAT, [1], [1.0])])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    (tmp_path / "copy.onnx").write_bytes(path.read_bytes())  # (the same file is refused)
    result = cli(str(path), "--against", str(tmp_path / "copy.onnx"), "-q", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


@pytest.mark.parametrize("model", ["missing.pt", "missing.py:make"])
def test_a_missing_model_file_is_one_line_before_torch_is_imported(model, tmp_path):
    code = ("import sys\n"
            "from bisect_onnx.cli.command import main\n"
            f"status = main([{model!r}])\n"
            "print(status, 'torch' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=600)
    assert result.stdout.split() == ["2", "False"], result.stderr
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("bisect-onnx: error: ") and "missing" in result.stderr
