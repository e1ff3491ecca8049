"""Tracing a module as the TorchScript exporter does, with its chatter kept in the log."""

from __future__ import annotations

import logging
import sys

import numpy as np
import torch

from bisect_onnx.pytorch.script_ops import trace_script

_LIBRARY = logging.getLogger("a_model_library_under_trace")


class LogsFromAProperty(torch.nn.Module):
    """As transformers' ``loss_function``: a property that logs, which tracing reads."""

    @property
    def loss_function(self) -> str:
        _LIBRARY.warning("[a_model_library] loss_type=None is unrecognized")
        return "default"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_what_tracing_makes_a_module_log_goes_to_the_log(capfd, caplog, monkeypatch):
    # As transformers' logger is: its own handler on the process's stderr, not propagating.
    monkeypatch.setattr(_LIBRARY, "propagate", False)
    monkeypatch.setattr(_LIBRARY, "handlers", [logging.StreamHandler(sys.__stderr__)])
    with caplog.at_level("INFO", logger="bisect_onnx"):
        trace_script(LogsFromAProperty(), [np.ones((2, 3), dtype=np.float32)])
    assert capfd.readouterr() == ("", "")
    assert "loss_type=None is unrecognized" in caplog.text
