"""An export made here again at other shapes, of a model whose ``forward`` takes ``*args``.

A decode step's module takes its cache as ``forward(input_ids, mask, *past)``: the dynamo
exporter binds ``dynamic_shapes`` to the signature, so the past tensors' shapes go as one
tuple for ``*past``. Given flat, one per input, the export failed (``inputs has 3
elements, dynamic_shapes has 7``) and the baked-shape check never ran for such a model.
"""

from __future__ import annotations

import numpy as np
from torch import nn

from bisect_onnx.pytorch.reexport import export_here, symbolic_call


class _Step(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, tokens, mask, *past):
        return self.proj(tokens * mask + sum(past))


def test_a_forward_taking_args_is_exported_with_its_free_dims(tmp_path):
    arrays = [np.ones((2, 4), np.float32) for _ in range(4)]
    free = {position: {0: "batch"} for position in range(4)}
    call = symbolic_call("dynamo", free, ["tokens", "mask", "past_0", "past_1"])

    made = export_here(_Step().eval(), arrays, call, tmp_path)

    assert made.failure is None and made.path is not None
    batch = made.graph.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch.dim_param  # the batch stayed free
