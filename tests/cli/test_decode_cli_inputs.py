"""The decode form's prompt file and the options each form would ignore: one line, exit 2.

All refused before any model is loaded, so none of these needs ``transformers``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from bisect_onnx.cli.command import main
from fixtures.registry import FIXTURES, REPO_ROOT

MLP = FIXTURES["tiny_mlp"]
LLAMA = ["decoders.py:tiny_llama", "--steps", "1"]


def one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bisect-onnx: error: "), captured.err
    return lines[0]


def test_an_empty_prompt_file_is_one_line_exit_2(user_files, capsys):
    (user_files / "empty.npy").write_bytes(b"")
    assert main([*LLAMA, "--input", "empty.npy"]) == 2
    assert "input file empty.npy is empty (0 bytes); pass token ids saved with numpy.save" \
        in one_line_error(capsys)


@pytest.mark.parametrize("name, reason", [("missing.npy", "does not exist"),
                                          ("folder.npy", "is a folder")])
def test_a_prompt_path_that_is_no_file_is_one_line_exit_2(user_files, capsys, name, reason):
    (user_files / "folder.npy").mkdir()
    assert main([*LLAMA, "--input", name]) == 2
    assert f"input file {name} {reason}" in one_line_error(capsys)


def test_an_npz_named_npy_is_not_taken_for_a_prompt(user_files, capsys):
    np.savez(user_files / "ids.npz", ids=np.array([[5, 17]]))
    (user_files / "ids.npz").rename(user_files / "ids.npy")
    assert main([*LLAMA, "--input", "ids.npy"]) == 2
    assert "input file ids.npy is not .npy data; pass token ids saved with numpy.save" \
        in one_line_error(capsys)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_prompt_is_refused_rather_than_read(user_files):
    os.mkfifo(user_files / "fifo.npy")  # reading it would wait for a writer forever
    result = subprocess.run([sys.executable, "-m", "bisect_onnx", *LLAMA, "--input",
                             "fifo.npy"], cwd=user_files, capture_output=True, text=True,
                            timeout=60, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 2, result.stderr
    assert "input file fifo.npy is not a regular file (a FIFO)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("options, named", [
    (["--prompt-length", "4"], "--prompt-length applies"),
    (["--prompt-length", "8"], "--prompt-length applies"),  # its default, given: seen too
    (["--seed", "3"], "--seed applies"),
    (["--seed", "0"], "--seed applies"),  # its default, given: still ignored beside --input
    (["--seed", "3", "--prompt-length", "4"], "--prompt-length, --seed apply")])
def test_random_prompt_options_beside_a_prompt_file_are_refused(user_files, capsys, options,
                                                                 named):
    assert main([*LLAMA, "--input", "prompt.npy", *options]) == 2
    line = one_line_error(capsys)
    assert f"{named} to the random prompt drawn without --input; drop" in line
    assert "or drop --input to draw one" in line


@pytest.mark.parametrize("options, named", [
    (["--prompt-length", "4"], "--prompt-length applies"),
    (["--cache-shape", "2,4,8"], "--cache-shape applies"),
    (["--cache-name", "logits=out"], "--cache-name applies"),
    (["--prompt-length", "4", "--cache-shape", "2,4,8"], "--prompt-length, --cache-shape apply")])
def test_decode_options_without_steps_are_refused(capsys, monkeypatch, options, named):
    monkeypatch.chdir(REPO_ROOT)
    assert main([MLP.factory, "--input", MLP.input_file, *options]) == 2
    line = one_line_error(capsys)
    assert f"{named} to a decode run; add --steps N, or drop" in line


def test_against_without_steps_refuses_decode_options_too(capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    assert main([MLP.onnx_file, "--against", MLP.onnx_file, "--cache-shape", "1,1,1"]) == 2
    assert "--cache-shape applies to a decode run" in one_line_error(capsys)


def test_seed_without_steps_still_seeds_one_forward_random_inputs(capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    assert main([MLP.factory, "--onnx", MLP.onnx_file, "--seed", "3", "-q"]) == 0
    assert capsys.readouterr().out.startswith("PARITY")


@pytest.mark.parametrize(("ids", "problem"), [
    (np.array([0.5, 1.0]), "must be token ids, [sequence] or [batch, sequence] integers, got "
                           "float64"),
    (np.zeros((1, 2, 3), dtype=np.int64), "got int64 of shape [1, 2, 3]"),
    (np.zeros(0, dtype=np.int64), "the prompt is empty (shape [1, 0], no token ids)"),
    (np.zeros((0, 3), dtype=np.int64), "the prompt is empty (shape [0, 3], no token ids)"),
])
def test_a_prompt_that_is_not_token_ids_is_refused_before_the_model_is_built(
        user_files, capsys, ids, problem):
    np.save(user_files / "ids.npy", ids)
    # The file has no such factory: the prompt is refused before the model is looked up.
    assert main(["decoders.py:no_such_factory", "--steps", "1", "--input", "ids.npy"]) == 2
    assert problem in one_line_error(capsys)


def test_a_prompt_file_claiming_more_than_it_holds_is_refused_from_its_header(user_files,
                                                                              capsys):
    # Read as one forward reads an input: the header against the file, before numpy.
    with open("huge.npy", "wb") as stream:
        np.lib.format.write_array_header_1_0(
            stream, {"descr": "<i8", "fortran_order": False, "shape": (1, 2**40)})
        stream.write(np.zeros(4, np.int64).tobytes())
    assert main([*LLAMA, "--input", "huge.npy"]) == 2
    line = one_line_error(capsys)
    assert "huge.npy" in line
