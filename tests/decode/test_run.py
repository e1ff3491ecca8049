"""What bisect_decode refuses before any step runs: the prompt, names, another file."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")

import bisect_onnx  # noqa: E402
from fixtures.decoders import tiny_gpt2, tiny_llama  # noqa: E402


@pytest.mark.parametrize("token, shown", [(100, "token id 100"), (-1, "token id -1")])
def test_a_token_outside_the_vocabulary_is_an_input_error(token, shown):
    prompt = np.array([[5, token]], dtype=np.int64)
    with pytest.raises(bisect_onnx.InputError, match=f"{shown}.*vocabulary is 0..99"):
        bisect_onnx.bisect_decode(tiny_gpt2(), prompt, steps=1)


def test_cache_names_without_an_onnx_file_are_refused():
    with pytest.raises(bisect_onnx.UsageError, match=r"give the file \(--onnx\)"):
        bisect_onnx.bisect_decode(tiny_gpt2(), steps=1, decode=bisect_onnx.DecodeOptions(
            cache_names={"past_key_values.0.key": "pk0"}))


def test_another_models_export_is_refused_naming_the_cache_shapes(tmp_path):
    path = tmp_path / "gpt2.onnx"
    bisect_onnx.bisect_decode(tiny_gpt2(), steps=0, export=bisect_onnx.ExportOptions(
        exporter="torchscript", save_to=path))
    with pytest.raises(bisect_onnx.UsageError, match=r"past_key_values.0.key is \[batch, 2, "
                       r"past, 16\] and LlamaForCausalLM's layer 0 cache is \[batch, 1"):
        bisect_onnx.bisect_decode(tiny_llama(), steps=1, onnx_model=path)
