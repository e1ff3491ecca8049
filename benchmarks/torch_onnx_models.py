"""Models of the kinds PyTorch's own ONNX tests export, for ``benchmarks/wide_sweep.py``.

Two groups, written here after the architectures of PyTorch's ``test/onnx/model_defs``
and the single ops of ``test/onnx/test_pytorch_onnx_onnxruntime.py`` (own versions,
small sizes, random weights; nothing is copied):

- :data:`MODEL_DEFS`: DCGAN's generator and discriminator, an MNIST net, SqueezeNet
  1.1, the super-resolution net, SRResNet, word language models with LSTM and with GRU,
  a bidirectional LSTM, an ``nn.LSTMCell`` stepping twice, an embedding sequence, the
  ``op_test`` nets, and a model with ``x * 2.0`` next to ``F.gelu``;
- :data:`SINGLE_OPS`: one op each, ``forward`` scaling its input by a parameter,
  calling the op and adding a parameter (so that every model has a weight to scale, an
  op to change and a node to insert after), in two forms: the op called in the model's
  own ``forward`` (``direct``, no submodules) and in a submodule's (``submodule``).

Each builder returns ``(model, input)``: the model in eval mode, one input array.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

IMAGE = (2, 4, 8, 8)
SEQUENCE = (2, 8, 16)
TOKENS = (2, 8)
VOCAB = 50


def _randomise_norm_statistics(model: nn.Module) -> nn.Module:
    """BatchNorm running statistics drawn at random (fresh ones are 0 and 1), eval mode."""
    generator = torch.Generator().manual_seed(1)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            shape = module.running_mean.shape
            module.running_mean.copy_(0.1 * torch.randn(shape, generator=generator))
            module.running_var.copy_(0.5 + torch.rand(shape, generator=generator))
    return model.eval()


# -- model_defs ---------------------------------------------------------------------

class DCGANGenerator(nn.Module):
    """Noise ``[b, 16, 1, 1]`` to a ``[b, 3, 32, 32]`` image: transposed convs, BatchNorm."""

    def __init__(self, noise: int = 16, width: int = 8) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(noise, width * 4, 4, 1, 0, bias=False),
            nn.BatchNorm2d(width * 4), nn.ReLU(True),
            nn.ConvTranspose2d(width * 4, width * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(width * 2), nn.ReLU(True),
            nn.ConvTranspose2d(width * 2, width, 4, 2, 1, bias=False),
            nn.BatchNorm2d(width), nn.ReLU(True),
            nn.ConvTranspose2d(width, 3, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, 16, 1, 1]`` noise to ``[b, 3, 32, 32]``."""
        return self.main(x)


class DCGANDiscriminator(nn.Module):
    """A ``[b, 3, 32, 32]`` image to a probability: strided convs, LeakyReLU, Sigmoid."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(3, width, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(width, width * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(width * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(width * 2, width * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(width * 4),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(width * 4, 1, 4, 1, 0, bias=False), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, 3, 32, 32]`` to ``[b]`` probabilities."""
        return self.main(x).view(-1, 1).squeeze(1)


class MNIST(nn.Module):
    """LeNet-like: convs and linears as modules, pooling and activations in ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, 1, 28, 28]`` to ``[b, 10]`` log-probabilities."""
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.dropout(F.relu(self.fc1(x)), training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


class Fire(nn.Module):
    """SqueezeNet's squeeze then two expands, concatenated."""

    def __init__(self, inplanes: int, squeeze: int, expand: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(inplanes, squeeze, kernel_size=1)
        self.squeeze_activation = nn.ReLU(inplace=True)
        self.expand1x1 = nn.Conv2d(squeeze, expand, kernel_size=1)
        self.expand1x1_activation = nn.ReLU(inplace=True)
        self.expand3x3 = nn.Conv2d(squeeze, expand, kernel_size=3, padding=1)
        self.expand3x3_activation = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Squeezed, then both expands side by side."""
        x = self.squeeze_activation(self.squeeze(x))
        return torch.cat([self.expand1x1_activation(self.expand1x1(x)),
                          self.expand3x3_activation(self.expand3x3(x))], 1)


class SqueezeNet(nn.Module):
    """SqueezeNet 1.1 at an eighth of the width: ceil-mode max pools, Fire modules."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, kernel_size=3, stride=2), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            Fire(8, 2, 8), Fire(16, 2, 8),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            Fire(16, 4, 16), Fire(32, 4, 16))
        self.classifier = nn.Sequential(nn.Dropout(p=0.5), nn.Conv2d(32, classes, kernel_size=1),
                                        nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d((1, 1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, 3, h, w]`` to ``[b, classes]``."""
        return self.classifier(self.features(x)).view(x.size(0), -1)


class SuperResolution(nn.Module):
    """Convs then a pixel shuffle that upscales by 2 (the ONNX tutorial's model)."""

    def __init__(self, upscale: int = 2) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.conv1 = nn.Conv2d(1, 16, 5, 1, 2)
        self.conv2 = nn.Conv2d(16, 16, 3, 1, 1)
        self.conv3 = nn.Conv2d(16, 8, 3, 1, 1)
        self.conv4 = nn.Conv2d(8, upscale ** 2, 3, 1, 1)
        self.pixel_shuffle = nn.PixelShuffle(upscale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, 1, h, w]`` to ``[b, 1, 2h, 2w]``."""
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        x = self.relu(self.conv3(x))
        return self.pixel_shuffle(self.conv4(x))


class ResidualBlock(nn.Module):
    """SRResNet's block: conv, BatchNorm, PReLU, conv, BatchNorm, plus the input."""

    def __init__(self, filters: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(filters, filters, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(filters)
        self.prelu = nn.PReLU(filters)
        self.conv2 = nn.Conv2d(filters, filters, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(filters)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The input plus the block's residual."""
        return x + self.bn2(self.conv2(self.prelu(self.bn1(self.conv1(x)))))


class SRResNet(nn.Module):
    """Two residual blocks, a skip, one upscale block (conv, pixel shuffle, PReLU)."""

    def __init__(self, filters: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, filters, 9, padding=4)
        self.prelu1 = nn.PReLU(filters)
        self.residual_block1 = nn.Sequential(ResidualBlock(filters))
        self.residual_block2 = nn.Sequential(ResidualBlock(filters))
        self.skip_conv = nn.Conv2d(filters, filters, 3, padding=1, bias=False)
        self.skip_bn = nn.BatchNorm2d(filters)
        self.upscale = nn.Sequential(nn.Conv2d(filters, 4 * filters, 3, padding=1),
                                     nn.PixelShuffle(2), nn.PReLU(filters))
        self.output_conv = nn.Conv2d(filters, 3, 9, padding=4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, 3, h, w]`` to ``[b, 3, 2h, 2w]``."""
        start = self.prelu1(self.conv1(x))
        x = self.residual_block2(self.residual_block1(start))
        x = self.skip_bn(self.skip_conv(x)) + start
        return self.output_conv(self.upscale(x))


class WordLanguageModel(nn.Module):
    """Embedding, a two-layer LSTM or GRU from a zero state, a linear decoder."""

    def __init__(self, cell: str, width: int = 16) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.encoder = nn.Embedding(VOCAB, width)
        self.rnn = getattr(nn, cell)(width, width, 2, dropout=0.2)
        self.decoder = nn.Linear(width, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[time, batch]`` token ids to ``[time, batch, vocab]`` logits."""
        output, _ = self.rnn(self.drop(self.encoder(tokens)))
        return self.decoder(self.drop(output))


class BidirectionalLSTM(nn.Module):
    """A bidirectional LSTM over a sequence, batch first, its outputs flattened."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(16, 8, 1, batch_first=True, bidirectional=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, time, 16]`` to ``[b, time * 16]``, plus the final states' sum."""
        output, (hidden, _) = self.lstm(x)
        return output.flatten(1) + hidden.sum()


class LSTMCellTwice(nn.Module):
    """One ``nn.LSTMCell`` stepping twice, over the first two time steps."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(16, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The cell over steps 0 and 1 of ``[b, 2, 16]``, then a linear head."""
        hidden, state = self.cell(x[:, 0])
        hidden, state = self.cell(x[:, 1], (hidden, state))
        return self.head(hidden)


class EmbeddingSequence(nn.Module):
    """``nn.Sequential(Embedding, Linear, Sigmoid)`` over token ids."""

    def __init__(self) -> None:
        super().__init__()
        self.seq = nn.Sequential(nn.Embedding(VOCAB, 8), nn.Linear(8, 4), nn.Sigmoid())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids to ``[b, time, 4]`` probabilities."""
        return self.seq(tokens)


class DummyNet(nn.Module):
    """LeakyReLU, BatchNorm, a padded average pool; flattened (``op_test``'s net)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.LeakyReLU(0.02), nn.BatchNorm2d(4),
                                      nn.AvgPool2d(kernel_size=3, stride=2, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[b, 4, h, w]`` to one flat vector."""
        return self.features(x).view(-1, 1).squeeze(1)


class PReluNet(nn.Module):
    """A linear then ``nn.PReLU`` with a slope per channel."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)
        self.features = nn.Sequential(nn.PReLU(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """A 1x1 conv, then PReLU."""
        return self.features(self.conv(x))


class MulNextToGelu(nn.Module):
    """The model's own ``x * 2.0`` beside ``F.gelu``, whose decomposition has Muls too."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``gelu(h) + h * 2.0`` of the linear's output ``h``."""
        h = self.linear(x)
        return F.gelu(h) + h * 2.0


def _floats(shape: tuple[int, ...]) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda generator: generator.standard_normal(shape).astype(np.float32)


def _ids(shape: tuple[int, ...]) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda generator: generator.integers(0, VOCAB, shape).astype(np.int64)


#: name: (model class and arguments, input)
MODEL_DEFS: dict[str, tuple[Callable[[], nn.Module], Callable]] = {
    "dcgan-generator": (DCGANGenerator, _floats((2, 16, 1, 1))),
    "dcgan-discriminator": (DCGANDiscriminator, _floats((2, 3, 32, 32))),
    "mnist": (MNIST, _floats((2, 1, 28, 28))),
    "squeezenet": (SqueezeNet, _floats((1, 3, 64, 64))),
    "super-resolution": (SuperResolution, _floats((1, 1, 16, 16))),
    "srresnet": (SRResNet, _floats((1, 3, 16, 16))),
    "word-lm-lstm": (lambda: WordLanguageModel("LSTM"), _ids((8, 2))),
    "word-lm-gru": (lambda: WordLanguageModel("GRU"), _ids((8, 2))),
    "lstm-bidirectional": (BidirectionalLSTM, _floats(SEQUENCE)),
    "lstm-cell-twice": (LSTMCellTwice, _floats((2, 2, 16))),
    "embedding-sequence": (EmbeddingSequence, _ids(TOKENS)),
    "dummy-net": (DummyNet, _floats(IMAGE)),
    "prelu-net": (PReluNet, _floats(IMAGE)),
    "mul-next-to-gelu": (MulNextToGelu, _floats(SEQUENCE)),
}


def build_model_def(name: str) -> tuple[nn.Module, np.ndarray]:
    """Model ``name`` of :data:`MODEL_DEFS`, seeded, eval mode, and its input."""
    make_model, make_input = MODEL_DEFS[name]
    torch.manual_seed(0)
    model = _randomise_norm_statistics(make_model())
    return model, make_input(np.random.default_rng(0))


# -- single ops ----------------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    """One op: how it is called on the scaled input, its input, its own parameters."""

    call: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    """``call(module, h)``: the op on ``h``, its parameters read off ``module``."""
    shape: tuple[int, ...] = SEQUENCE
    params: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """Parameters the op takes (a weight, a bias), by name and shape."""
    buffers: tuple[tuple[str, Callable[[], torch.Tensor]], ...] = ()
    """Constant tensors the op takes (indices, a target, running statistics)."""
    tokens: bool = False
    """The input is token ids (``embedding``): scaled after the op, not before."""


def _index(*shape: int, high: int = 16) -> Callable[[], torch.Tensor]:
    return lambda: torch.randint(0, high, shape, generator=torch.Generator().manual_seed(2))


_W, _B = ("weight", (16,)), ("bias", (16,))
_CHANNEL_W, _CHANNEL_B = ("weight", (4,)), ("bias", (4,))
SINGLE_OPS: dict[str, Op] = {
    "softmax": Op(lambda m, h: F.softmax(h, dim=-1)),
    "log_softmax": Op(lambda m, h: F.log_softmax(h, dim=-1)),
    "layer_norm": Op(lambda m, h: F.layer_norm(h, (16,), m.weight, m.bias), params=(_W, _B)),
    "group_norm": Op(lambda m, h: F.group_norm(h, 2, m.weight, m.bias), IMAGE,
                     (_CHANNEL_W, _CHANNEL_B)),
    "instance_norm": Op(lambda m, h: F.instance_norm(h, weight=m.weight, bias=m.bias), IMAGE,
                        (_CHANNEL_W, _CHANNEL_B)),
    "batch_norm": Op(lambda m, h: F.batch_norm(h, m.mean, m.var, m.weight, m.bias), IMAGE,
                     (_CHANNEL_W, _CHANNEL_B),
                     (("mean", lambda: torch.linspace(-0.2, 0.2, 4)),
                      ("var", lambda: torch.linspace(0.5, 1.5, 4)))),
    "conv1d": Op(lambda m, h: F.conv1d(h, m.weight, m.bias, padding=1), (2, 8, 16),
                 (("weight", (8, 8, 3)), ("bias", (8,)))),
    "conv2d": Op(lambda m, h: F.conv2d(h, m.weight, m.bias, padding=1), IMAGE,
                 (("weight", (4, 4, 3, 3)), _CHANNEL_B)),
    "conv_transpose2d": Op(lambda m, h: F.conv_transpose2d(h, m.weight, m.bias, stride=2),
                           IMAGE, (("weight", (4, 4, 3, 3)), _CHANNEL_B)),
    "avg_pool2d": Op(lambda m, h: F.avg_pool2d(h, 3, 2, 1, count_include_pad=False), IMAGE),
    "max_pool2d": Op(lambda m, h: F.max_pool2d(h, 3, 1, 1), IMAGE),
    "adaptive_avg_pool2d": Op(lambda m, h: F.adaptive_avg_pool2d(h, 2), IMAGE),
    "adaptive_max_pool2d": Op(lambda m, h: F.adaptive_max_pool2d(h, 2), IMAGE),
    "interpolate_nearest": Op(lambda m, h: F.interpolate(h, scale_factor=2.0), IMAGE),
    "interpolate_bilinear": Op(lambda m, h: F.interpolate(h, scale_factor=2.0, mode="bilinear"),
                               IMAGE),
    "pixel_shuffle": Op(lambda m, h: F.pixel_shuffle(h, 2), IMAGE),
    "cumsum": Op(lambda m, h: torch.cumsum(h, dim=-1)),
    "topk": Op(lambda m, h: torch.topk(h, 4, dim=-1).values),
    "sort": Op(lambda m, h: torch.sort(h, dim=-1).values),
    "gather": Op(lambda m, h: torch.gather(h, -1, m.index), buffers=(("index", _index(2, 8, 4)),)),
    "index_select": Op(lambda m, h: torch.index_select(h, -1, m.index),
                       buffers=(("index", _index(5)),)),
    "masked_fill": Op(lambda m, h: h.masked_fill(h > 0.5, 0.0)),
    "where": Op(lambda m, h: torch.where(h > 0, h, 0.1 * h)),
    "clamp": Op(lambda m, h: torch.clamp(h, -0.5, 0.5)),
    "pow": Op(lambda m, h: torch.pow(h.abs() + 0.5, 1.5)),
    "sqrt": Op(lambda m, h: torch.sqrt(h.abs() + 1e-3)),
    "erf": Op(lambda m, h: torch.erf(h)),
    "gelu": Op(lambda m, h: F.gelu(h)),
    "gelu_tanh": Op(lambda m, h: F.gelu(h, approximate="tanh")),
    "silu": Op(lambda m, h: F.silu(h)),
    "hardswish": Op(lambda m, h: F.hardswish(h)),
    "elu": Op(lambda m, h: F.elu(h)),
    "leaky_relu": Op(lambda m, h: F.leaky_relu(h, 0.1)),
    "prelu": Op(lambda m, h: F.prelu(h, m.weight), IMAGE, (_CHANNEL_W,)),
    "mish": Op(lambda m, h: F.mish(h)),
    "embedding": Op(lambda m, h: F.embedding(h, m.weight), TOKENS, (("weight", (VOCAB, 16)),),
                    tokens=True),
    "einsum": Op(lambda m, h: torch.einsum("bij,jk->bik", h, m.weight),
                 params=(("weight", (16, 8)),)),
    "bmm": Op(lambda m, h: torch.bmm(h, h.transpose(1, 2))),
    "matmul": Op(lambda m, h: torch.matmul(h, m.weight), params=(("weight", (16, 8)),)),
    "linear": Op(lambda m, h: F.linear(h, m.weight, m.bias),
                 params=(("weight", (8, 16)), ("bias", (8,)))),
    "std": Op(lambda m, h: torch.std(h, dim=-1)),
    "var": Op(lambda m, h: torch.var(h, dim=-1, keepdim=True)),
    "logsumexp": Op(lambda m, h: torch.logsumexp(h, dim=-1)),
    "norm": Op(lambda m, h: torch.linalg.vector_norm(h, dim=-1)),
    "normalize": Op(lambda m, h: F.normalize(h, dim=-1)),
    "cross_entropy": Op(lambda m, h: F.cross_entropy(h, m.target, reduction="none"), (8, 16),
                        buffers=(("target", _index(8)),)),
    "scaled_dot_product_attention": Op(lambda m, h: F.scaled_dot_product_attention(h, h, h),
                                       (2, 2, 8, 8)),
}


class OpCall(nn.Module):
    """The op of one :class:`Op` with its parameters: the op's own module, or the model."""

    def __init__(self, op: Op) -> None:
        super().__init__()
        self.op = op
        generator = torch.Generator().manual_seed(3)
        for name, shape in op.params:
            value = torch.randn(shape, generator=generator) * 0.5
            self.register_parameter(name, nn.Parameter(value + (1.0 if name == "weight" and
                                                                len(shape) == 1 else 0.0)))
        for name, make in op.buffers:
            self.register_buffer(name, make())

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """The op on ``h``."""
        return self.op.call(self, h)


class DirectOp(OpCall):
    """``op(x * scale) + shift`` with the op called in this model's own ``forward``."""

    def __init__(self, op: Op) -> None:
        super().__init__(op)
        self.scale = nn.Parameter(torch.tensor([1.25]))
        self.shift = nn.Parameter(torch.tensor([0.1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``op(x * scale) + shift``; for token ids, ``op(x) * scale + shift``."""
        if self.op.tokens:
            return self.op.call(self, x) * self.scale + self.shift
        return self.op.call(self, x * self.scale) + self.shift


class SubmoduleOp(nn.Module):
    """``op(x * scale) + shift`` with the op called by a submodule (``self.op``)."""

    def __init__(self, op: Op) -> None:
        super().__init__()
        self.tokens = op.tokens
        self.op = OpCall(op)
        self.scale = nn.Parameter(torch.tensor([1.25]))
        self.shift = nn.Parameter(torch.tensor([0.1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``self.op(x * scale) + shift``; for token ids, ``self.op(x) * scale + shift``."""
        if self.tokens:
            return self.op(x) * self.scale + self.shift
        return self.op(x * self.scale) + self.shift


FORMS = {"direct": DirectOp, "submodule": SubmoduleOp}


def build_single_op(name: str) -> tuple[nn.Module, np.ndarray]:
    """``OP/FORM`` (``softmax/direct``) of :data:`SINGLE_OPS` and its input."""
    op_name, form = name.split("/")
    op = SINGLE_OPS[op_name]
    torch.manual_seed(0)
    model = FORMS[form](op).eval()
    generator = np.random.default_rng(0)
    x = (generator.integers(0, VOCAB, op.shape).astype(np.int64) if op.tokens
         else generator.standard_normal(op.shape).astype(np.float32))
    return model, x


SINGLE_OP_MODELS = [f"{op}/{form}" for op in SINGLE_OPS for form in FORMS]
