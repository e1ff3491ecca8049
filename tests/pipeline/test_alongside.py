"""Work alongside a block: done when the block ends, its error raised there."""

from __future__ import annotations

import threading

import pytest

from bisect_onnx.pipeline.alongside import alongside


def test_the_work_runs_in_another_thread_and_is_done_when_the_block_ends():
    started, release, seen = threading.Event(), threading.Event(), []

    def work():
        started.set()
        release.wait(5)
        seen.append(threading.current_thread() is not threading.main_thread())

    with alongside(work, name="test"):
        assert started.wait(5)  # it runs while the block does
        assert not seen
        release.set()
    assert seen == [True]


def test_its_error_is_raised_when_the_block_ends_and_unwanted_work_never_runs():
    def broken():
        raise ValueError("broken plan")

    with pytest.raises(ValueError, match="broken plan"), alongside(broken, name="test"):
        pass
    ran = []
    with alongside(lambda: ran.append(1), name="test", wanted=False):
        pass
    assert ran == []
