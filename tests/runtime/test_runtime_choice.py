"""``--runtime``: ONNX Runtime by default, OpenVINO refused in one line where it is missing."""

from __future__ import annotations

import sys

import pytest

import bisect_onnx
from bisect_onnx.cli.command import main
from bisect_onnx.cli.parser import build_parser
from bisect_onnx.errors import UsageError
from fixtures.registry import FIXTURES, REPO_ROOT

MLP = FIXTURES["tiny_mlp"]


def _one_line_error(capsys, status: int) -> str:
    captured = capsys.readouterr()
    assert status == 2, captured.err
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


@pytest.mark.parametrize("argv", [
    [MLP.factory, "--input", MLP.input_file, "--onnx", MLP.onnx_file, "--runtime", "openvino"],
    [MLP.onnx_file, "--against", MLP.onnx_file, "--against-runtime", "openvino"],
], ids=["pytorch form", "onnx against onnx"])
def test_without_openvino_the_runtime_is_refused_with_the_install_line(argv, capsys,
                                                                        monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    # None in sys.modules makes ``import openvino`` raise ImportError, as when absent.
    monkeypatch.setitem(sys.modules, "openvino", None)
    line = _one_line_error(capsys, main(argv))
    assert "pip install bisect-onnx[openvino]" in line


def test_onnxruntime_is_the_default_and_unknown_names_are_refused():
    assert bisect_onnx.RuntimeOptions().runtime == "onnxruntime"
    with pytest.raises(UsageError, match="choose one of onnxruntime, openvino"):
        bisect_onnx.RuntimeOptions(runtime="tensorrt")
    with pytest.raises(UsageError, match="applies to runtime openvino"):
        bisect_onnx.RuntimeOptions(precision="bf16")
    with pytest.raises(UsageError, match="choose one of f32, f16, bf16"):
        bisect_onnx.RuntimeOptions(runtime="openvino", precision="int8")


def test_the_command_line_builds_the_runtime_options():
    pytest.importorskip("openvino", reason="openvino is not importable here")
    args = build_parser().parse_args(["m.onnx", "--runtime", "openvino", "--ov-precision",
                                      "f32"])
    assert bisect_onnx.RuntimeOptions.from_args(args) == bisect_onnx.RuntimeOptions(
        runtime="openvino", precision="f32")
    with pytest.raises(UsageError, match=r"^opt_level \(--opt-level\) is ONNX Runtime's"):
        bisect_onnx.RuntimeOptions(runtime="openvino", opt_level="basic")
    # A provider this onnxruntime lacks is still ONNX Runtime's option, not its absence.
    for provider in ("CUDAExecutionProvider", "NoSuchProvider"):
        with pytest.raises(UsageError, match=r"^provider \(--provider\) is ONNX Runtime's.*"
                                             "drop it"):
            bisect_onnx.RuntimeOptions(runtime="openvino", provider=provider)
    with pytest.raises(UsageError, match="and opt_level .* are ONNX Runtime's.*drop them"):
        bisect_onnx.RuntimeOptions(runtime="openvino", provider="X", opt_level="basic")
