"""The grammar of the generated corpus: seeded random small models made of blocks.

A model is ``x -> block -> block -> ... -> y`` over a ``[batch, time, width]`` tensor
(width at most ``MAX_WIDTH``). Each block is a small ``nn.Module`` drawn from
``BLOCKS``: leaf modules (Linear, Conv, norms, Embedding, attention, the
TransformerEncoderLayer fast path, pools), functional calls in ``forward``, containers
(``nn.Sequential``, ``nn.ModuleList``, nested submodules, residual wrappers), in-place
and view ops, integer ops cast back to float, NaN- and Inf-producing ops whose bad
elements are masked before they reach the output, and modules called twice (within a
block, or an earlier block's module called again later).

Each block names the ATen ops and module kinds it emits (``KINDS``); ``vocabulary()``
is their union, the grammar's size. Only :mod:`benchmarks.corpus` uses this module.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

BATCH, TIME = 2, 8
MAX_WIDTH = 64
WIDTHS = (8, 16, 32)


def _width(rng: random.Random, limit: int = MAX_WIDTH) -> int:
    return rng.choice([w for w in (8, 16, 24, 32, 48, 64) if w <= limit])


# -- leaf modules -------------------------------------------------------------------

class LinearBlock(nn.Module):
    """``nn.Linear`` changing the width."""

    KINDS = ("nn.Linear", "aten.linear")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = _width(rng)
        self.linear = nn.Linear(width, self.out_width, bias=rng.random() < 0.8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return self.linear(x)


_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "nn.ReLU": nn.ReLU, "nn.GELU": nn.GELU, "nn.SiLU": nn.SiLU, "nn.Tanh": nn.Tanh,
    "nn.Sigmoid": nn.Sigmoid, "nn.Softplus": nn.Softplus,
    "nn.LeakyReLU": lambda: nn.LeakyReLU(0.1), "nn.ELU": nn.ELU,
    "nn.Hardswish": nn.Hardswish, "nn.Hardtanh": nn.Hardtanh, "nn.Mish": nn.Mish,
}


class ActivationBlock(nn.Module):
    """An activation module."""

    KINDS = tuple(_ACTIVATIONS)

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.act = _ACTIVATIONS[rng.choice(sorted(_ACTIVATIONS))]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return self.act(x)


class Conv1dBlock(nn.Module):
    """``nn.Conv1d`` over time (channels first), padded to keep the length."""

    KINDS = ("nn.Conv1d", "aten.conv1d", "aten.transpose")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        groups = rng.choice([g for g in (1, 2, 4) if width % g == 0])
        self.conv = nn.Conv1d(width, width, 3, padding=1, groups=groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return self.conv(x.transpose(1, 2)).transpose(1, 2)


class Conv2dBlock(nn.Module):
    """``nn.Conv2d`` on ``[batch, 1, time, width]``, channels merged back into the width.

    Half of them have an ``nn.BatchNorm2d`` after it, which both exporters fold into the Conv.
    """

    KINDS = ("nn.Conv2d", "aten.conv2d", "nn.BatchNorm2d", "aten.unsqueeze",
             "aten.permute", "aten.reshape")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.channels = 2 if 2 * width <= MAX_WIDTH else 1
        self.out_width = self.channels * width
        self.conv = nn.Conv2d(1, self.channels, 3, padding=1)
        self.norm = _batch_norm(nn.BatchNorm2d(self.channels), rng) if rng.random() < 0.5 \
            else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        y = self.norm(self.conv(x.unsqueeze(1)))
        return y.permute(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], self.out_width)


def _batch_norm(norm: nn.Module, rng: random.Random) -> nn.Module:
    """Random running statistics and affine weights, in eval mode."""
    generator = torch.Generator().manual_seed(rng.getrandbits(31))
    count = norm.num_features
    with torch.no_grad():
        norm.running_mean.copy_(torch.randn(count, generator=generator) * 0.5)
        norm.running_var.copy_(torch.rand(count, generator=generator) + 0.5)
        norm.weight.copy_(torch.rand(count, generator=generator) + 0.5)
        norm.bias.copy_(torch.randn(count, generator=generator) * 0.1)
    return norm.eval()


class LayerNormBlock(nn.Module):
    """``nn.LayerNorm`` over the width."""

    KINDS = ("nn.LayerNorm", "aten.layer_norm")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.norm = nn.LayerNorm(width, elementwise_affine=rng.random() < 0.8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return self.norm(x)


class BatchNormBlock(nn.Module):
    """``nn.BatchNorm1d`` in eval mode, channels first."""

    KINDS = ("nn.BatchNorm1d", "aten._native_batch_norm_legit_no_training")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.norm = _batch_norm(nn.BatchNorm1d(width), rng)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return self.norm(x.transpose(1, 2)).transpose(1, 2)


class GroupNormBlock(nn.Module):
    """``nn.GroupNorm``, channels first."""

    KINDS = ("nn.GroupNorm", "aten.group_norm")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.norm = nn.GroupNorm(rng.choice([g for g in (1, 2, 4) if width % g == 0]), width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return self.norm(x.transpose(1, 2)).transpose(1, 2)


class EmbeddingBlock(nn.Module):
    """``nn.Embedding`` of each position's argmax (an integer path), added back."""

    KINDS = ("nn.Embedding", "aten.embedding", "aten.argmax", "aten.add")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.embedding = nn.Embedding(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return x + self.embedding(torch.argmax(x, dim=-1))


class DropoutBlock(nn.Module):
    """``nn.Dropout`` in eval mode (an identity the TorchScript exporter drops)."""

    KINDS = ("nn.Dropout",)

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.dropout = nn.Dropout(0.1).eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return self.dropout(x)


class AttentionBlock(nn.Module):
    """``nn.MultiheadAttention`` self-attention with a residual."""

    KINDS = ("nn.MultiheadAttention",)

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        heads = rng.choice([h for h in (1, 2, 4) if width % h == 0])
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return x + self.attention(x, x, x, need_weights=False)[0]


class EncoderLayerBlock(nn.Module):
    """``nn.TransformerEncoderLayer`` in eval mode: eager PyTorch takes its fast path."""

    KINDS = ("nn.TransformerEncoderLayer",)

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        heads = rng.choice([h for h in (1, 2, 4) if width % h == 0])
        self.layer = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=2 * width, dropout=0.0, batch_first=True,
            norm_first=rng.random() < 0.5).eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return self.layer(x)


class PoolBlock(nn.Module):
    """``nn.AvgPool1d`` or ``nn.MaxPool1d`` over time, padded to keep the length."""

    KINDS = ("nn.AvgPool1d", "nn.MaxPool1d", "aten.avg_pool1d", "aten.max_pool1d")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.pool = (nn.AvgPool1d(3, 1, 1) if rng.random() < 0.5 else nn.MaxPool1d(3, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return self.pool(x.transpose(1, 2)).transpose(1, 2)


class FlattenBlock(nn.Module):
    """``nn.Flatten`` then ``nn.Unflatten`` around a learned per-element scale."""

    KINDS = ("nn.Flatten", "nn.Unflatten", "aten.flatten", "aten.mul")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.flatten, self.unflatten = nn.Flatten(1), nn.Unflatten(1, (TIME, width))
        self.scale = nn.Parameter(torch.rand(TIME * width) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return self.unflatten(self.flatten(x) * self.scale)


# -- containers and reuse -------------------------------------------------------------

class SequentialBlock(nn.Module):
    """``nn.Sequential`` of Linear, activation, Linear (numeric child names)."""

    KINDS = ("nn.Sequential",)

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        hidden = _width(rng)
        self.out_width = width
        self.mlp = nn.Sequential(nn.Linear(width, hidden), ActivationBlock(rng, hidden).act,
                                 nn.Linear(hidden, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return self.mlp(x)


class ModuleListBlock(nn.Module):
    """``nn.ModuleList`` of Linears run in a loop, each with a residual ReLU."""

    KINDS = ("nn.ModuleList", "aten.relu")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(rng.randint(2, 3)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        for layer in self.layers:
            x = x + torch.relu(layer(x))
        return x


class _Inner(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return self.norm(self.proj(x))


class _Middle(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.inner = _Inner(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return F.silu(self.inner(x))


class NestedBlock(nn.Module):
    """Submodules three deep, the innermost holding a Linear and a LayerNorm."""

    KINDS = ("nested submodules", "aten.silu")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.middle = _Middle(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return self.middle(x)


class TwiceBlock(nn.Module):
    """One Linear and one activation module, each called twice."""

    KINDS = ("module called twice",)

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.linear = nn.Linear(width, width)
        self.act = ActivationBlock(rng, width).act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return self.act(self.linear(self.act(self.linear(x))))


class ResidualBlock(nn.Module):
    """A width-keeping block inside a residual wrapper (a container's child)."""

    KINDS = ("residual wrapper",)

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        inner = rng.choice(KEEPS_WIDTH)
        self.body = inner(rng, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return x + self.body(x)


class ReuseBlock(nn.Module):
    """An earlier block's module called again here (one module object, two parents)."""

    KINDS = ("module reused across blocks",)

    def __init__(self, module: nn.Module, width: int):
        super().__init__()
        self.out_width = width
        self.reused = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return self.reused(x)


# -- functional calls in forward ---------------------------------------------------------

_FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "aten.gelu": F.gelu,
    "aten.gelu (tanh)": lambda x: F.gelu(x, approximate="tanh"),
    "aten.tanh": torch.tanh,
    "aten.sigmoid": torch.sigmoid,
    "aten.softplus": F.softplus,
    "aten.elu": F.elu,
    "aten.leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "aten.hardtanh": lambda x: F.hardtanh(x, -0.5, 0.5),
    "aten.erf": torch.erf,
    "aten.exp": lambda x: torch.exp(x.clamp(max=3.0)),
    "aten.sin": torch.sin,
    "aten.cos": torch.cos,
    "aten.neg": lambda x: -x,
    "aten.abs": torch.abs,
    "aten.square": torch.square,
    "aten.reciprocal": lambda x: torch.reciprocal(x.abs() + 1.0),
}


class FunctionBlock(nn.Module):
    """A functional activation or pointwise op called in ``forward``."""

    KINDS = tuple(_FUNCTIONS) + ("aten.clamp",)

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.name = rng.choice(sorted(_FUNCTIONS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return _FUNCTIONS[self.name](x)


class SoftmaxBlock(nn.Module):
    """``torch.softmax`` or ``torch.log_softmax`` over the width or over time."""

    KINDS = ("aten._softmax", "aten._log_softmax")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.dim = rng.choice((1, -1))
        self.log = rng.random() < 0.4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return torch.log_softmax(x, self.dim) if self.log else torch.softmax(x, self.dim)


class CumsumBlock(nn.Module):
    """``torch.cumsum`` over time, averaged."""

    KINDS = ("aten.cumsum", "aten.div")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return torch.cumsum(x, dim=1) / TIME


class WhereClampBlock(nn.Module):
    """``torch.where`` on a comparison, then ``clamp``."""

    KINDS = ("aten.where", "aten.gt", "aten.clamp")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.slope = rng.choice((0.1, 0.3, 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return torch.where(x > 0, x, self.slope * x).clamp(-2.0, 2.0)


class MatmulBlock(nn.Module):
    """Attention by hand: ``matmul`` with a transpose, a scale and a softmax."""

    KINDS = ("aten.matmul", "aten.bmm", "aten.transpose", "aten._softmax")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.scale = 1.0 / math.sqrt(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        scores = torch.matmul(x, x.transpose(-1, -2)) * self.scale
        return torch.matmul(torch.softmax(scores, -1), x)


class CausalBlock(nn.Module):
    """Causal attention: scores ``masked_fill``-ed with -inf above the diagonal, softmax."""

    KINDS = ("aten.masked_fill", "aten.bmm")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.register_buffer("mask", torch.triu(torch.ones(TIME, TIME, dtype=torch.bool), 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        scores = (x @ x.transpose(1, 2)) / math.sqrt(x.shape[-1])
        return torch.softmax(scores.masked_fill(self.mask, float("-inf")), -1) @ x


class EinsumBlock(nn.Module):
    """``torch.einsum`` with a weight."""

    KINDS = ("aten.einsum",)

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = _width(rng)
        self.weight = nn.Parameter(torch.randn(width, self.out_width) / math.sqrt(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return torch.einsum("btd,de->bte", x, self.weight)


class ViewBlock(nn.Module):
    """``view`` into heads, ``transpose``, ``reshape`` back (a channel shuffle)."""

    KINDS = ("aten.view", "aten.transpose", "aten.reshape", "aten.contiguous")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        b, t, d = x.shape
        return x.view(b, t, 2, d // 2).transpose(2, 3).contiguous().reshape(b, t, d)


class SplitCatBlock(nn.Module):
    """``split`` in halves, a gate, ``cat`` back."""

    KINDS = ("aten.split", "aten.cat", "aten.sigmoid", "aten.mul")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        a, b = x.split(x.shape[-1] // 2, dim=-1)
        return torch.cat([b, a * torch.sigmoid(b)], dim=-1)


class ChunkStackBlock(nn.Module):
    """``chunk`` in two, ``stack`` on a new last axis, ``flatten`` (an interleave)."""

    KINDS = ("aten.chunk", "aten.stack", "aten.flatten")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        first, second = x.chunk(2, dim=-1)
        return torch.stack([second, first], dim=-1).flatten(-2)


class SliceBlock(nn.Module):
    """Strided slices of the width concatenated, and a time slice padded back."""

    KINDS = ("aten.slice", "aten.cat", "aten.pad")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        x = torch.cat([x[:, :, ::2], x[:, :, 1::2]], dim=-1)
        return x + F.pad(x[:, 1:, :], (0, 0, 0, 1))


class CenterBlock(nn.Module):
    """``unsqueeze``/``squeeze``, the mean over time taken out, ``expand``."""

    KINDS = ("aten.unsqueeze", "aten.squeeze", "aten.mean", "aten.expand", "aten.sub")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        mean = x.unsqueeze(0).mean(dim=2, keepdim=True).squeeze(0)
        return x - mean.expand(-1, x.shape[1], -1)


class InplaceBlock(nn.Module):
    """In-place ops on a clone: ``mul_``, ``add_``, ``relu_``."""

    KINDS = ("aten.clone", "aten.mul_", "aten.add_", "aten.relu_")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.factor = rng.choice((0.5, 2.0, -1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        y = x.clone()
        y.mul_(self.factor)
        y.add_(x)
        return y.relu_()


_INTEGER: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "floor-div": lambda i: torch.div(i, 3, rounding_mode="floor"),
    "remainder": lambda i: torch.remainder(i, 5),
    "shift left": lambda i: torch.bitwise_left_shift(i.abs(), 1),
    "shift right": lambda i: torch.bitwise_right_shift(i.abs(), 1),
}


class IntegerBlock(nn.Module):
    """An integer op on ``floor(4x)`` as int64 (negatives included), cast back to float."""

    KINDS = ("aten.floor", "aten._to_copy", "aten.div (floor)", "aten.remainder",
             "aten.bitwise_left_shift", "aten.bitwise_right_shift", "aten.abs")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.name = rng.choice(sorted(_INTEGER))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        integers = torch.floor(x * 4).to(torch.int64)
        return x + 0.1 * _INTEGER[self.name](integers).to(x.dtype)


_GUARDED: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    # NaN in the branch where() does not take.
    "log": lambda x: torch.where(x > 0, torch.log(x), x),
    "sqrt": lambda x: torch.where(x >= 0, torch.sqrt(x), -x),
    # 0/0 and x/0 masked out.
    "div by zero": lambda x: torch.where(x > 0, x / (x > 0).to(x.dtype), 0.5 * x),
    # NaN replaced.
    "nan_to_num": lambda x: torch.nan_to_num(torch.log(x), nan=0.0, neginf=-1.0),
    "isnan": lambda x: torch.where(torch.isnan(torch.sqrt(x)), torch.zeros_like(x), x),
}


class NanGuardBlock(nn.Module):
    """An op that makes NaN or Inf on part of the input, masked or replaced after."""

    KINDS = ("aten.log", "aten.sqrt", "aten.isnan", "aten.nan_to_num", "aten.zeros_like",
             "aten.ge", "aten.div")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.name = rng.choice(sorted(_GUARDED))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return _GUARDED[self.name](x)


class RmsNormBlock(nn.Module):
    """RMS normalization by hand: ``pow``, ``mean``, ``rsqrt``, a weight."""

    KINDS = ("aten.pow", "aten.rsqrt", "aten.mean")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.weight = nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class ReduceBlock(nn.Module):
    """Reductions: ``amax``, ``var``, a vector norm, ``sum``."""

    KINDS = ("aten.amax", "aten.var", "aten.linalg_vector_norm", "aten.sum")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        self.kind = rng.choice(("amax", "var", "norm", "sum"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        if self.kind == "amax":
            return x - x.amax(-1, keepdim=True)
        if self.kind == "var":
            return x / torch.sqrt(x.var(-1, keepdim=True) + 1.0)
        if self.kind == "norm":
            return x / (torch.linalg.vector_norm(x, dim=-1, keepdim=True) + 1e-3)
        return x * torch.sigmoid(x.sum(1, keepdim=True))


class PermuteBlock(nn.Module):
    """Reordering the width: ``index_select`` by a fixed permutation, ``flip``, ``roll``."""

    KINDS = ("aten.index_select", "aten.flip", "aten.roll", "aten.maximum", "aten.minimum")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        order = list(range(width))
        rng.shuffle(order)
        self.register_buffer("order", torch.tensor(order))
        self.kind = rng.choice(("index_select", "flip", "roll"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        if self.kind == "index_select":
            return torch.maximum(x, x.index_select(-1, self.order))
        if self.kind == "flip":
            return torch.minimum(x, x.flip(-1))
        return x + 0.5 * torch.roll(x, 1, dims=1)


class TopkBlock(nn.Module):
    """The top half of the width by ``topk``, beside the first half."""

    KINDS = ("aten.topk",)

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        half = x.shape[-1] // 2
        return torch.cat([x.topk(half, dim=-1).values, x[..., :half]], dim=-1)


class RotaryBlock(nn.Module):
    """Rotary position mixing: fixed ``cos``/``sin`` tables, a rotate-half, ``neg``."""

    KINDS = ("aten.neg", "aten.cat", "aten.slice")

    def __init__(self, rng: random.Random, width: int):
        super().__init__()
        self.out_width = width
        angles = torch.arange(TIME)[:, None] * torch.arange(width)[None, :] / width
        self.register_buffer("cos", torch.cos(angles))
        self.register_buffer("sin", torch.sin(angles))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, time, width]`` to ``[batch, time, out_width]``."""
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * self.cos + rotated * self.sin


@dataclass(frozen=True)
class Draw:
    """How often a block is drawn (relative weight) and what width it needs."""

    block: type
    weight: float = 1.0
    even: bool = False
    """Needs an even width (splits in halves)."""


DRAWS = (
    Draw(LinearBlock, 2.0), Draw(ActivationBlock, 2.0), Draw(Conv1dBlock), Draw(Conv2dBlock),
    Draw(LayerNormBlock), Draw(BatchNormBlock), Draw(GroupNormBlock), Draw(EmbeddingBlock),
    Draw(DropoutBlock, 0.5), Draw(AttentionBlock), Draw(EncoderLayerBlock),
    Draw(PoolBlock), Draw(FlattenBlock, 0.5), Draw(SequentialBlock), Draw(ModuleListBlock),
    Draw(NestedBlock), Draw(TwiceBlock), Draw(ResidualBlock), Draw(FunctionBlock, 2.0),
    Draw(SoftmaxBlock), Draw(CumsumBlock), Draw(WhereClampBlock), Draw(MatmulBlock),
    Draw(CausalBlock), Draw(EinsumBlock), Draw(ViewBlock, even=True),
    Draw(SplitCatBlock, even=True), Draw(ChunkStackBlock, even=True), Draw(SliceBlock, even=True),
    Draw(CenterBlock), Draw(InplaceBlock), Draw(IntegerBlock), Draw(NanGuardBlock),
    Draw(RmsNormBlock), Draw(ReduceBlock), Draw(PermuteBlock), Draw(TopkBlock, even=True),
    Draw(RotaryBlock, even=True),
)
KEEPS_WIDTH = tuple(draw.block for draw in DRAWS
                    if draw.block not in (LinearBlock, EinsumBlock, Conv2dBlock, ResidualBlock)
                    and not draw.even)


def vocabulary() -> list[str]:
    """Every ATen op and module kind the grammar can emit, sorted."""
    kinds = {kind for draw in DRAWS for kind in draw.block.KINDS} | set(ReuseBlock.KINDS)
    return sorted(kinds)


class Generated(nn.Module):
    """A generated model: its blocks in an ``nn.ModuleList``, run in order."""

    def __init__(self, blocks: list[nn.Module], description: list[str]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.description = description

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Each block in turn."""
        for block in self.blocks:
            x = block(x)
        return x


def generate(seed: int) -> tuple[Generated, torch.Tensor]:
    """The model and input of ``seed``: 3 to 6 blocks, widths up to ``MAX_WIDTH``."""
    rng = random.Random(seed)
    torch.manual_seed(rng.getrandbits(31))
    width = rng.choice(WIDTHS)
    x = torch.randn(BATCH, TIME, width)
    blocks: list[nn.Module] = []
    names: list[str] = []
    reusable: list[tuple[int, nn.Module]] = []  # (width, module) kept by earlier blocks
    for _ in range(rng.randint(3, 6)):
        same = [module for w, module in reusable if w == width]
        if same and rng.random() < 0.1:
            block: nn.Module = ReuseBlock(rng.choice(same), width)
        else:
            draws = [d for d in DRAWS if not d.even or width % 2 == 0]
            draw = rng.choices(draws, weights=[d.weight for d in draws])[0]
            block = draw.block(rng, width)
        if block.out_width == width and isinstance(block, KEEPS_WIDTH):
            reusable.append((width, block))
        name = type(block).__name__.removesuffix("Block")
        if isinstance(block, ResidualBlock):
            name += f"({type(block.body).__name__.removesuffix('Block')})"
        names.append(name)
        blocks.append(block)
        width = block.out_width
    return Generated(blocks, names).eval(), x
