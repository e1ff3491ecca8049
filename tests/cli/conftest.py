"""What the decode command line's tests share: a user's folder."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from fixtures.registry import REPO_ROOT


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    """A user's folder: a copy of the tiny decoders' factory file and a prompt."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(REPO_ROOT / "fixtures" / "decoders.py", tmp_path / "decoders.py")
    np.save(tmp_path / "prompt.npy", np.array([[5, 17, 42, 3]]))
    return tmp_path
