"""PyTorch's side of a module-level segment in float64: computed from the pinned values only.

The model is branched (a residual block) so that a segment reading one branch and not
the other, and one the pins do not cut off from the rest, both occur.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bisect_onnx.errors import BisectOnnxError
from bisect_onnx.pytorch.span_float64 import Pin, span_in_float64


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.relu = torch.nn.ReLU()
        self.conv2 = torch.nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        return self.relu(self.conv2(self.relu(self.conv1(x))) + x)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 4, 1)
        self.block = Block()

    def forward(self, x):
        return self.block(self.stem(x))


@pytest.fixture
def net():
    torch.manual_seed(0)
    model = Net().eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8)).astype(np.float32)
    values = {}

    def keep(name):
        def hook(module, args, output):
            values.setdefault(name, []).append(output.detach().numpy().copy())
        return hook

    handles = [model.get_submodule(name).register_forward_hook(keep(name))
               for name in ("stem", "block.relu", "block.conv2", "block")]
    with torch.no_grad():
        model(torch.from_numpy(x))
    for handle in handles:
        handle.remove()
    return model, x, values


def test_a_segment_is_computed_in_float64_from_its_pinned_input(net):
    model, x, values = net
    # The segment conv2 reads relu's first call: a value inside the block, pinned there.
    pinned = values["block.relu"][0] + np.float32(0.5)  # not what PyTorch computes: it is fed
    result = span_in_float64(model, [x], [], output=("block.conv2", 0),
                             pins=[Pin("block.relu", 0, pinned)],
                             reference=values["block.conv2"][0])
    conv2 = model.block.conv2
    expected = torch.nn.functional.conv2d(torch.from_numpy(pinned).double(),
                                          conv2.weight.double(), conv2.bias.double(),
                                          padding=1).detach().numpy()
    assert result.dtype == np.float64
    np.testing.assert_array_equal(result, expected)
    assert model.block.conv2.weight.dtype == torch.float32  # the model is left as it was


def test_a_pin_equal_to_the_calls_argument_feeds_it(net):
    model, x, values = net
    # The residual Add reads conv2's output and the block's input (stem's output).
    result = span_in_float64(model, [x], [], output=("block.relu", 1),
                             pins=[Pin("block.conv2", 0, values["block.conv2"][0]),
                                   Pin("stem", 0, values["stem"][0])],
                             reference=values["block.relu"][1])
    expected = np.maximum(values["block.conv2"][0].astype(np.float64)
                          + values["stem"][0].astype(np.float64), 0)
    np.testing.assert_array_equal(result, expected)


def test_a_value_the_segment_does_not_read_refuses_the_rerun(net):
    model, x, values = net
    # Pinned on conv2 alone, the residual branch (the block's input) would be read too.
    with pytest.raises(BisectOnnxError, match="reads a value"):
        span_in_float64(model, [x], [], output=("block.relu", 1),
                        pins=[Pin("block.conv2", 0, values["block.conv2"][0])],
                        reference=values["block.relu"][1])
    assert not model.block.conv2._forward_hooks and not model.block.conv2._forward_pre_hooks


def test_weights_too_large_in_float64_are_refused(net):
    model, x, values = net
    with pytest.raises(BisectOnnxError, match="would take"):
        span_in_float64(model, [x], [], output=("block.conv2", 0),
                        pins=[Pin("block.relu", 0, values["block.relu"][0])],
                        reference=values["block.conv2"][0], max_bytes=16)


class FloatConstant(torch.nn.Module):
    """A forward that makes a float32 tensor of its own: it does not run in float64."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Identity()

    def forward(self, x):
        return self.inner(x) @ torch.ones(8, 8)


class Wrapper(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Linear(8, 8)
        self.mixed = FloatConstant()

    def forward(self, x):
        return self.mixed(self.stem(x))


def test_a_call_that_does_not_run_in_float64_is_refused_not_raised():
    torch.manual_seed(0)
    model = Wrapper().eval()
    x = np.ones((2, 8), dtype=np.float32)
    with torch.no_grad():
        stem = model.stem(torch.from_numpy(x))
        out = model.mixed(stem).numpy()
    with pytest.raises(BisectOnnxError, match="does not run in float64"):
        span_in_float64(model, [x], [], output=("mixed", 0),
                        pins=[Pin("stem", 0, stem.numpy())], reference=out)


class PairOut(torch.nn.Module):
    """Returns a tuple, as Hugging Face attention does: ``(output, weights)``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        out = self.proj(x)
        return out, out.sum()


class TupleNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = PairOut()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(self.attn(x)[0] * 2)


def test_a_pin_on_one_tensor_of_a_tuple_output_feeds_that_tensor():
    torch.manual_seed(0)
    model = torch.nn.Sequential(TupleNet()).eval()  # the block is "0", a call to rerun
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    with torch.no_grad():
        attn = model[0].attn(torch.from_numpy(x))[0].numpy()
        out = model(torch.from_numpy(x)).numpy()
    pinned = attn + np.float32(1.0)  # fed, not recomputed
    result = span_in_float64(model, [x], [], output=("0.fc", 0),
                             pins=[Pin("0.attn", 0, pinned, suffix="[0]")], reference=out)
    fc = model[0].fc
    expected = (torch.from_numpy(pinned).double() * 2 @ fc.weight.double().T
                + fc.bias.double()).detach().numpy()
    np.testing.assert_allclose(result, expected, rtol=1e-12)
