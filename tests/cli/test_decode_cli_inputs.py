"""The decode form's prompt file, refused as the one-forward form's: one line, exit 2.

All refused before any model is loaded, so none of these needs ``transformers``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from bisect_onnx.cli.command import main
from fixtures.registry import REPO_ROOT

LLAMA = ["decoders.py:tiny_llama", "--steps", "1"]


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    """A user's folder: a copy of the tiny decoders' factory file and a prompt."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(REPO_ROOT / "fixtures" / "decoders.py", tmp_path / "decoders.py")
    np.save(tmp_path / "prompt.npy", np.array([[5, 17, 42, 3]]))
    return tmp_path


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
