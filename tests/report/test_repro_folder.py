"""A ``--repro-dir`` holding the user's files: refused before the run, never written over.

A repro writes ``repro.py``, ``README.txt``, ``model.onnx``, ``backend_test/`` and more
into its folder. Where the folder holds one of those names and no earlier repro wrote
it, the files are the user's: the run is refused in one line and they stay as they were.
An earlier repro's folder is written over, as running again means to.
"""

from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest

import bisect_onnx
from bisect_onnx.cli.command import main
from bisect_onnx.errors import UsageError
from bisect_onnx.report.repro import check_repro_dir
from tests.test_nothing_lost import digest, one_line_error, scale_model

USERS = "print('the user's own script')\n"


@pytest.fixture
def two_files(tmp_path, monkeypatch):
    """Two ONNX files that differ (x * 2 against x * 3), and an input; the run starts there."""
    onnx.save(scale_model(2.0), str(tmp_path / "ref.onnx"))
    onnx.save(scale_model(3.0), str(tmp_path / "m.onnx"))
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _argv(folder: str) -> list[str]:
    return ["ref.onnx", "--against", "m.onnx", "--input", "x.npy", "--repro-dir", folder]


@pytest.mark.parametrize("name", ["repro.py", "README.txt", "model.onnx", "backend_test"])
def test_a_folder_holding_the_users_file_is_refused_before_the_run(two_files, capsys, name):
    out = two_files / "out"
    out.mkdir()
    mine = out / name
    if name == "backend_test":
        mine.mkdir()
        mine = mine / "notes.txt"
    mine.write_text(USERS)
    seen = []
    with bisect_onnx.events.listening(seen.append):
        status = main(_argv("out"))
    line = one_line_error(capsys)
    assert status == 2, line
    assert f"--repro-dir out holds {name}" in line and "new or empty folder" in line
    assert mine.read_text() == USERS
    assert not seen  # refused before anything ran


def test_an_earlier_repro_is_written_over(two_files, capsys):
    assert main(_argv("out")) == 1
    first = json.loads((two_files / "out" / "environment.json").read_text())
    (two_files / "out" / "repro.py").write_text("stale\n")
    assert main(_argv("out")) == 1
    capsys.readouterr()
    assert json.loads((two_files / "out" / "environment.json").read_text())["repro"] \
        == first["repro"]
    assert (two_files / "out" / "repro.py").read_text() != "stale\n"


def test_a_link_among_the_repro_names_is_never_written_through(two_files, capsys):
    assert main(_argv("out")) == 1  # an earlier repro: its folder may be written over
    capsys.readouterr()
    target = two_files / "mine.py"
    target.write_text(USERS)
    (two_files / "out" / "repro.py").unlink()
    os.symlink(target, two_files / "out" / "repro.py")
    before = digest(target)
    status = main(_argv("out"))
    line = one_line_error(capsys)
    assert status == 2 and "repro.py" in line and "through a link" in line
    assert digest(target) == before


def test_other_files_in_the_folder_are_left_alone(two_files, capsys):
    out = two_files / "out"
    out.mkdir()
    (out / "notes.md").write_text(USERS)
    assert main(_argv("out")) == 1
    capsys.readouterr()
    assert (out / "notes.md").read_text() == USERS
    assert (out / "repro.py").is_file()


def test_random_samples_check_their_own_folders_only(tmp_path):
    (tmp_path / "repro.py").write_text(USERS)  # the top folder is not written per sample
    check_repro_dir(tmp_path, per_sample=True)
    (tmp_path / "sample-2").mkdir()
    (tmp_path / "sample-2" / "inputs.npz").write_bytes(b"mine")
    with pytest.raises(UsageError, match="sample-2 holds inputs.npz"):
        check_repro_dir(tmp_path, per_sample=True)
    with pytest.raises(UsageError, match="holds repro.py"):
        check_repro_dir(tmp_path, per_sample=False)


def test_a_file_named_as_a_samples_folder_is_refused(tmp_path):
    (tmp_path / "sample-1").write_text(USERS)
    with pytest.raises(UsageError, match="holds sample-1, which is not a folder"):
        check_repro_dir(tmp_path, per_sample=True)
    assert (tmp_path / "sample-1").read_text() == USERS


def test_a_repro_cut_short_is_still_known_as_one(two_files, capsys):
    assert main(_argv("out")) == 1
    capsys.readouterr()
    out = two_files / "out"
    # Cut short before its last files: the marker, written first, is there.
    for name in ("environment.json", "repro.py", "README.txt"):
        (out / name).unlink()
    check_repro_dir(out, per_sample=False)
    assert main(_argv("out")) == 1
    capsys.readouterr()
    assert (out / "environment.json").is_file()


def test_the_command_says_where_the_repro_went(two_files, capsys):
    assert main(_argv("out")) == 1
    printed = capsys.readouterr().out
    assert "repro: out (1 node(s); `python repro.py` there exits 1" in printed

