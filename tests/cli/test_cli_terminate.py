"""SIGTERM (``timeout``, a CI runner's cancel) unwinds the run as Ctrl-C does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bisect_onnx.cli.command import main
from fixtures.registry import FIXTURES, REPO_ROOT

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

# A model whose forward waits, so that the signal lands in the middle of the run
# (in the export, which calls forward), with its temporary folder made.
SLOW_MODEL = """\
import time

import torch


class Slow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        time.sleep(120)
        return self.fc(x)


def slow():
    return Slow()
"""
# One whose forward takes the signal's exception for a failure of its own, as a library
# interrupted mid-import did: the run still ends as terminated, not as an export error.
SWALLOWING_MODEL = SLOW_MODEL.replace(
    "        time.sleep(120)\n",
    "        try:\n"
    "            time.sleep(120)\n"
    "        except BaseException:\n"
    "            raise RuntimeError('interrupted by something')\n")


@pytest.mark.parametrize("source", [SLOW_MODEL, SWALLOWING_MODEL], ids=["slow", "swallowing"])
def test_sigterm_removes_the_temporary_folders_and_exits_143(tmp_path, source):
    assert source.count("sleep") == 1
    (tmp_path / "slow.py").write_text(source)
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen([sys.executable, "-m", "bisect_onnx", "slow.py:slow", "-i",
                                "x.npy"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not _run_folders(temp) and process.poll() is None:
            assert time.monotonic() < deadline, "the run made no temporary folder"
            time.sleep(0.05)
        assert process.poll() is None, process.communicate()
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:  # only on a failure above
            process.kill()
            process.communicate()
    assert process.returncode == 143, err
    assert err.strip().splitlines() == ["bisect-onnx: error: terminated"], err
    assert out == ""
    assert _run_folders(temp) == []


def _run_folders(folder) -> list[str]:
    return sorted(name for name in os.listdir(folder) if name.startswith("bisect-onnx-"))


def test_the_previous_sigterm_handler_is_back_after_main(monkeypatch, capsys):
    monkeypatch.chdir(REPO_ROOT)
    mlp = FIXTURES["tiny_mlp"]

    def before(signum, frame):  # pragma: no cover - never called
        raise AssertionError

    previous = signal.signal(signal.SIGTERM, before)
    try:
        assert main([mlp.factory, "--input", mlp.input_file, "--onnx", mlp.onnx_file,
                     "-q"]) == 0
        assert signal.getsignal(signal.SIGTERM) is before
    finally:
        signal.signal(signal.SIGTERM, previous)
