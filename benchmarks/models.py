"""Zero-argument factories of the full-size benchmark models, and of their inputs.

The models' are the CLI's ``FILE.py:FACTORY``; ``benchmarks/run.py`` calls both.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fixtures.architectures import ARCHITECTURES  # noqa: E402


def resnet50_full():
    """ResNet-50-like at full size (input 1x3x224x224)."""
    return ARCHITECTURES["resnet50"].factory("full")


def bert_base_full():
    """BERT-base-like at full size (12 layers, hidden 768, sequence 128)."""
    return ARCHITECTURES["bert_base"].factory("full")


def resnet50_full_inputs() -> dict:
    """The inputs of :func:`resnet50_full`: ``images`` (1, 3, 224, 224), seed 0."""
    return ARCHITECTURES["resnet50"].make_inputs("full")


def bert_base_full_inputs() -> dict:
    """The inputs of :func:`bert_base_full`: ``input_ids`` and ``attention_mask``, seed 0."""
    return ARCHITECTURES["bert_base"].make_inputs("full")


def bert_tiny_hf():
    """A tiny Hugging Face BERT from a config (hidden 32, 2 layers; ``transformers``)."""
    import torch
    from transformers import BertConfig, BertModel

    class FirstOutput(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=input_ids)[0]

    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, vocab_size=100, max_position_embeddings=64)
    return FirstOutput(BertModel(config)).eval()


def bert_tiny_hf_inputs() -> dict:
    """The inputs of :func:`bert_tiny_hf`: ``input_ids`` (1, 8) in [0, 100), seed 0."""
    import numpy as np

    return {"input_ids": np.random.default_rng(0).integers(0, 100, (1, 8)).astype(np.int64)}
