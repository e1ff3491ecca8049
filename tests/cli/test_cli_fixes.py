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
    "onto the candidate": lambda t: [MLP.onnx_file, "--against", MLP.onnx_file,
                                     "--write-fixed", MLP.onnx_file],
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


def test_suggest_fix_against_a_bfloat16_candidate_prints_and_writes_the_checked_fix(
        tmp_path, capsys):
    import numpy as np
    import onnx

    import bisect_onnx
    from tests.fixes.precision_models import cancellation_model, to_bfloat16

    reference = cancellation_model()
    onnx.save(reference, tmp_path / "float.onnx")
    onnx.save(to_bfloat16(reference), tmp_path / "bf16.onnx")
    inputs = {"x": np.random.default_rng(0).normal(0, 1, (4, 32)).astype(np.float32)}
    np.savez(tmp_path / "x.npz", **inputs)
    status = main([str(tmp_path / "float.onnx"), "--against", str(tmp_path / "bf16.onnx"),
                   "--input", str(tmp_path / "x.npz"), "--quiet",
                   "--write-fixed", str(tmp_path / "fixed.onnx")])
    out = capsys.readouterr().out
    assert status == 1  # the candidate diverges; the fix is a suggestion, not a pass
    assert "fixes (each applied to a copy and checked by a rerun):" in out
    assert "FIX, reaches parity: " in out
    fixed = onnx.load(tmp_path / "fixed.onnx")
    assert not bisect_onnx.bisect_onnx_models(reference, fixed, inputs).diverged


def test_write_fixed_onto_a_hard_link_of_the_candidate_is_refused(tmp_path, capsys):
    import hashlib
    import os
    import shutil

    candidate = tmp_path / "candidate.onnx"
    shutil.copyfile(REPO_ROOT / MLP.onnx_file, candidate)
    os.link(candidate, tmp_path / "linked.onnx")
    before = hashlib.sha256(candidate.read_bytes()).hexdigest()
    status = main([str(REPO_ROOT / MLP.onnx_file), "--against", str(candidate),
                   "--write-fixed", str(tmp_path / "linked.onnx")])
    err = capsys.readouterr().err
    assert status == 2 and "is one of the input files" in err and err.count("\n") == 1
    assert hashlib.sha256(candidate.read_bytes()).hexdigest() == before
