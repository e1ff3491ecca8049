"""Tiny Hugging Face models, randomly initialised from configs (nothing is downloaded).

Each is wrapped the way users export them (a module whose ``forward`` takes one tensor
and returns one), so the user's call site, the wrapper's line, is in every stack trace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

# Small enough that an export takes seconds: hidden size 32, two layers.
HIDDEN = 32
LAYERS = 2


class Wrapper(torch.nn.Module):
    """``model(**{argument: x})``'s first output, as a user's export script writes it."""

    def __init__(self, model: torch.nn.Module, argument: str) -> None:
        super().__init__()
        self.model = model
        self.argument = argument

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(**{self.argument: x})[0]  # the call site the records point back to


@dataclass(frozen=True)
class Architecture:
    """One architecture: how to build it, its input, and the exporters that export it."""

    name: str
    modeling_file: str
    """The transformers file its layers are defined in (``modeling_bert.py``)."""
    build: Callable[[], torch.nn.Module]
    make_input: Callable[[np.random.Generator], np.ndarray]
    exporters: tuple[str, ...]


def _tokens(generator: np.random.Generator) -> np.ndarray:
    return generator.integers(0, 100, (1, 8)).astype(np.int64)


def _image(generator: np.random.Generator) -> np.ndarray:
    return generator.standard_normal((1, 3, 32, 32)).astype(np.float32)


def _bert() -> torch.nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                        num_hidden_layers=LAYERS, num_attention_heads=4, vocab_size=100,
                        max_position_embeddings=64)
    return Wrapper(BertModel(config), "input_ids")


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaModel

    # Grouped-query attention (2 key-value heads for 4 query heads) and rotary embeddings.
    config = LlamaConfig(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                         num_hidden_layers=LAYERS, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=100, max_position_embeddings=64)
    return Wrapper(LlamaModel(config), "input_ids")


def gpt2(*, use_cache: bool = False) -> torch.nn.Module:
    """GPT-2 unwrapped: ``forward(input_ids, cache, attention_mask, ...)``, so an
    ``attention_mask`` given by position lands in the cache's place."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=LAYERS, n_embd=HIDDEN, n_head=2, vocab_size=100,
                        n_positions=64, use_cache=use_cache)
    return GPT2LMHeadModel(config).eval()


def _vit() -> torch.nn.Module:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                       num_hidden_layers=LAYERS, num_attention_heads=4, image_size=32,
                       patch_size=8)
    return Wrapper(ViTModel(config), "pixel_values")


def _gpt2_wrapped() -> torch.nn.Module:
    return Wrapper(gpt2(), "input_ids")


def _swin() -> torch.nn.Module:
    from transformers import SwinConfig, SwinModel

    # Two stages of one block each: shifted windows, relative position bias, patch merging.
    config = SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                        num_heads=[2, 2], window_size=4)
    return Wrapper(SwinModel(config), "pixel_values")


def _resnet() -> torch.nn.Module:
    from transformers import ResNetConfig, ResNetModel

    config = ResNetConfig(embedding_size=16, hidden_sizes=[16, HIDDEN], depths=[1, 1],
                          layer_type="basic")
    return Wrapper(ResNetModel(config), "pixel_values")


ARCHITECTURES = {
    "bert": Architecture("bert", "modeling_bert.py", _bert, _tokens,
                         ("dynamo", "torchscript")),
    # The TorchScript exporter has no GQA scaled_dot_product_attention (enable_gqa).
    "llama": Architecture("llama", "modeling_llama.py", _llama, _tokens, ("dynamo",)),
    "vit": Architecture("vit", "modeling_vit.py", _vit, _image, ("dynamo", "torchscript")),
    "resnet": Architecture("resnet", "modeling_resnet.py", _resnet, _image,
                           ("dynamo", "torchscript")),
    # The TorchScript exporter has no aten::diff (GPT-2's position ids from the mask).
    "gpt2": Architecture("gpt2", "modeling_gpt2.py", _gpt2_wrapped, _tokens, ("dynamo",)),
    # torch 2.13's dynamo exporter fails on Swin and T5 in its decompositions (a view on
    # non-contiguous strides); the TorchScript exporter takes both.
    "swin": Architecture("swin", "modeling_swin.py", _swin, _image, ("torchscript",)),
}


def _t5_encoder() -> torch.nn.Module:
    from transformers import T5Config, T5EncoderModel

    config = T5Config(d_model=HIDDEN, d_ff=2 * HIDDEN, num_layers=LAYERS, num_heads=4, d_kv=8,
                      vocab_size=100)
    return Wrapper(T5EncoderModel(config), "input_ids")


#: torch 2.13's dynamo exporter fails on T5 in its decompositions (pytorch/pytorch #136543).
T5_ENCODER = Architecture("t5", "modeling_t5.py", _t5_encoder, _tokens, ("torchscript",))
ARCHITECTURES["t5"] = T5_ENCODER
