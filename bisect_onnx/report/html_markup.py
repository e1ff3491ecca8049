"""Markup helpers of the HTML report: escaped text, elements, sections, lists, the page.

Every string that comes from a report goes through :func:`escaped` (or an attribute of
:func:`element`, which escapes it); content passed as HTML is HTML already.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from bisect_onnx.report.formatting import format_module
from bisect_onnx.report.html_assets import SCRIPT, STYLE

if TYPE_CHECKING:  # types only: records import the report formats to show themselves
    from bisect_onnx.judge.records import Record

__all__ = ["TOLERANCE_RULE", "ROOT_MODULE", "breakable", "definitions", "element", "escaped",
           "mapping", "module_label", "page", "section", "table"]

#: How the root module (``""`` in the records and the JSON report) is named on the page,
#: as the terminal table names it.
ROOT_MODULE = "(model)"
# Where a long name may wrap: after the separators of module paths and node names.
# (Not after "_": "node_linear_7" reads badly as "node_linear_" and "7".)
_SEPARATORS = re.compile(r"([./])")

#: The comparison rule in words, for the figures card and the chart legend.
TOLERANCE_RULE = "|onnx − torch| > atol + rtol · |torch|"
_VOID_ELEMENTS = frozenset({"col", "input", "meta", "wbr"})


def escaped(value: object) -> str:
    """Any value as escaped HTML text."""
    return html.escape(str(value), quote=True)


def breakable(value: object) -> str:
    """A long name (module path, node name) as escaped HTML, wrapping after separators.

    It breaks only after ``.`` or ``/``, never inside a word or a number.
    """
    return _SEPARATORS.sub(r"\1<wbr>", escaped(value))


def module_label(record: Record) -> str:
    """The record's module as the page names it: ``(model)`` for the root module."""
    return format_module(record) or ROOT_MODULE


def element(tag: str, content: str = "", **attributes: object) -> str:
    """``<tag ...>content</tag>``; ``content`` is HTML already, attribute values are escaped.

    A trailing underscore is dropped from an attribute name (``class_``) and other
    underscores become hyphens (``data_sort``); ``None`` and ``False`` leave it out.
    """
    parts = [tag]
    for name, value in attributes.items():
        if value is None or value is False:
            continue
        parts.append(f'{name.rstrip("_").replace("_", "-")}="{escaped(value)}"')
    opening = "<" + " ".join(parts) + ">"
    return opening if tag in _VOID_ELEMENTS else f"{opening}{content}</{tag}>"


def section(title: str, content: str, *, id_: str) -> str:
    """A titled section of the page."""
    return element("section", element("h2", escaped(title)) + content, id=id_)


def definitions(items: Iterable[tuple[str, str]]) -> str:
    """A ``<dl>`` of label and HTML value pairs."""
    rows = "".join(element("dt", escaped(label)) + element("dd", value) for label, value in items)
    return element("dl", rows) if rows else element("p", "(none recorded)", class_="muted")


def mapping(data: Mapping[str, object]) -> str:
    """A dict of the report (environment, reference, candidate) as a definition list."""
    return definitions((key.replace("_", " "), escaped(value)) for key, value in data.items())


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], **attributes: object) -> str:
    """A plain table; ``rows`` hold cells that are HTML already."""
    head = element("thead", element("tr", "".join(element("th", escaped(h)) for h in headers)))
    body = "".join(element("tr", "".join(element("td", cell) for cell in row)) for row in rows)
    return element("table", head + element("tbody", body), **attributes)


def page(title: str, body: str) -> str:
    """The HTML document around ``body``, with the inline style and script."""
    head = "".join([
        element("meta", charset="utf-8"),
        element("meta", name="viewport", content="width=device-width, initial-scale=1"),
        element("title", escaped(title)),
        element("style", STYLE),
    ])
    document = element("head", head) + element("body", body + element("script", SCRIPT))
    return "<!DOCTYPE html>\n" + element("html", document, lang="en") + "\n"
