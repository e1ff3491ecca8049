"""``bisect-onnx check REF``: its refusals in the command line's words, not the API's."""

from __future__ import annotations

import pytest

import bisect_onnx
from bisect_onnx.cli.command import main

pytestmark = pytest.mark.filterwarnings("ignore::bisect_onnx.BisectOnnxWarning")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, fixture_case):
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    folder = tmp_path_factory.mktemp("recorded")
    return bisect_onnx.record(model, inputs, path=folder / "ref.npz", onnx_model=onnx_path)


@pytest.mark.parametrize("options, said", [
    (["--onnx", "missing.onnx"], "--onnx file missing.onnx does not exist"),
    (["--sweep"], "drop --sweep"),
    (["--granularity", "op"], "--granularity is the recording's; drop it"),
])
def test_refusals_name_the_option_given(reference, tmp_path, monkeypatch, capsys, options,
                                        said):
    monkeypatch.chdir(tmp_path)
    assert main(["check", str(reference), *options]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1
