"""PyTorch's fast paths the exporters do not take, turned off while PyTorch runs here.

In eval mode under ``no_grad``, ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``
run one fused op (``aten::_transformer_encoder_layer_fwd``, ``_native_multi_head_attention``):
nothing inside the layer has a value of its own, a TorchScript trace records that one op,
and its numbers are not the ones the exported graph implements. Both exporters trace the
plain path, so the reference must run it too: the same ops, the same numbers.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

__all__ = ["as_the_exporter_runs"]

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def as_the_exporter_runs() -> Iterator[None]:
    """Inside: attention layers take the path the exporters trace; the setting is put back."""
    import torch

    mha = getattr(torch.backends, "mha", None)
    getter = getattr(mha, "get_fastpath_enabled", None)
    setter = getattr(mha, "set_fastpath_enabled", None)
    if getter is None or setter is None:  # an older torch: nothing to turn off
        yield
        return
    enabled = getter()
    setter(False)
    try:
        yield
    finally:
        setter(enabled)
