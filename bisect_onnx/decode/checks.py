"""What a decode run checks before PyTorch or the runtime runs, and its prompt.

Each refusal is one line that says what to pass: token ids the model has no row for, a
prompt and steps past the model's positions, a file whose batch or lengths are fixed
where the steps feed others, and caches (with the kept logits) over the memory budget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.decode.file_graph import Shapes, static_dim
from bisect_onnx.errors import InputError, UsageError, one_line

if TYPE_CHECKING:
    from bisect_onnx.decode.flat_cache import DecoderStep
    from bisect_onnx.decode.layout import CacheLayout
    from bisect_onnx.decode.options import DecodeOptions
    from bisect_onnx.pipeline.options import RuntimeOptions

__all__ = ["prompt_tokens", "token_ids", "check_fixed_axes", "check_before_export",
           "check_positions", "check_memory", "stacking_fits"]


def prompt_tokens(prompt: object, decode: DecodeOptions, step: DecoderStep, shapes: Shapes,
                  layout: CacheLayout) -> np.ndarray:
    """The prompt as ``[batch, sequence]`` int64: given, or drawn from the vocabulary."""
    if prompt is not None:
        array = token_ids(prompt)
        _check_vocabulary(array, step.vocab_size or static_dim(shapes, layout.logits, -1),
                          step.name)
        return array
    vocab = step.vocab_size or static_dim(shapes, layout.logits, -1)
    if vocab is None:
        raise UsageError(f"the vocabulary of {step.name} is unknown, so no random prompt can "
                         "be drawn; pass one (--input ids.npy, prompt= in Python)")
    generator = np.random.default_rng(decode.seed)
    return generator.integers(0, vocab, size=(1, decode.prompt_length), dtype=np.int64)


def token_ids(prompt: object) -> np.ndarray:
    """A given prompt as ``[batch, sequence]`` int64, or a one-line refusal of what it is.

    Checked as soon as the prompt is read (the command line does, before the model is
    built), and again by the run.
    """
    try:
        array = np.asarray(prompt.numpy() if hasattr(prompt, "numpy") else prompt)
    except ValueError as error:  # ragged lists: rows of different lengths
        raise InputError(f"the prompt's rows are of different lengths ({one_line(error)}); "
                         "pass token ids of one length per row, [batch, sequence]") from error
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim == 2 and array.size == 0:
        raise InputError(f"the prompt is empty (shape {list(array.shape)}, no token ids); pass "
                         "at least one token id")
    if array.ndim != 2 or not np.issubdtype(array.dtype, np.integer):
        raise InputError(f"the prompt must be token ids, [sequence] or [batch, sequence] "
                         f"integers, got {array.dtype} of shape {list(array.shape)}; pass "
                         "a .npy of token ids")
    return array.astype(np.int64)


def check_fixed_axes(shapes: Shapes, layout: CacheLayout, prompt: tuple[int, ...],
                     steps: int) -> None:
    """Refuse a file whose batch or a length is fixed where the steps feed another size.

    ONNX Runtime would refuse the first such run, naming only the input's indices. A
    size the run always feeds is fine: a step of one token on a file fixed at one.
    ``prompt``: the prompt's shape, ``[batch, sequence]``.
    """
    length = prompt[1]
    tokens = {length} | ({1} if steps else set())  # the prompt, then one token a step
    fed = {layout.tokens: (1, tokens), layout.mask: (1, set(range(length, length + steps + 1))),
           # The prefill's past is empty, then holds the positions so far.
           **{name: (2, {0} | set(range(length, length + steps)))
              for pair in layout.past for name in pair}}
    if layout.positions:
        fed[layout.positions] = (1, tokens)
    for name, (axis, sizes) in fed.items():
        batch = static_dim(shapes, name, 0)
        if batch is not None and batch != prompt[0]:
            raise InputError(f"the ONNX file's input {name} has its batch fixed at {batch} "
                             f"and the prompt has {prompt[0]} rows; pass a prompt of "
                             f"{batch} row(s), or an export whose batch axis is dynamic")
        fixed = static_dim(shapes, name, axis)
        if fixed is not None and sizes != {fixed}:
            raise InputError(f"the ONNX file's input {name} has its length (axis {axis}) "
                             f"fixed at {fixed}, and this run feeds it "
                             f"{_sizes(sizes)}; pass an export whose sequence axes are "
                             "dynamic (dynamic_axes, or dynamic_shapes with the dynamo "
                             "exporter)")


def _sizes(sizes: set[int]) -> str:
    ordered = sorted(sizes)
    if len(ordered) > 3 and ordered[1:] == list(range(ordered[1], ordered[-1] + 1)):
        return f"{ordered[0]}, then {ordered[1]} to {ordered[-1]}"
    return ", ".join(map(str, ordered))


def _check_vocabulary(prompt: np.ndarray, vocab: int | None, name: str) -> None:
    """Refuse token ids the embedding has no row for (an index error in PyTorch's forward)."""
    low, high = int(prompt.min()), int(prompt.max())
    if low < 0 or (vocab is not None and high >= vocab):
        bad = low if low < 0 else high
        known = f"0..{vocab - 1}" if vocab is not None else "0 or more"
        raise InputError(f"the prompt holds token id {bad}, and {name}'s vocabulary is "
                         f"{known}; pass token ids of this model's tokenizer")


def check_before_export(step: DecoderStep, prompt: object, decode: DecodeOptions, steps: int,
                         runtime: RuntimeOptions) -> None:
    """Refuse a prompt and steps past the model's positions or the memory budget.

    Before a long export: a given prompt that is not token ids is refused here too,
    and the memory is checked where the cache's shape is known (a ``transformers``
    model's, or ``cache_shape``).
    """
    shape = (1, decode.prompt_length) if prompt is None else token_ids(prompt).shape
    check_positions(step, shape, steps, drawn=prompt is None)
    if step.cache_tails is not None:
        empty = tuple(np.zeros((shape[0], tail[0], 0, *tail[1:]), dtype=np.float32)
                      for pair in step.cache_tails for tail in pair)
        check_memory(empty, shape, steps, runtime, step.vocab_size)


def check_positions(step: DecoderStep, prompt: tuple[int, ...], steps: int, *,
                    drawn: bool) -> None:
    """``prompt``: the prompt's shape, ``[batch, sequence]``; ``drawn``: a random one."""
    most = step.max_positions
    if most is None or prompt[1] + steps <= most:
        return
    need = (f"{'a random prompt' if drawn else 'a prompt'} of {prompt[1]} tokens and {steps} "
            f"steps need {prompt[1] + steps} positions and {step.name} has {most}")
    fixes = []
    if most - steps >= 1:  # a shorter prompt, these steps
        fixes.append(f"draw a shorter one (--prompt-length {most - steps} or less, "
                     "prompt_length= in Python)" if drawn
                     else f"pass a prompt of at most {most - steps} tokens (--input)")
    if most - prompt[1] >= 0:  # this prompt, fewer steps
        fixes.append(f"take at most {most - prompt[1]} --steps")
    raise InputError(f"{need}; {' or '.join(fixes) or 'pass a shorter prompt and fewer steps'}")


# Caches alive at once at the last step: PyTorch's state and outputs, the runtime's
# teacher-forced outputs, its free-running state and outputs, the introduced step's state.
_CACHE_COPIES = 6
# With the step's two runtime runs stacked into one: both states' caches fed at once,
# and both returned, while PyTorch's and the free-running state are alive.
_STACKED_COPIES = 8


def check_memory(empty: tuple[np.ndarray, ...], prompt: tuple[int, ...], steps: int,
                  runtime: RuntimeOptions, vocab: int | None) -> None:
    """Refuse steps whose caches and kept logits would not fit the memory budget.

    Before any runs. ``empty``: the prefill's cache (its shapes); ``prompt``: ``[batch,
    sequence]``; ``vocab``: the logits' last size, where known. PyTorch's logits of
    every step are kept while the runtime steps: the prompt's positions and one a step.
    """
    from bisect_onnx.runtime.memory import format_size

    positions = prompt[1] + steps
    logits = prompt[0] * positions * (vocab or 0) * 4
    need = _CACHE_COPIES * _cache_bytes(empty, prompt, steps) + logits
    budget = runtime.budget()
    if budget is not None and need > budget:
        kept = f" and {format_size(logits)} of logits kept" if logits else ""
        raise UsageError(f"{steps} steps on a prompt of {prompt[1]} tokens hold "
                         f"{format_size(need)} at once ({_CACHE_COPIES} copies of the cache "
                         f"at {positions} positions{kept}), over the memory budget of "
                         f"{format_size(budget)}; pass fewer --steps, a shorter prompt, or "
                         "a larger --max-memory")


def stacking_fits(empty: tuple[np.ndarray, ...], prompt: tuple[int, ...], steps: int,
                   runtime: RuntimeOptions) -> bool:
    """Whether the caches of a step's two runtime runs stacked into one fit the budget."""
    budget = runtime.budget()
    return budget is None or _STACKED_COPIES * _cache_bytes(empty, prompt, steps) <= budget


def _cache_bytes(empty: tuple[np.ndarray, ...], prompt: tuple[int, ...], steps: int) -> int:
    """One copy of the cache at the last step, float32."""
    per_position = sum(array.shape[0] * int(np.prod(array.shape[1:2] + array.shape[3:]))
                       for array in empty) * 4
    return (prompt[1] + steps) * per_position
