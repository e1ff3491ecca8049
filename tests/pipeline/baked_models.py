"""Models whose export bakes a shape in, each with the shape it is exported at and run at.

Every model computes the same at every shape in PyTorch; its TorchScript export (and,
for some, its dynamo export with ``Dim.AUTO``) holds the export's size as a constant.
"""

from __future__ import annotations

import numpy as np
import torch


class Divisor(torch.nn.Module):
    """Centres over the batch, dividing by ``int()`` of its size: a Div by a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y - y.sum(0, keepdim=True) / int(y.shape[0])


class Flatten(torch.nn.Module):
    """Flattens to ``(int(batch), -1)``: a Reshape to ``[1, -1]``, then a Gemm refuses."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.view(int(x.shape[0]), -1))


class Positions(torch.nn.Module):
    """Adds ``torch.arange(int(n))``: the range folded into a constant of the export's n."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.arange(int(x.shape[1]), dtype=x.dtype)


class Broadcast(torch.nn.Module):
    """Expands a row to ``int(batch)`` rows: an Expand to the export's batch."""

    def __init__(self) -> None:
        super().__init__()
        self.row = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 4).reshape(1, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.row.expand(int(x.shape[0]), -1) + x.mean()


class Loop(torch.nn.Module):
    """A Python loop over ``x.shape[1]``: unrolled at the export's size."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x[:, 0])
        for index in range(x.shape[1]):
            out = torch.tanh(out + x[:, index])
        return out


class LoopSum(torch.nn.Module):
    """Sums the columns in a Python loop over ``x.shape[1]``: the export's last Add is its
    output, and an unrolled partial sum of the same ops at another size."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x[:, 0]
        for index in range(1, x.shape[1]):
            out = out + x[:, index]
        return out


class ClampedByBatch(torch.nn.Module):
    """Clamps at ``int(batch)``: a baked bound that no value of this model reaches.

    Its weight is too large to be compared between exports as a constant (a shape is).
    """

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(self.fc(x) * 0.01, max=float(int(x.shape[0])))


class Symbolic(torch.nn.Module):
    """The same computations written so that no size becomes a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y - y.mean(0, keepdim=True) + torch.arange(x.shape[1], dtype=x.dtype)


def built(model_class: type[torch.nn.Module]) -> torch.nn.Module:
    """The model, its weights seeded, in eval mode."""
    torch.manual_seed(0)
    return model_class().eval()


def flatten() -> torch.nn.Module:
    """:class:`Flatten` as :func:`built` makes it: the factory the command line is given."""
    return built(Flatten)


def sample(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """A float32 input of ``shape``."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class Gate(torch.nn.Module):
    """Branches on the sign of its input's sum: the tracer keeps the branch it took."""

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        if y.sum() > 0:
            return torch.relu(y)
        return y * 2


class Branch(torch.nn.Module):
    """A data-dependent branch between two layers (in a module call of its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.gate = Gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.fc(x)) + 1.0
