"""A failing value nothing on the way to the failing outputs reads is not the culprit.

PyTorch and ONNX Runtime break a TopK's ties apart: its indices differ where values
tie, and nothing reads them here. A Mul inserted after its values makes the output
fail; before, the indices (the first failing row) were named, with the TopK.
"""

from __future__ import annotations

import torch

from tests.planting import inserted_after_first
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED


class _TiedTopK(torch.nn.Module):
    def forward(self, x):
        doubled = torch.cat([x, x], -1)  # every value twice: ties everywhere
        return doubled.topk(4, dim=-1).values.relu()


@LEGACY_EXPORTER_DEPRECATED
def test_indices_nothing_reads_are_not_named_for_a_divergence_after_them(tmp_path):
    torch.manual_seed(0)
    report, inserted = inserted_after_first(_TiedTopK().eval(), torch.randn(2, 5, 6),
                                            tmp_path, "TopK")
    indices = next(row for row in report.comparisons if row.fx_node == "topk[1]")
    assert indices.failed  # the ties, broken apart: a real difference, read by nothing
    assert report.first_divergence is not indices
    assert report.culprit is not None and report.culprit.onnx_node == inserted, report.summary()
