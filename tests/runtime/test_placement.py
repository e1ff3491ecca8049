"""Where the culprit ran: the kernel and provider from the capture session's profile."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from bisect_onnx.cli.command import main
from bisect_onnx.errors import ModelError
from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner
from fixtures.registry import FIXTURES, repo_path
from tests.planting import plant, scale_conv_weight


def test_a_planted_conv_fused_with_its_relu_names_its_kernel_and_provider(tmp_path, capsys):
    fixture = FIXTURES["resnet_like"]
    planted = tmp_path / "planted.onnx"
    node, _ = plant(repo_path(fixture.onnx_file), planted, scale_conv_weight("layer2.bn1", 1.003))
    before = set(Path(tempfile.gettempdir()).glob("bisect-onnx-profile-*"))
    status = main([fixture.factory, "--input", str(repo_path(fixture.input_file)),
                   "--onnx", str(planted), "--opt-level", "extended",
                   "--json", str(tmp_path / "report.json")])
    report = json.loads((tmp_path / "report.json").read_text())
    assert status == 1 and report["culprit"]["onnx_node"] == node
    ran_in = report["culprit"]["node"]["ran_in"]
    assert ran_in["runtime"] == "onnxruntime"
    assert ran_in["provider"] == "CPUExecutionProvider"
    kernel = ran_in["kernel"]
    # ORT fused the Conv with the ReLU after it: the Conv's value is inside the kernel.
    assert kernel["op_type"] == "FusedConv" and kernel["fused"] is True
    assert kernel["output"] != report["culprit"]["onnx_value"]
    assert (f"computed inside ONNX Runtime's kernel {kernel['name']!r} (FusedConv"
            in capsys.readouterr().out)
    # The profile went with its folder.
    assert set(Path(tempfile.gettempdir()).glob("bisect-onnx-profile-*")) <= before


def test_a_capture_session_that_cannot_be_made_leaves_no_profile_folder(tmp_path, monkeypatch):
    made = onnxruntime.InferenceSession

    def refuse_profiled(model, options=None, *args, **kwargs):
        if options is not None and options.enable_profiling:  # the capture session alone
            raise RuntimeError("out of memory")
        return made(model, options, *args, **kwargs)

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(onnxruntime, "InferenceSession", refuse_profiled)
    fixture = FIXTURES["resnet_like"]
    runner = OnnxRuntimeRunner(repo_path(fixture.onnx_file))
    with pytest.raises(ModelError, match="out of memory"):
        runner.run([np.load(repo_path(fixture.input_file))])
    assert not list(tmp_path.glob("bisect-onnx-profile-*"))
