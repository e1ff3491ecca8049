"""Where a value came from: the module, the op, the ONNX node, the source line.

The dynamo exporter writes this into every ONNX node's ``metadata_props`` (it
survives ``onnx.save``); this module reads it, so that the rest of the code never
parses metadata strings itself.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["SourceLocation", "Provenance", "TorchMetadata", "read_torch_metadata", "short_op"]

NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
CLASS_HIERARCHY_KEY = "pkg.torch.onnx.class_hierarchy"
STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"
REWRITE_RULE_KEY = "pkg.onnxscript.rewriter.rule_name"

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
# Frames in installed packages are the library's lines, not the user's model.
_LIBRARY_MARKERS = ("/site-packages/", "/dist-packages/", "\\site-packages\\", "<frozen ")
_TORCH_MARKERS = ("/torch/", "\\torch\\")


@dataclass(frozen=True)
class SourceLocation:
    """A file and line in the user's code."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Provenance:
    """What one side knows about where a captured value came from.

    Fields a side cannot know stay ``None``: the PyTorch side knows the module and
    its call, the ONNX side the node, its op and whatever metadata the exporter left.
    """

    position: int
    """Order in which the side produced the value (graph order, hook order)."""
    module: str | None = None
    """Dotted module path (``layer1.0.bn1``); ``""`` is the model itself."""
    call: int = 0
    """Which call of ``module`` produced it (0 for the first), for reused modules."""
    module_class: str | None = None
    node: str | None = None
    """Name of the ONNX node that produced the value."""
    node_op: str | None = None
    torch_op: str | None = None
    """The ATen op the value was exported from (``aten.conv2d.default``)."""
    source: SourceLocation | None = None
    same_as: str | None = None
    """Name of an earlier value this module passed through unchanged (an eval-mode
    Dropout, ``nn.Identity``): exporters leave no node for such modules."""
    fx_node: str | None = None
    """The FX node the value is the output of (op-level values only)."""
    scopes: tuple[str, ...] = ()
    """Call names (``blocks.0``, ``relu@1``) of the module calls around an op-level
    value, outermost first: which module rows the op belongs to."""


@dataclass(frozen=True)
class TorchMetadata:
    """The torch exporter's metadata of one ONNX node, parsed."""

    scopes: tuple[str, ...]
    """Enclosing module paths, outermost (the model, ``""``) first."""
    fx_node: str | None
    """Name of the FX node the ONNX node was made from."""
    torch_op: str | None
    source: SourceLocation | None
    rewrite_rule: str | None = None
    """The onnxscript optimizer's rule that rewrote the node (``FuseBatchNormIntoConv``)."""


def read_torch_metadata(props: Mapping[str, str]) -> TorchMetadata | None:
    """Parse a node's torch metadata; ``None`` when the exporter left none."""
    raw_scopes = props.get(NAME_SCOPES_KEY)
    if raw_scopes is None:
        return None
    scopes = _literal_list(raw_scopes)
    hierarchy = _literal_list(props.get(CLASS_HIERARCHY_KEY, "[]"))
    torch_op = hierarchy[-1] if hierarchy and hierarchy[-1].startswith("aten.") else None
    # The last scope is the FX node's own name; the ones before it are module paths.
    return TorchMetadata(
        scopes=tuple(scopes[:-1]) if scopes else (),
        fx_node=scopes[-1] if scopes else None,
        torch_op=torch_op,
        source=user_source(props.get(STACK_TRACE_KEY, "")),
        rewrite_rule=props.get(REWRITE_RULE_KEY) or None,
    )


def user_source(stack_trace: str) -> SourceLocation | None:
    """The innermost frame of a stack trace that is the user's code.

    Frames inside installed packages are skipped; if only such frames exist (a
    model defined in an installed package, say ``transformers``), the innermost
    frame outside torch is taken instead.
    """
    frames = [
        SourceLocation(match["file"], int(match["line"])) for match in _FRAME.finditer(stack_trace)
    ]
    for wanted in (_is_user_frame, _is_not_torch_frame):
        chosen = [frame for frame in frames if wanted(frame.file)]
        if chosen:
            return chosen[-1]  # the trace lists the outermost frame first
    return None


def _is_user_frame(path: str) -> bool:
    return not any(marker in path for marker in _LIBRARY_MARKERS + _TORCH_MARKERS)


def _is_not_torch_frame(path: str) -> bool:
    return not any(marker in path for marker in _TORCH_MARKERS)


def _literal_list(text: str) -> list[str]:
    """Read a Python list literal of strings, as the exporter writes them."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return []
    return [str(item) for item in value] if isinstance(value, (list, tuple)) else []


def short_op(op: str) -> str:
    """``aten.linear`` for ``aten.linear.default``: the name users know."""
    parts = op.split(".")
    if len(parts) == 3 and parts[0] == "aten":
        return ".".join(parts[:2])
    return op
