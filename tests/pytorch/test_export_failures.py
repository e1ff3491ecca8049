"""Export failures name the exporter's failed step and what to try instead, in one line."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from bisect_onnx.errors import ModelError, UsageError
from bisect_onnx.pytorch.exporting import export_model
from tests.torch_warnings import TORCH_JIT_DEPRECATED

_STEP_TWO = ("Failed to decompose the FX graph for ONNX compatibility. \x1b[96mThis is step "
             "2/3\x1b[0m of exporting the model to ONNX. Next steps:\n- Create an issue ...")


class Tiny(torch.nn.Module):
    def forward(self, x):
        return x * 2


def _failing_export(monkeypatch, error: BaseException) -> None:
    def export(*args, **kwargs):
        raise error
    monkeypatch.setattr(torch.onnx, "export", export)


def _export_error(model, tmp_path, exporter: str) -> str:
    with pytest.raises(ModelError) as caught:
        export_model(model, [np.ones((2, 2), np.float32)], tmp_path, exporter=exporter)
    message = str(caught.value)
    assert "\n" not in message and "\x1b[" not in message
    return message


def _chained(outer: str, cause: BaseException) -> Exception:
    error = RuntimeError(outer)
    error.__cause__ = cause
    return error


def test_a_dynamo_step_failure_names_the_step_its_cause_and_the_torchscript_exporter(
        monkeypatch, tmp_path):
    cause = ValueError("Cannot view a tensor with shape torch.Size([4, 16, 2, 8]) and strides "
                       "(256, 8, 128, 1) as a tensor with shape (4, 16, 16)!")
    _failing_export(monkeypatch, _chained(_STEP_TWO, cause))
    message = _export_error(Tiny(), tmp_path, "dynamo")
    assert "could not export Tiny (step 2 of 3, the exporter's decompositions" in message
    assert "ValueError: Cannot view a tensor" in message
    assert "--exporter torchscript" in message
    assert 'ExportOptions(exporter="torchscript")' in message
    assert "--onnx FILE" in message


def test_a_torchscript_failure_suggests_the_dynamo_exporter(monkeypatch, tmp_path):
    _failing_export(monkeypatch, RuntimeError("Unsupported: ONNX export of operator histc"))
    message = _export_error(Tiny(), tmp_path, "torchscript")
    assert "the torchscript exporter could not export Tiny: RuntimeError: Unsupported" in message
    assert "step" not in message
    assert "--exporter dynamo" in message and "--onnx FILE" in message


@TORCH_JIT_DEPRECATED
def test_a_script_module_is_offered_only_a_file_made_elsewhere(monkeypatch, tmp_path):
    scripted = torch.jit.script(Tiny())
    _failing_export(monkeypatch, RuntimeError("cannot export this"))
    message = _export_error(scripted, tmp_path, "torchscript")
    assert "could not export Tiny" in message
    assert "--exporter" not in message
    assert "--onnx FILE" in message


def test_a_real_translation_failure_names_step_three(tmp_path):
    class Histogram(torch.nn.Module):
        def forward(self, x):
            return torch.histc(x, bins=4)

    message = _export_error(Histogram(), tmp_path, "dynamo")
    assert "(step 3 of 3, the translation of the traced graph to ONNX)" in message
    assert "histc" in message
    assert "--exporter torchscript" in message


def test_an_option_torch_onnx_export_does_not_take_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="takes no option no_such_option"):
        export_model(Tiny(), [np.ones((2, 2), np.float32)], tmp_path,
                     options={"no_such_option": 1})


def test_an_option_bisect_onnx_sets_itself_names_the_field_to_use(tmp_path):
    with pytest.raises(UsageError, match=r"opset_version.*ExportOptions\(opset=\.\.\.\)"):
        export_model(Tiny(), [np.ones((2, 2), np.float32)], tmp_path,
                     options={"opset_version": 18})


def test_a_forward_that_rejects_its_arguments_while_traced_is_a_model_error(tmp_path):
    # A TypeError from inside the trace (transformers' BertModel under the TorchScript
    # exporter: "got multiple values for argument 'use_cache'") is no option of ours.
    class Picky(torch.nn.Module):
        def forward(self, x):
            if torch.jit.is_tracing():
                raise TypeError("forward() got multiple values for argument 'use_cache'")
            return x * 2

    message = _export_error(Picky(), tmp_path, "torchscript")
    assert "the torchscript exporter could not export Picky" in message
    assert "multiple values" in message


class DynamicCache:
    """Stands in for transformers' cache: an object holding tensors, no pytree for it."""

    def __init__(self, key: torch.Tensor) -> None:
        self.key = key


class Decoder(torch.nn.Module):
    def forward(self, x):
        return x * 2, DynamicCache(x + 1)  # what use_cache=True returns beside the logits


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_cache_in_the_output_names_use_cache_not_the_other_exporter(tmp_path, exporter):
    message = _export_error(Decoder(), tmp_path, exporter)
    assert f"the {exporter} exporter could not export Decoder" in message
    assert "returns a DynamicCache" in message
    assert "model.config.use_cache = False" in message and "returns tensors only" in message
    # The other exporter fails the same way: suggesting it sends the user in a circle.
    assert "--exporter" not in message


class Branching(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # a Python branch on a tensor's value
            return x * 2
        return x - 1


def test_a_data_dependent_branch_is_named_with_its_line_not_sent_to_the_tracer(tmp_path):
    """The tracer would bake the branch in: torch.cond is the way, and the line is named."""
    message = _export_error(Branching(), tmp_path, "dynamo")
    assert "branches on a tensor's value (at " in message
    assert "test_export_failures.py:" in message and "in forward" in message
    assert "torch.cond" in message and "--exporter torchscript" not in message


def test_the_shape_solvers_log_of_a_data_dependent_branch_stays_off_stderr(tmp_path):
    """torch's own log line ("Unable to find user code corresponding to {u0}") is chatter.

    torch's loggers write to stderr through handlers of their own: none may be called.
    """
    logged: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = logged.append  # type: ignore[method-assign]
    solver = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    solver.addHandler(handler)
    try:
        _export_error(Branching(), tmp_path, "dynamo")
    finally:
        solver.removeHandler(handler)
    assert [record.getMessage() for record in logged] == []
