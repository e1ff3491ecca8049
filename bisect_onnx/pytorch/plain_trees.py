"""Nested tuples, lists and dicts taken apart into leaves and put back, in plain Python.

What :func:`~bisect_onnx.pytorch.private_apis.tree_flatten` falls back on where torch's
pytree is missing: only these three containers are opened; anything else is one leaf.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeAlias, cast

__all__ = ["PlainSpec", "flatten_plain", "unflatten_plain"]

#: How :func:`flatten_plain` puts a tree back: ``None`` a leaf, else (container type,
#: the children's specs).
PlainSpec: TypeAlias = "tuple[type, list[PlainSpec] | dict[object, PlainSpec]] | None"


def flatten_plain(tree: object, leaves: list[object]) -> PlainSpec:
    """Append the leaves of ``tree`` to ``leaves``; how to put them back."""
    if type(tree) in (tuple, list):
        return type(tree), [flatten_plain(item, leaves)
                            for item in cast("Sequence[object]", tree)]
    if type(tree) is dict:
        return dict, {key: flatten_plain(value, leaves) for key, value in tree.items()}
    leaves.append(tree)
    return None


def unflatten_plain(leaves: Iterator[object], spec: PlainSpec) -> object:
    """The tree :func:`flatten_plain` took apart, made again from ``leaves``, in order."""
    if spec is None:
        return next(leaves)
    kind, children = spec
    if kind is dict:
        return {key: unflatten_plain(leaves, child)
                for key, child in cast("dict[object, PlainSpec]", children).items()}
    return kind(unflatten_plain(leaves, child) for child in cast("list[PlainSpec]", children))
