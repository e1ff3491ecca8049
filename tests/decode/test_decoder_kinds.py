"""Which models a decode run steps: a float16 decoder does; an encoder or an
encoder-decoder is refused in one line before anything is exported."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
import torch
import transformers

import bisect_onnx
from fixtures.decoders import PlainDecoder, tiny_llama
from tests.planting import scale_past_key


def test_a_float16_decoder_is_stepped_at_parity():
    model = tiny_llama().half()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    report = bisect_onnx.bisect_decode(model, np.array([[3, 14, 15, 9, 2]]), steps=4,
                                       export=bisect_onnx.ExportOptions(exporter="torchscript"))
    assert not report.diverged and len(report.rows) == 5
    # The file computes in float16: float16's tolerance, as for one forward.
    assert report.rtol == pytest.approx(1e-2)
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())


def _bert_config() -> transformers.BertConfig:
    return transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, intermediate_size=64,
                                   max_position_embeddings=64)


@pytest.mark.parametrize(("build", "problem"), [
    (lambda: transformers.BertModel(_bert_config()), "returns no logits"),
    (lambda: transformers.BertForMaskedLM(_bert_config()), "returned no cache"),
    (lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=2)),
     "is an encoder-decoder model"),
])
def test_a_model_that_is_not_a_causal_lm_with_a_cache_is_refused(build, problem):
    torch.manual_seed(0)
    with pytest.raises(bisect_onnx.UsageError, match=problem) as refused:
        bisect_onnx.bisect_decode(build().eval(), np.array([1, 2, 3]), steps=2)
    assert "\n" not in str(refused.value)


def test_a_float16_decoders_planted_past_key_is_named_at_its_node(tmp_path):
    model = tiny_llama().half()
    exported = tmp_path / "exported.onnx"
    bisect_onnx.bisect_decode(model, np.array([[3, 14, 15, 9, 2]]), steps=0, export=(
        bisect_onnx.ExportOptions(exporter="torchscript", save_to=exported)))
    planted = onnx.load(str(exported))
    scale_past_key(planted.graph, np.float16(1.5))
    onnx.save(planted, str(tmp_path / "planted.onnx"))

    report = bisect_onnx.bisect_decode(model, np.array([[3, 14, 15, 9, 2]]), steps=3,
                                       onnx_model=tmp_path / "planted.onnx")
    assert report.diverged and report.finding.step == 1
    assert report.bisection is not None and report.bisection.diverged
    assert "planted_scale" in report.finding.culprit


@pytest.mark.parametrize(("cache_shape", "error", "problem"), [
    # The forward fails: the shape, or another fault (exit 3, both named).
    ((1, 2, 8), bisect_onnx.ModelError, "fails on an empty cache of --cache-shape 1,2,8"),
    # The forward runs, and returns another cache than the shape says (exit 2).
    ((2, 1, 8), bisect_onnx.UsageError,
     "returns 2 cache tensors on an empty cache of --cache-shape 2,1,8, not 4"),
])
def test_a_cache_shape_the_module_does_not_take_is_refused_before_export(cache_shape, error,
                                                                         problem):
    with pytest.raises(error, match=problem) as refused:
        bisect_onnx.bisect_decode(PlainDecoder().eval(), np.array([1, 2, 3]), steps=1,
                                  decode=bisect_onnx.DecodeOptions(cache_shape=cache_shape))
    assert "\n" not in str(refused.value) and "--cache-shape L,H,D" in str(refused.value)


def test_a_cache_shape_for_a_transformers_model_is_refused():
    with pytest.raises(bisect_onnx.UsageError, match="read from LlamaForCausalLM itself"):
        bisect_onnx.bisect_decode(tiny_llama(), np.array([1, 2, 3]), steps=1,
                                  decode=bisect_onnx.DecodeOptions(cache_shape=(2, 1, 8)))


def test_a_model_that_returns_no_cache_is_refused_with_nothing_else_logged(caplog):
    """transformers 5 logs a deprecation (to the terminal) when its output is asked for
    ``past_key_values``: the cache is looked up by the output's own names instead."""
    logging.Logger.warning_once.cache_clear()  # transformers logs each message once
    torch.manual_seed(0)
    with pytest.raises(bisect_onnx.UsageError, match="returned no cache"):
        bisect_onnx.bisect_decode(transformers.BertForMaskedLM(_bert_config()).eval(),
                                  np.array([1, 2, 3]), steps=1)
    assert not [record for record in caplog.records if "deprecated" in record.getMessage()]


@pytest.mark.parametrize(("prompt", "problem"), [
    ([[1, 2], [3]], "rows are of different lengths"),
    (np.array([0.5, 1.5]), "must be token ids"),
])
def test_a_prompt_that_is_not_token_ids_is_refused_before_the_export(monkeypatch, prompt,
                                                                      problem):
    import bisect_onnx.decode.run as run

    def no_export(*args, **kwargs):
        raise AssertionError("exported before the prompt was checked")

    monkeypatch.setattr(run, "_onnx_file", no_export)
    with pytest.raises(bisect_onnx.InputError, match=problem):
        bisect_onnx.bisect_decode(tiny_llama(), prompt, steps=1)
