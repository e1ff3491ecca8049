"""The command line: exit statuses, output, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bisect_onnx.cli.command import main
from fixtures.registry import FIXTURES, REPO_ROOT

MLP = FIXTURES["tiny_mlp"]
POOL = FIXTURES["avgpool_divisor"]


def cli(*args: str) -> subprocess.CompletedProcess:
    """Run the real command in a fresh process, as a user would."""
    return subprocess.run([sys.executable, "-m", "bisect_onnx", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)


def test_module_entry_point_reports_parity_with_exit_0():
    result = cli(MLP.factory, "--input", MLP.input_file, "--onnx", MLP.onnx_file)
    assert result.returncode == 0, result.stderr
    assert "PARITY" in result.stdout
    assert "fc2" in result.stdout


def test_divergence_exits_1_with_marked_row_and_json(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    report_path = tmp_path / "report.json"
    status = main([POOL.factory, "--input", POOL.input_file, "--onnx", POOL.onnx_file,
                   "--json", str(report_path)])
    out = capsys.readouterr().out
    assert status == 1
    marked = [line for line in out.splitlines() if line.startswith(">>")]
    assert marked and "pool" in marked[0] and "AveragePool" in marked[0]
    verdict = out[out.rindex("DIVERGED"):].splitlines()[0]  # the verdict's headline
    assert verdict.startswith("DIVERGED") and "module pool" in verdict
    assert "fixtures/models.py:" in verdict
    assert json.loads(report_path.read_text())["first_divergence"]["torch_module"] == "pool"


def test_export_by_the_tool_and_save_onnx(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    saved = tmp_path / "export.onnx"
    status = main([MLP.factory, "--input", MLP.input_file, "--save-onnx", str(saved)])
    assert status == 0
    assert saved.is_file()
    assert "PARITY" in capsys.readouterr().out


def _write(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    return str(path)


def _object_array(tmp_path):
    path = tmp_path / "objects.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return str(path)


def _npz(tmp_path, name, **arrays):
    path = tmp_path / name
    np.savez(path, **arrays)
    return str(path)


BAD_INPUTS = {
    "missing model file": lambda t: ["nope/model.py:make", "--input", MLP.input_file],
    "missing factory": lambda t: ["fixtures/models.py:no_such_factory", "--input",
                                  MLP.input_file],
    "saved model file": lambda t: ["model.pt", "--input", MLP.input_file],
    "missing input": lambda t: [MLP.factory, "--input", "nope.npy"],
    "input is a folder": lambda t: [MLP.factory, "--input", str(t)],
    "empty input": lambda t: [MLP.factory, "--input", _write(t, "empty.npy", b"")],
    "object array": lambda t: [MLP.factory, "--input", _object_array(t)],
    "wrong shape": lambda t: [MLP.factory, "--input", POOL.input_file, "--onnx", MLP.onnx_file],
    "npz member of the wrong shape": lambda t: [
        MLP.factory, "--input", _npz(t, "wrong.npz", x=np.zeros((3, 16, 5), np.float32)),
        "--onnx", MLP.onnx_file],
    "wrong count": lambda t: [MLP.factory, "--input", MLP.input_file, "--input",
                              MLP.input_file, "--onnx", MLP.onnx_file],
    "wrong count, exporting": lambda t: [MLP.factory, "--input", MLP.input_file, "--input",
                                         MLP.input_file],
    "corrupt onnx": lambda t: [MLP.factory, "--input", MLP.input_file, "--onnx",
                               _write(t, "bad.onnx", b"\x08\x07garbage" * 50)],
    "truncated onnx": lambda t: [MLP.factory, "--input", MLP.input_file, "--onnx",
                                 _write(t, "cut.onnx",
                                        (REPO_ROOT / MLP.onnx_file).read_bytes()[:3000])],
    "missing onnx": lambda t: [MLP.factory, "--input", MLP.input_file, "--onnx", "nope.onnx"],
    "negative tolerance": lambda t: [MLP.factory, "--input", MLP.input_file, "--rtol", "-1"],
    "opset with onnx": lambda t: [MLP.factory, "--input", MLP.input_file, "--onnx",
                                  MLP.onnx_file, "--opset", "17"],
    "unknown option": lambda t: [MLP.factory, "--frobnicate"],
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_changes_nothing(case, tmp_path, capsys, monkeypatch,
                                                          fixtures_untouched):
    monkeypatch.chdir(REPO_ROOT)
    with pytest.raises(SystemExit) if case == "unknown option" else _no_exit() as raised:
        status = main(BAD_INPUTS[case](tmp_path))
    if case == "unknown option":
        status = raised.value.code
    captured = capsys.readouterr()
    assert status == 2, captured.err
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("bisect-onnx: error: ")
    assert "Traceback" not in captured.err


@pytest.mark.parametrize("onnx", [[], ["--onnx", MLP.onnx_file]], ids=["exporting", "--onnx"])
def test_float64_input_for_a_float32_model_is_exit_2_with_the_astype_hint(onnx, tmp_path,
                                                                         capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    path = tmp_path / "x.npy"
    np.save(path, np.load(REPO_ROOT / MLP.input_file).astype(np.float64))
    status = main([MLP.factory, "--input", str(path), *onnx])
    err = capsys.readouterr().err
    assert status == 2, err
    assert ".astype" in err and "float64" in err and "float32" in err
    assert err.count("\n") == 1


def test_a_model_that_casts_its_float64_input_is_not_refused(tmp_path):
    import torch

    from bisect_onnx import bisect

    class Casts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(x.float())

    report = bisect(Casts().eval(), [np.ones((1, 4), np.float64)])
    assert not report.diverged


def test_a_state_dict_as_input_is_described_as_the_model_s_weights(tmp_path, capsys,
                                                                    monkeypatch):
    import torch

    from fixtures.registry import build_model

    monkeypatch.chdir(REPO_ROOT)
    path = tmp_path / "weights.pt"
    torch.save(build_model(MLP).state_dict(), path)
    status = main([MLP.factory, "--input", str(path)])
    err = capsys.readouterr().err
    assert status == 2, err
    assert "the model's weights (a state_dict)" in err and "forward takes (x)" in err
    assert ".npz keys" not in err


def test_bad_input_in_a_real_process_has_no_traceback(tmp_path):
    result = cli(MLP.factory, "--input", MLP.input_file, "--onnx",
                 _write(tmp_path, "bad.onnx", b"not an onnx file"))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "not a readable ONNX model" in result.stderr


def _run_one_op_model(tmp_path, monkeypatch, capsys, forward_body: str) -> tuple[int, str]:
    """Run the CLI on a one-line model written into ``tmp_path``; return status and stderr."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "one_op.py").write_text(
        "import torch\n"
        "class OneOp(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        f"        {forward_body}\n"
        "def make():\n"
        "    return OneOp()\n"
    )
    np.save(tmp_path / "x.npy", np.ones((3, 3), dtype=np.float32))
    status = main(["one_op.py:make", "--input", "x.npy"])
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    return status, err


def test_model_that_cannot_run_exits_3(tmp_path, capsys, monkeypatch):
    status, err = _run_one_op_model(tmp_path, monkeypatch, capsys,
                                    "raise RuntimeError('this model is broken')")
    assert status == 3
    assert "this model is broken" in err


def test_export_failure_exits_3_with_the_exporters_reason(tmp_path, capsys, monkeypatch):
    # Eager PyTorch runs this fine; the ONNX translation has no histc.
    status, err = _run_one_op_model(tmp_path, monkeypatch, capsys,
                                    "return torch.histc(x, bins=4)")
    assert status == 3
    assert "could not export OneOp" in err
    assert "histc" in err
    assert "\x1b[" not in err


class _no_exit:
    """A stand-in for ``pytest.raises`` when no exception is expected."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_no_temporary_folder_is_left_behind(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    assert main([MLP.factory, "--input", MLP.input_file]) == 0
    assert os.listdir(tmp_path) == []



def test_a_report_path_in_a_missing_folder_is_refused_before_the_run(tmp_path, capsys):
    from fixtures.registry import FIXTURES, repo_path

    fixture = FIXTURES["tiny_mlp"]
    status = main([fixture.factory, "--input", str(repo_path(fixture.input_file)),
                   "--html", str(tmp_path / "missing" / "report.html")])
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""  # refused before anything ran
    assert "does not exist" in captured.err and len(captured.err.strip().splitlines()) == 1


def test_quiet_prints_the_verdict_alone_with_a_sweep(tmp_path, capsys):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    np.save(tmp_path / "x.npy", np.ones((2, 3), dtype=np.float32))
    (tmp_path / "copy.onnx").write_bytes(path.read_bytes())  # (the same file is refused)
    status = main([str(path), "--against", str(tmp_path / "copy.onnx"), "--input",
                   str(tmp_path / "x.npy"), "--sweep", "-q"])
    out = capsys.readouterr().out
    assert status == 0
    assert out.startswith("PARITY") and "sweep (final outputs only" not in out
