"""The user's model is as it came in after every public entry point: buffers, weights, modes.

A model left in training mode is the case that changes something: its BatchNorm updates
its running statistics each time it runs (and a Dropout draws), and each entry point
runs it several times (PyTorch's capture, a TorchScript trace's op values, float64
reruns, the fix searches).
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import bisect_onnx
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED


class _TrainingBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return self.head(self.drop(torch.relu(self.bn(self.conv(x)))).flatten(1))


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = _TrainingBlock()
    model.train()
    model.drop.eval()  # modes differ between modules: each is put back as it was
    return model


def _state(model: nn.Module) -> tuple[bytes, list[bool]]:
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    return buffer.getvalue(), [module.training for module in model.modules()]


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    folder = tmp_path_factory.mktemp("untouched")
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    model = _model()
    with warnings.catch_warnings():  # the TorchScript exporter's deprecation
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (torch.from_numpy(x),), str(folder / "m.onnx"),
                          dynamo=False, opset_version=17)
    return x, folder / "m.onnx"


@LEGACY_EXPORTER_DEPRECATED
@pytest.mark.parametrize("how", [
    "bisect, a TorchScript file given",
    "bisect, exported here (dynamo)",
    "bisect with the fix searches",
    "assert_parity",
])
def test_no_entry_point_changes_the_users_model(case, how):
    x, path = case
    model = _model()
    before = _state(model)
    with pytest.warns(bisect_onnx.BisectOnnxWarning):  # training mode is said
        if how == "bisect, a TorchScript file given":
            bisect_onnx.bisect(model, [x], onnx_model=path)
        elif how == "bisect, exported here (dynamo)":
            bisect_onnx.bisect(model, [x])
        elif how == "bisect with the fix searches":
            report = bisect_onnx.bisect(model, [x], onnx_model=path, suggest_fix=True)
            # The trial of eval mode runs on the statistics the model came with (the
            # export's): it reaches parity, not an improvement by some factor.
            trials = [fix for fix in report.fixes if fix.kind == "eval mode"]
            assert trials and trials[0].after.failing_outputs == 0, report.fixes
        else:
            with pytest.raises(bisect_onnx.ParityError):
                bisect_onnx.assert_parity(model, [x], path)
    after = _state(model)
    assert after[1] == before[1], "a module's mode changed"
    assert after[0] == before[0], "a parameter or buffer changed"


@LEGACY_EXPORTER_DEPRECATED
def test_where_eval_mode_reaches_parity_the_headline_says_so_not_file_a_bug(case, tmp_path):
    x, path = case
    with pytest.warns(bisect_onnx.BisectOnnxWarning):
        checked = bisect_onnx.bisect(_model(), [x], onnx_model=path, suggest_fix=True,
                                     output=bisect_onnx.OutputOptions(repro_dir=tmp_path / "r"))
        unchecked = bisect_onnx.bisect(_model(), [x], onnx_model=path)
    headline = checked.summary().splitlines()[0]
    assert "in eval mode it reaches parity (checked): call model.bn.eval()" in headline
    assert "file it with" not in headline
    # Nothing to file upstream: no repro of a node is written, and the report says why.
    assert checked.repro is None and not (tmp_path / "r" / "backend_test").exists()
    assert not list((tmp_path / "r").glob("exporter_repro.py"))  # no exporter issue either
    assert not [fix for fix in checked.fixes if fix.kind == "other export"]
    assert any(warning.startswith("no repro written: the model in eval mode reaches parity")
               for warning in checked.warnings)
    # Without the fix search nothing was checked: the headline keeps the classification.
    assert "in eval mode it reaches parity" not in unchecked.summary()
    assert ("the model is in training mode, a likelier cause: call model.eval() first (for "
            "one forward, --suggest-fix checks whether eval mode reaches parity)"
            ) in unchecked.summary().splitlines()[0]
