"""The scale benchmark's decoder-only transformer: zero-argument factories and its inputs.

:class:`fixtures.architectures.GPT2`'s layout at hidden 2048, 16 heads, MLP 8192,
vocabulary 32000 (random weights, float32, nothing downloaded), on one sequence of 32
tokens so that activations stay small. A layer holds 50.4M parameters, the embeddings
67.6M (the LM head is tied to them):

- :func:`decoder_1b`: 19 layers, 1.02 billion parameters;
- :func:`decoder_3b`: 58 layers, 2.99 billion parameters.

Both are factories the CLI is given (``benchmarks/scale.py:decoder_1b``), so this module
has no side effects beyond making the repo importable. ``benchmarks/run.py`` measures
them; it sets :data:`LAYERS_VARIABLE` in every process it starts, so that a smoke run
(a few layers) builds the same model in the export, the CLI and the API alike.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# When set, the layer count of either factory (a process's one model).
LAYERS_VARIABLE = "BISECT_ONNX_SCALE_LAYERS"
LAYERS_1B = 19  # 19 x 50.4M + 67.6M: 1.02 billion parameters
LAYERS_3B = 58  # 58 x 50.4M + 67.6M: 2.99 billion (59 layers would be 3.04)
SEQUENCE = 32
VOCABULARY = 32000


def _decoder(default_layers: int):
    """The decoder at ``LAYERS_VARIABLE`` layers, else ``default_layers`` (eval mode)."""
    from fixtures.architectures import GPT2, TransformerConfig, _build

    layers = int(os.environ.get(LAYERS_VARIABLE, default_layers))
    config = TransformerConfig(layers=layers, hidden=2048, heads=16, intermediate=8192,
                               vocab=VOCABULARY, seq=SEQUENCE, max_positions=1024)
    return _build(GPT2, {"scale": config}, "scale", transformer_init=True)


def decoder_1b():
    """The ~1B-parameter decoder (19 layers unless ``LAYERS_VARIABLE`` says otherwise)."""
    return _decoder(LAYERS_1B)


def decoder_3b():
    """The ~3B-parameter decoder (58 layers unless ``LAYERS_VARIABLE`` says otherwise)."""
    return _decoder(LAYERS_3B)


def decoder_inputs() -> dict:
    """One sequence of random token ids, ``input_ids`` (1, 32) int64, seed 0."""
    import numpy as np

    ids = np.random.default_rng(0).integers(0, VOCABULARY, size=(1, SEQUENCE), dtype=np.int64)
    return {"input_ids": ids}
