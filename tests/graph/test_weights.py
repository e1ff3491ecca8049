"""Reading a weight's values leaves the model it was read from as it was."""

from __future__ import annotations

import onnx
import pytest
from onnx import numpy_helper
from onnx.external_data_helper import load_external_data_for_tensor

from bisect_onnx.reference.graph_digest import graph_digest
from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner
from fixtures.registry import FIXTURES, repo_path


def _as_older_onnx(tensor, base_dir=""):
    """``numpy_helper.to_array`` as onnx releases before 1.23 have it: the bytes it
    reads for an external tensor are written into that tensor."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        load_external_data_for_tensor(tensor, base_dir)
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
    return _TO_ARRAY(tensor)


_TO_ARRAY = numpy_helper.to_array


@pytest.mark.parametrize("older_onnx", [False, True])
def test_a_digest_leaves_the_model_read_in_place_as_it_was(tmp_path, monkeypatch,
                                                           older_onnx):
    path = tmp_path / "resnet_like.onnx"
    path.write_bytes(repo_path(FIXTURES["resnet_like"].onnx_file).read_bytes())
    runner = OnnxRuntimeRunner(path)
    before = runner.model.SerializeToString()
    expected = graph_digest(onnx.load(str(path)), tmp_path)
    if older_onnx:
        monkeypatch.setattr(numpy_helper, "to_array", _as_older_onnx)
    assert graph_digest(runner.model, tmp_path) == expected
    assert runner.model.SerializeToString() == before  # no weight copied into it
