"""A decoder as one step of tensors in and out: the form both exporters and the loop take.

A Hugging Face causal LM takes and returns its cache as a ``Cache`` object, which
neither exporter takes; :class:`FlatCacheDecoder` builds a ``DynamicCache`` from flat
tensors inside ``forward`` and returns the updated cache flat again, the way optimum's
ONNX export patches the model. A plain ``nn.Module`` whose ``forward`` already takes
``(input_ids, attention_mask, [position_ids], *past)`` and returns ``(logits, *present)``
is used as it is.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from bisect_onnx.decode.layout import POSITIONS, CacheLayout, standard_layout
from bisect_onnx.errors import ModelError, UsageError, one_line

__all__ = ["DecoderStep", "FlatCacheDecoder", "decoder_step", "float_type", "is_hf_decoder"]


@dataclass(frozen=True)
class DecoderStep:
    """What the loop knows of the PyTorch side: the step module and its cache's shapes."""

    module: torch.nn.Module
    """Takes ``layout.input_names()`` positionally, returns ``layout.output_names()``."""
    layout: CacheLayout
    cache_tails: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] | None
    """Each layer's key and value shape past batch and sequence (``(heads, head_dim)``);
    ``None`` where only the ONNX file can say (a plain module)."""
    max_positions: int | None
    """How many positions the model has (``n_positions``), where it says."""
    vocab_size: int | None
    name: str


def is_hf_decoder(model: object) -> bool:
    """Whether ``model`` is a ``transformers`` model (it was imported if it is one)."""
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(model, transformers.PreTrainedModel)


def decoder_step(model: torch.nn.Module, cache_shape: tuple[int, int, int] | None = None, *,
                 positions: bool = True) -> DecoderStep:
    """The step form of ``model``: wrapped for a Hugging Face decoder, as given otherwise.

    ``cache_shape``: ``(layers, heads, head_dim)`` of a plain module's cache, which
    its ``forward`` cannot say; ``None`` leaves it to the ONNX file. ``positions``:
    whether a Hugging Face decoder's step takes ``position_ids`` (else the model
    counts them from the cache, as for a file exported without them).
    """
    name = type(model).__name__
    if is_hf_decoder(model):
        if cache_shape is not None:
            raise UsageError(f"the cache's shape is read from {name} itself; drop cache_shape "
                             "(--cache-shape), which is for a plain module's cache")
        wrapper = FlatCacheDecoder(model, positions=positions)
        tails = wrapper.cache_tails()
        config = model.config
        most = getattr(config, "n_positions", None) or getattr(
            config, "max_position_embeddings", None)
        return DecoderStep(wrapper, standard_layout(len(tails), positions=positions), tails,
                           most, getattr(config, "vocab_size", None), name)
    parameters = list(inspect.signature(model.forward).parameters.values())
    if len(parameters) < 2:
        raise UsageError(f"{name}.forward takes ({', '.join(p.name for p in parameters)}); a "
                         "decoder to step takes (input_ids, attention_mask, [position_ids], "
                         "*past) and returns (logits, *present), or is a transformers causal LM")
    takes_positions = any(p.name == POSITIONS for p in parameters)
    tails = None
    layers = 0
    if cache_shape is not None:
        layers, heads, dim = cache_shape
        tails = tuple(((heads, dim), (heads, dim)) for _ in range(layers))
    step = DecoderStep(model, standard_layout(layers, positions=takes_positions), tails,
                       None, None, name)
    if tails is not None:
        _check_cache_shape(step, cache_shape)
    return step


def _check_cache_shape(step: DecoderStep, cache_shape: tuple[int, int, int]) -> None:
    """Refuse a ``cache_shape`` the module does not take, before anything is exported.

    The module steps two tokens on an empty cache of that shape, or one where two fail
    (a module that steps one token at a time); it must return the logits and each
    layer's key and value, ``[batch, heads, tokens, head_dim]``. Otherwise the exporter
    (or ONNX Runtime) would fail later, naming neither the shape nor the fix. A
    ``forward`` that fails on both may have another fault than the shape: that is a
    model error (exit 3), its message naming both.
    """
    layers, heads, dim = cache_shape
    given = f"--cache-shape {layers},{heads},{dim}"
    fix = "pass its layers, heads and head size (--cache-shape L,H,D, cache_shape= in Python)"
    past = [torch.zeros((1, heads, 0, dim), dtype=float_type(step.module) or torch.float32)
            for _ in range(2 * layers)]
    failure: Exception | None = None
    for tokens in (2, 1):
        head = [torch.zeros((1, tokens), dtype=torch.long),
                torch.ones((1, tokens), dtype=torch.long)]
        if step.layout.positions:
            head.append(torch.arange(tokens).unsqueeze(0))
        try:
            with torch.no_grad():
                outputs = step.module(*head, *past)
            break
        except Exception as error:  # a module's forward may raise anything
            failure = error
    else:
        raise ModelError(f"{step.name} fails on an empty cache of {given} "
                         f"({one_line(failure)}); if the shape is wrong, {fix}; else its "
                         "forward fails for another reason") from failure
    present = (tuple(outputs) if isinstance(outputs, (tuple, list)) else (outputs,))[1:]
    wrong = next((tensor for tensor in present
                  if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4
                  or (tensor.shape[1], tensor.shape[3]) != (heads, dim)), None)
    if len(present) != 2 * layers or wrong is not None:
        returned = (f"{len(present)} cache tensors" if wrong is None
                    else f"a cache entry of shape {list(wrong.shape)}"
                    if isinstance(wrong, torch.Tensor) else f"a {type(wrong).__name__}")
        raise UsageError(f"{step.name} returns {returned} on an empty cache of {given}, "
                         f"not {2 * layers} of [batch, {heads}, tokens, {dim}]; {fix}")


def float_type(module: torch.nn.Module) -> torch.dtype | None:
    """The float type of ``module``'s first float parameter: what its cache is in."""
    return next((parameter.dtype for parameter in module.parameters()
                 if parameter.is_floating_point()), None)


class FlatCacheDecoder(torch.nn.Module):
    """A ``transformers`` causal LM whose cache goes in and out as flat tensors.

    ``forward(input_ids, attention_mask, position_ids, *past)`` with ``past`` each
    layer's key then value, returns ``(logits, *present)`` in the same order; without
    ``position_ids`` where made with ``positions=False``.
    """

    def __init__(self, lm: torch.nn.Module, *, positions: bool = True) -> None:
        super().__init__()
        self.lm = lm
        self.positions = positions
        # A new module is in training mode: an exporter that puts the model in eval mode
        # and back would otherwise leave the LM training (its dropout on) after export.
        self.train(lm.training)
        parameters = inspect.signature(lm.forward).parameters
        # transformers 5 calls it ``cache``; 4.x ``past_key_values``.
        self.cache_keyword = "cache" if "cache" in parameters else "past_key_values"

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One step: the logits, then each layer's key and value with this step's added.

        ``rest``: ``position_ids`` (where the step takes them), then the cache.
        """
        past = rest[1:] if self.positions else rest
        keywords = {"position_ids": rest[0]} if self.positions else {}
        cache = _dynamic_cache(list(zip(past[0::2], past[1::2], strict=True)))
        # return_dict: a config made for TorchScript (torchscript=True) returns tuples.
        out = self.lm(input_ids=input_ids, attention_mask=attention_mask, use_cache=True,
                      return_dict=True, **keywords, **{self.cache_keyword: cache})
        returned = getattr(out, "cache", None)
        if returned is None:
            returned = out.past_key_values
        return (out.logits, *[tensor for pair in cache_pairs(returned) for tensor in pair])

    def cache_tails(self) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
        """Each layer's key and value shape past batch and sequence, from a one-token run.

        A ``transformers`` model that is not a causal LM with a cache (an encoder, an
        encoder-decoder, a model without its language-model head) is refused here, in
        one line, before anything is exported.
        """
        name = type(self.lm).__name__
        causal_lm = ("step a causal LM with its head (a transformers ...ForCausalLM), or a "
                     "module whose forward takes (input_ids, attention_mask, *past)")
        if getattr(self.lm.config, "is_encoder_decoder", False):
            raise UsageError(f"{name} is an encoder-decoder model, and --steps steps a "
                             f"decoder with its cache alone: {causal_lm}")
        try:
            with torch.no_grad():
                out = self.lm(input_ids=torch.zeros((1, 1), dtype=torch.long), use_cache=True,
                              return_dict=True)
        except Exception as error:
            raise ModelError(f"{name} failed on one token with use_cache=True "
                             f"({one_line(error)}); {causal_lm}") from error
        if getattr(out, "logits", None) is None:
            raise UsageError(f"{name} returns no logits (no language-model head); {causal_lm}")
        # Looked up among the output's own names: asked for ``past_key_values`` by its
        # old name, transformers 5 logs a deprecation to the terminal.
        entries = out if isinstance(out, Mapping) else vars(out)
        names = list(entries.keys())
        key = next((name for name in ("cache", "past_key_values") if name in names), None)
        returned = entries[key] if key is not None else None
        pairs = cache_pairs(returned) if returned is not None else []
        if not pairs:
            raise UsageError(f"{name} returned no cache with use_cache=True; a decoder to "
                             "step must return its key/value cache")
        return tuple((tuple(k.shape[1:2] + k.shape[3:]), tuple(v.shape[1:2] + v.shape[3:]))
                     for k, v in pairs)


def cache_pairs(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's (key, value) of a ``transformers`` cache, whichever version made it."""
    if hasattr(cache, "layers"):  # transformers 4.56 and later
        return [(layer.keys, layer.values) for layer in cache.layers]
    if hasattr(cache, "key_cache"):
        return list(zip(cache.key_cache, cache.value_cache, strict=True))
    return [(pair[0], pair[1]) for pair in cache]  # the legacy tuple of tuples


def _dynamic_cache(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """A ``DynamicCache`` holding ``pairs``, every layer keeping every position.

    Not the model's own layer kinds: a sliding-window layer keeps only its window,
    and its flat tensors would then no longer say how many positions came before (the
    next step's positions); the window is applied by the attention mask instead, over
    the whole cache, as optimum's exports of Mistral do.
    """
    from transformers import DynamicCache

    if _cache_takes_pairs():
        return DynamicCache(pairs)
    return DynamicCache.from_legacy_cache(tuple(pairs))


@functools.cache
def _cache_takes_pairs() -> bool:
    """Whether ``DynamicCache(pairs)`` makes a cache (newer transformers; else from_legacy).

    Asked once: reading the signature each step took a millisecond of a tiny decoder's
    33 steps.
    """
    from transformers import DynamicCache

    return "ddp_cache_data" in inspect.signature(DynamicCache.__init__).parameters
