"""The flat names of a decoder's inputs and outputs, and which cache entry is which layer's.

A decoder exported with its cache flattened takes ``input_ids``, ``attention_mask``,
(``position_ids``) and ``past_key_values.{i}.key``/``.value``, and returns ``logits``
and ``present.{i}.key``/``.value``: the names optimum and ``torch.onnx.export`` users
give them. A file named otherwise is read through a mapping from those names to its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bisect_onnx.errors import UsageError

__all__ = ["CacheLayout", "standard_layout", "layout_of_names", "TOKENS", "MASK", "POSITIONS",
           "LOGITS"]

TOKENS, MASK, POSITIONS, LOGITS = "input_ids", "attention_mask", "position_ids", "logits"

# optimum's and torch users' spellings: past_key_values.0.key, past_key_values_0_key,
# past.0.key; present.0.key, present_0_key, present_key_values.0.key.
_PAST = re.compile(r"^past(?:_key_values)?[._](\d+)[._](key|value)$")
_PRESENT = re.compile(r"^present(?:_key_values)?[._](\d+)[._](key|value)$")


@dataclass(frozen=True)
class CacheLayout:
    """Which input and output of the step is what, in the step's own order.

    ``past`` and ``present`` hold one ``(key, value)`` name pair per layer, layer 0
    first; the step's positional order is tokens, mask, positions (where it takes
    them), then each layer's past key and value.
    """

    tokens: str
    mask: str
    positions: str | None
    past: tuple[tuple[str, str], ...]
    logits: str
    present: tuple[tuple[str, str], ...]

    @property
    def layers(self) -> int:
        """How many layers' cache the step takes."""
        return len(self.past)

    def input_names(self) -> list[str]:
        """The step's inputs in its positional order."""
        head = [self.tokens, self.mask] + ([self.positions] if self.positions else [])
        return head + [name for pair in self.past for name in pair]

    def output_names(self) -> list[str]:
        """The step's outputs in its positional order."""
        return [self.logits] + [name for pair in self.present for name in pair]


def standard_layout(layers: int, *, positions: bool) -> CacheLayout:
    """The names this tool gives a decoder it exports (optimum's)."""
    pairs = tuple((f"past_key_values.{i}.key", f"past_key_values.{i}.value")
                  for i in range(layers))
    present = tuple((f"present.{i}.key", f"present.{i}.value") for i in range(layers))
    return CacheLayout(TOKENS, MASK, POSITIONS if positions else None, pairs, LOGITS, present)


def layout_of_names(inputs: Sequence[str], outputs: Sequence[str],
                    mapping: Mapping[str, str] | None = None) -> CacheLayout:
    """Match a file's input and output names to the cache's layers.

    ``mapping`` goes from the standard names (``past_key_values.0.key``, ``logits``)
    to the file's own; names it does not give are looked for as they are.
    """
    _check_mapping(mapping or {}, [*inputs, *outputs])
    renamed = {theirs: ours for ours, theirs in (mapping or {}).items()}
    ours_in = [renamed.get(name, name) for name in inputs]
    ours_out = [renamed.get(name, name) for name in outputs]
    if not any(map(_PAST.match, ours_in)) and not any(map(_PRESENT.match, ours_out)):
        raise UsageError(f"the ONNX file is not a decoder step with its cache: it takes "
                         f"{', '.join(inputs) or 'nothing'} and returns {', '.join(outputs)}; "
                         "pass an export that takes input_ids, attention_mask and "
                         "past_key_values.{i}.key/.value and returns logits and "
                         "present.{i}.key/.value (or map its own names with --cache-name)")
    for role, names in ((TOKENS, ours_in), (MASK, ours_in), (LOGITS, ours_out)):
        if role not in names:
            raise UsageError(f"the decoder has no {'output' if role == LOGITS else 'input'} "
                             f"named {role!r} (it has {', '.join(names)}); pass "
                             f"cache_names={{{role!r}: 'its name'}} (--cache-name "
                             f"{role}=NAME) to say which it is")
    past = _pairs(ours_in, _PAST, "input", "past_key_values.{i}.key")
    present = _pairs(ours_out, _PRESENT, "output", "present.{i}.key")
    if len(past) != len(present):
        raise UsageError(f"the decoder takes the cache of {len(past)} layers and returns "
                         f"that of {len(present)}; every layer needs both (names "
                         "past_key_values.{i}.key/.value in, present.{i}.key/.value out; "
                         "map others with cache_names= or --cache-name)")
    original = {ours: theirs for theirs, ours in zip(inputs, ours_in, strict=True)}
    original.update({ours: theirs for theirs, ours in zip(outputs, ours_out, strict=True)})

    def back(name: str) -> str:
        return original[name]

    leftover = [name for name in ours_in if name not in (TOKENS, MASK, POSITIONS)
                and not _PAST.match(name)]
    if leftover:
        raise UsageError(f"the decoder's input(s) {', '.join(map(back, leftover))} are neither "
                         "the tokens, the mask, the positions nor a layer's cache; map them "
                         "with cache_names= (--cache-name STANDARD=NAME), e.g. "
                         "past_key_values.0.key=NAME")
    return CacheLayout(back(TOKENS), back(MASK), back(POSITIONS) if POSITIONS in ours_in else None,
                       tuple((back(k), back(v)) for k, v in past), back(LOGITS),
                       tuple((back(k), back(v)) for k, v in present))


def _check_mapping(mapping: Mapping[str, str], names: Sequence[str]) -> None:
    """Refuse a mapping from a name that is not a standard one, or to one the file lacks."""
    for ours, theirs in mapping.items():
        if ours not in (TOKENS, MASK, POSITIONS, LOGITS) and not (
                _PAST.match(ours) or _PRESENT.match(ours)):
            raise UsageError(f"cache name {ours}={theirs}: {ours!r} is not a standard name; "
                             f"map one of {TOKENS}, {MASK}, {POSITIONS}, {LOGITS}, "
                             "past_key_values.{i}.key/.value or present.{i}.key/.value")
        if theirs not in names:
            raise UsageError(f"cache name {ours}={theirs}: the decoder has no input or output "
                             f"named {theirs!r} (it has {', '.join(names)}); map the "
                             "file's own name")
    mapped_twice = sorted({theirs for theirs in mapping.values()
                           if list(mapping.values()).count(theirs) > 1})
    if mapped_twice:
        standard = [ours for ours, theirs in mapping.items() if theirs == mapped_twice[0]]
        raise UsageError(f"cache names {', '.join(standard)} all map {mapped_twice[0]!r}; map "
                         "each of the file's names once")


def _pairs(names: Sequence[str], pattern: re.Pattern[str], side: str,
           example: str) -> list[tuple[str, str]]:
    """Each layer's (key, value) names, layer 0 first; refused where a layer is missing."""
    found: dict[int, dict[str, str]] = {}
    for name in names:
        match = pattern.match(name)
        if match:
            found.setdefault(int(match[1]), {})[match[2]] = name
    if not found:
        raise UsageError(f"none of the decoder's {side}s ({', '.join(names)}) is a layer's "
                         f"cache entry; name them {example}/.value or pass cache_names= "
                         "(--cache-name STANDARD=NAME) mapping those names to the file's")
    layers = sorted(found)
    missing = [f"{i}.{part}" for i in range(max(layers) + 1) for part in ("key", "value")
               if part not in found.get(i, {})]
    if missing:
        # The names that matched no role: most often the missing entries' own, renamed.
        unmatched = [name for name in names if not pattern.match(name)
                     and name not in (TOKENS, MASK, POSITIONS, LOGITS)]
        unknown = f" ({', '.join(unmatched)}: not a name read here)" if unmatched else ""
        more = ", …" if len(missing) > 4 else ""
        raise UsageError(f"the decoder's cache {side}s cannot be matched to its layers: "
                         f"{', '.join(missing[:4])}{more} missing{unknown}; every layer "
                         f"0..{max(layers)} "
                         f"needs a key and a value ({example}/.value), or map its names "
                         "with cache_names= (--cache-name STANDARD=NAME)")
    return [(found[i]["key"], found[i]["value"]) for i in layers]
