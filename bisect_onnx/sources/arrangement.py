"""Given inputs put in the order ``forward`` takes them, and checked against its parameters.

Named inputs (an ``.npz``, a ``torch.save`` dict) may name ``forward``'s parameters,
the ONNX graph's inputs, or be positional (``arr_0, arr_1, ...``); what cannot be
arranged is refused naming the parameters, which are required and which optional.
"""

from __future__ import annotations

import inspect
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.errors import InputError
from bisect_onnx.sources.graph_inputs import POSITIONAL_KEY

if TYPE_CHECKING:
    import torch

__all__ = ["forward_parameters", "arrange_inputs", "keyword_order", "graph_keyword_order",
           "check_input_count"]


def forward_parameters(model: torch.nn.Module) -> tuple[list[str], int, bool]:
    """``forward``'s parameter names, how many are required, and whether it takes ``*args``."""
    signature = inspect.signature(model.forward)
    names, required, variadic = [], 0, False
    for parameter in signature.parameters.values():
        if parameter.kind is parameter.VAR_POSITIONAL:
            variadic = True
        elif parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            names.append(parameter.name)
            required += parameter.default is parameter.empty
    return names, required, variadic


def arrange_inputs(
    given: Sequence[np.ndarray] | Mapping[str, np.ndarray],
    *,
    forward_names: Sequence[str],
    onnx_names: Sequence[str] | None = None,
    required: int | None = None,
    weight_names: Collection[str] = (),
) -> list[np.ndarray]:
    """Put the inputs in ``forward``'s order.

    Positional inputs are taken as given. Named inputs (an ``.npz``, a ``torch.save``
    dict) may name ``forward``'s parameters, the ONNX graph's inputs, or be ``arr_0,
    arr_1, ...``. ``required``: how many leading parameters have no default (all, when
    ``None``); ``weight_names``: the model's ``state_dict`` keys, to recognise a
    state_dict given as inputs.
    """
    if not isinstance(given, Mapping):
        return [np.asarray(array) for array in given]
    keys = list(given)
    if keys and all(POSITIONAL_KEY.fullmatch(key) for key in keys):
        order = sorted(keys, key=lambda key: int(key[4:]))
        if order != [f"arr_{i}" for i in range(len(order))]:
            raise InputError(f"the .npz keys {', '.join(order)} skip a position; "
                             f"expected arr_0 to arr_{len(order) - 1}")
        return [given[key] for key in order]
    for names in (forward_names, onnx_names or []):
        if names and set(keys) <= set(names) and _is_prefix_cover(keys, names):
            return [given[name] for name in names if name in given]
    wanted = ", ".join(forward_names) or "(none)"
    if keys and set(keys) <= set(weight_names):
        first = forward_names[0] if forward_names else "x"
        raise InputError(f"the inputs given ({_few(keys)}) are the model's weights (a "
                         f"state_dict), not forward's inputs; --input wants the tensors "
                         f"forward takes ({wanted}), e.g. torch.save({{'{first}': {first}}}, "
                         "path)")
    onnx = f"; ONNX inputs: {', '.join(onnx_names)}" if onnx_names else ""
    required = len(forward_names) if required is None else required
    missing = [name for name in forward_names[:required] if name not in given]
    optional = [name for name in forward_names[required:] if name not in given]
    extra = [key for key in keys if key not in forward_names and key not in (onnx_names or [])]
    detail = "; ".join(filter(None, [
        f"missing {', '.join(missing)}" if missing else "",
        f"optional: {', '.join(optional)}" if optional and (missing or extra) else "",
        f"unexpected {', '.join(extra)}" if extra else "",
    ]))
    raise InputError(f"the input names ({_few(keys)}) do not match forward's parameters "
                     f"({wanted}{onnx}){': ' + detail if detail else ''}; "
                     "name the inputs after them, or give them in order (arr_0, arr_1, ... "
                     "in an .npz)")


def _few(names: Sequence[str], shown: int = 8) -> str:
    """The first names of a list, and how many more (a state_dict has hundreds)."""
    more = f", ... ({len(names) - shown} more)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def keyword_order(
    given: Sequence[np.ndarray] | Mapping[str, np.ndarray],
    *,
    forward_names: Sequence[str],
    required: int,
) -> list[str] | None:
    """The parameters ``given`` names, in ``forward``'s order, when they must go by keyword.

    That is when they skip a parameter that has a default (``input_ids`` and
    ``token_type_ids`` without ``attention_mask``); a leading run of parameters
    goes by position. ``None`` when the inputs are positional.
    """
    if not isinstance(given, Mapping) or not set(given) <= set(forward_names):
        return None
    if _is_prefix_cover(list(given), forward_names):
        return None
    missing = [name for name in forward_names[:required] if name not in given]
    if missing:
        raise InputError(f"the inputs name {', '.join(given)} but forward also requires "
                         f"{', '.join(missing)}; give every required parameter")
    return [name for name in forward_names if name in given]


def graph_keyword_order(onnx_names: Sequence[str], *, forward_names: Sequence[str],
                        required: int) -> list[str]:
    """The names under which inputs in the ONNX graph's order go to ``forward``.

    Inputs the tool draws from the graph (or a list checked against it) are in the
    graph's order: where the graph's input names are ``forward``'s parameters but not
    its leading ones (GPT-2's ``input_ids, attention_mask`` skip its ``cache``),
    position would put the mask in the cache's place, so every input goes by name, in
    the graph's order. Empty (by position) when the names are a leading run, name
    something else (``input.1``), or leave out a required parameter.
    """
    names = list(onnx_names)
    if (not names or len(set(names)) != len(names) or not set(names) <= set(forward_names)
            or _is_prefix_cover(names, forward_names)
            or not set(forward_names[:required]) <= set(names)):
        return []
    return names


def _is_prefix_cover(keys: Sequence[str], names: Sequence[str]) -> bool:
    """Whether ``keys`` name a leading run of ``names`` (later ones may have defaults)."""
    return set(names[: len(keys)]) == set(keys)


def check_input_count(
    inputs: Sequence[np.ndarray], *, names: Sequence[str], required: int, variadic: bool,
    owner: str,
) -> None:
    """Refuse an input count ``owner.forward`` (with these parameters) cannot take."""
    if len(inputs) < required or (len(inputs) > len(names) and not variadic):
        optional = names[required:]
        missing = names[len(inputs):required]
        raise InputError(
            f"got {len(inputs)} input(s) but {owner}.forward takes "
            f"{required if required == len(names) else f'{required} to {len(names)}'} "
            f"({', '.join(names[:required])}"
            f"{'; optional: ' + ', '.join(optional) if optional else ''})"
            f"{': missing ' + ', '.join(missing) if missing else ''}; "
            "pass one --input per argument, in order"
        )
