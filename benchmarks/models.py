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
