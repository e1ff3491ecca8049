"""In Python, the exporters' chatter during bisect-onnx's calls is in its log; nothing else is.

A program using the library keeps its own output: its warnings before and after a
call reach it as ever, the warning filters and the process's stdout and stderr are as
they were, and the exporter's output (C++ output included) is in bisect-onnx's log.
"""

from __future__ import annotations

import logging
import os
import warnings

import numpy as np
import pytest
import torch

from bisect_onnx.errors import ModelError
from bisect_onnx.pytorch.exporting import export_model


class Histc(torch.nn.Module):
    """No TorchScript translation: that exporter dumps its graph as it fails."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.histc(x, bins=4)


class Warns(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        warnings.warn("the model's own warning", stacklevel=1)
        return x + 1


def test_the_torchscript_exporter_s_dump_is_logged_and_the_terminal_restored(
        tmp_path, capfd, caplog):
    filters = list(warnings.filters)
    with caplog.at_level(logging.INFO, logger="bisect_onnx"), pytest.raises(ModelError):
        export_model(Histc(), [np.ones((3, 3), np.float32)], tmp_path, exporter="torchscript")
    captured = capfd.readouterr()
    assert (captured.out, captured.err) == ("", "")
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "the torchscript exporter printed: Torch IR graph at exception" in logged
    assert "the torchscript exporter warned: DeprecationWarning" in logged
    assert warnings.filters == filters
    print("the program's own line")
    os.write(2, b"its own native line\n")
    captured = capfd.readouterr()
    assert (captured.out, captured.err) == ("the program's own line\n", "its own native line\n")


def test_the_program_s_warnings_outside_the_call_still_reach_it(tmp_path, caplog):
    with pytest.warns(UserWarning, match="before"):
        warnings.warn("before", stacklevel=1)
    with caplog.at_level(logging.INFO, logger="bisect_onnx"), warnings.catch_warnings():
        warnings.simplefilter("error")  # one escaping the call would raise here
        export_model(Warns(), [np.ones((2, 2), np.float32)], tmp_path)
    assert any("dynamo exporter warned: UserWarning: the model's own warning"
               in record.getMessage() for record in caplog.records)
    with pytest.warns(UserWarning, match="after"):
        warnings.warn("after", stacklevel=1)
