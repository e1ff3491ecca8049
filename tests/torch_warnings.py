"""torch's deprecation warnings that tests raise on purpose, each silenced by its message.

No test filters a whole category: a deprecation bisect-onnx itself triggers must show.
These marks go only on tests (or modules, where a fixture or helper makes the call)
that themselves call what torch deprecates: users still bring TorchScript models and
files from either exporter, so the tests make them too. Library calls are quieted
where the library makes them (``quiet_exporter``, ``_load_torchscript``).
"""

from __future__ import annotations

import pytest

#: torch 2.13 deprecates TorchScript (``torch.jit.trace``, ``script``, ``save``, ``load``
#: and ``trace_method``, which ``trace`` calls): tests build TorchScript models.
TORCH_JIT_DEPRECATED = pytest.mark.filterwarnings(
    r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning")

#: The dynamo exporter (torch 2.13) checks ``isinstance(treespec, LeafSpec)`` itself,
#: when it copies the program's tree specs: not a call of ours to change.
DYNAMO_LEAFSPEC_DEPRECATED = pytest.mark.filterwarnings(
    r"ignore:`isinstance\(treespec, LeafSpec\)` is deprecated:FutureWarning")

#: ``torch.onnx.export(dynamo=False)``: the legacy exporter says it is legacy, and one of
#: its own helpers calls a function torch marks for removal.
LEGACY_EXPORTER_DEPRECATED = pytest.mark.filterwarnings(
    "ignore:You are using the legacy TorchScript-based ONNX export:DeprecationWarning",
    "ignore:The feature will be removed:DeprecationWarning:"
    "torch.onnx._internal.torchscript_exporter")
