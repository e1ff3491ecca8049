"""``--suggest-fix`` / ``--write-fixed`` on the command line: refusals are one line, exit 2."""

from __future__ import annotations

import pytest

from bisect_onnx.cli.command import main
from fixtures.registry import FIXTURES, REPO_ROOT

MLP = FIXTURES["tiny_mlp"]

REFUSED = {
    "onto the input": lambda t: [MLP.factory, "--input", MLP.input_file, "--onnx", MLP.onnx_file,
                                 "--write-fixed", MLP.input_file],
    "onto the onnx": lambda t: [MLP.factory, "--onnx", MLP.onnx_file,
                                "--write-fixed", MLP.onnx_file],
    "missing folder": lambda t: [MLP.factory, "--onnx", MLP.onnx_file,
                                 "--write-fixed", str(t / "absent" / "fixed.onnx")],
    "onnx against onnx": lambda t: [MLP.onnx_file, "--against", MLP.onnx_file, "--suggest-fix"],
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_write_fixed_is_one_line_exit_2(case, tmp_path, capsys, monkeypatch,
                                                fixtures_untouched):
    monkeypatch.chdir(REPO_ROOT)
    status = main(REFUSED[case](tmp_path))
    captured = capsys.readouterr()
    assert status == 2, captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("bisect-onnx: error: ")
    assert not (tmp_path / "absent").exists()


def test_write_fixed_implies_suggest_fix():
    from bisect_onnx.cli.parser import build_parser
    from bisect_onnx.pipeline.options import FixOptions

    args = build_parser().parse_args([MLP.factory, "--write-fixed", "out.onnx"])
    options = FixOptions.from_args(args)
    assert options.suggest and str(options.write_fixed) == "out.onnx"


def test_suggest_fix_runs_in_the_pytorch_form(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    status = main([MLP.factory, "--onnx", MLP.onnx_file, "--suggest-fix",
                   "--write-fixed", str(tmp_path / "fixed.onnx")])
    assert status == 0, capsys.readouterr().err
    assert not (tmp_path / "fixed.onnx").exists()  # parity: nothing to fix, nothing written
