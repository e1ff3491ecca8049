"""A module whose output is the very tensor a submodule returned shares that copy."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from bisect_onnx.pytorch.module_side import TorchModuleSide


class Block(nn.Module):
    def __init__(self, inplace_after: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.inplace_after = inplace_after

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act(self.fc(x))
        if self.inplace_after:
            out.mul_(2)  # written after act recorded it: act's copy must not change
        return out


class Model(nn.Module):
    def __init__(self, inplace_after: bool) -> None:
        super().__init__()
        self.block = Block(inplace_after)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x) + 1


def capture(inplace_after: bool):
    torch.manual_seed(0)
    x = np.random.RandomState(0).randn(2, 4).astype(np.float32)
    return TorchModuleSide(Model(inplace_after).eval()).run([x]).values


def test_an_unchanged_output_shares_the_submodules_copy():
    values = capture(inplace_after=False)
    assert values["block"].array is values["block.act"].array


def test_an_output_written_in_place_since_gets_its_own_copy():
    values = capture(inplace_after=True)
    assert values["block"].array is not values["block.act"].array
    np.testing.assert_array_equal(values["block"].array, 2 * values["block.act"].array)
