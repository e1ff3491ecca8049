"""How a decode run steps: how many steps, which prompt, how the cache is named.

Light (no torch): the command line builds it while parsing.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bisect_onnx.errors import UsageError

if TYPE_CHECKING:
    # What add_arguments takes: the parser itself (its main group) or one of its groups.
    from argparse import _ActionsContainer as Arguments

__all__ = ["DecodeOptions"]


@dataclass(frozen=True)
class DecodeOptions:
    """The decode loop's settings beside the steps (see :func:`bisect_onnx.bisect_decode`)."""

    prompt_length: int = 8
    """Tokens of the random prompt drawn where none is given."""
    seed: int = 0
    """Seed of that prompt."""
    cache_names: Mapping[str, str] | None = None
    """From the standard names (``past_key_values.0.key``, ``present.0.value``,
    ``input_ids``, ``logits``) to an ONNX file's own, where they differ."""
    cache_shape: tuple[int, int, int] | None = None
    """``(layers, heads, head_dim)`` of a plain module's cache, to export it here (a
    ``transformers`` model and an ONNX file say it themselves)."""
    bisect_step: bool = True
    """Bisect the step where an error is introduced, with the pipeline of :func:`bisect`."""

    def __post_init__(self) -> None:
        if self.prompt_length < 1:
            raise UsageError(f"prompt_length must be at least 1, got {self.prompt_length}")
        if self.cache_shape is not None and (len(self.cache_shape) != 3 or min(
                self.cache_shape) < 1):
            raise UsageError(f"cache_shape must be (layers, heads, head_dim), each at least "
                             f"1, got {self.cache_shape!r}")

    @staticmethod
    def add_arguments(parser: Arguments) -> None:
        """``--steps``, ``--prompt-length``, ``--cache-name``, ``--cache-shape``."""
        group = parser.add_argument_group("decode loops (a decoder with a key/value cache)")
        group.add_argument("--steps", type=int, metavar="N",
                           help="run the prompt (--input: token ids .npy) and N greedy decode "
                           "steps, teacher-forced and free-running, and name the first "
                           "failing step (docs/decode.md)")
        # No default here: whether it was given is read off None (--input refuses it).
        group.add_argument("--prompt-length", type=int, metavar="N",
                           help="length of the random prompt drawn without --input (default "
                           f"{DecodeOptions.prompt_length})")
        group.add_argument("--cache-name", action="append", default=[],
                           metavar="STANDARD=NAME",
                           help="the --onnx file's name for a standard one "
                           "(past_key_values.0.key=past_0_k); repeat")
        group.add_argument("--cache-shape", metavar="L,H,D",
                           help="layers, heads and head size of a plain module's cache")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DecodeOptions:
        """The decode settings the command line asks for (``--seed`` seeds the prompt)."""
        length = cls.prompt_length if args.prompt_length is None else args.prompt_length
        if length < 1:  # as the command line names it (the API names its field)
            raise UsageError(f"--prompt-length takes 1 or more, got {length}")
        names = {}
        for pair in args.cache_name:
            standard, sep, theirs = pair.partition("=")
            if not sep or not standard or not theirs:
                raise UsageError(f"--cache-name takes STANDARD=NAME, got {pair!r}")
            names[standard] = theirs
        shape = None
        if args.cache_shape:
            try:
                layers, heads, dim = (int(part) for part in args.cache_shape.split(","))
            except ValueError:
                raise UsageError(f"--cache-shape takes L,H,D (three integers), got "
                                 f"{args.cache_shape!r}") from None
            shape = (layers, heads, dim)
            if min(shape) < 1:
                raise UsageError(f"--cache-shape takes L,H,D, each at least 1, got "
                                 f"{args.cache_shape!r}")
        return cls(prompt_length=length, seed=cls.seed if args.seed is None else args.seed,
                   cache_names=names or None,
                   cache_shape=shape)
