"""Real architectures (tiny Hugging Face configs): a check names the in-process culprit.

Both exporters where they export; each model clean and with a planted weight. Skipped
where ``transformers`` is not installed (the ``hf`` extra).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

pytest.importorskip("transformers")

import bisect_onnx  # noqa: E402
from tests.hf.architectures import ARCHITECTURES  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::bisect_onnx.BisectOnnxWarning")

CASES = [("bert", "dynamo"), ("bert", "torchscript"), ("vit", "dynamo"),
         ("resnet", "torchscript"), ("llama", "dynamo")]


def planted_weight(source, target) -> str:
    """The middle weighted node's weight scaled and shifted; the node's name."""
    model = onnx.load(str(source))
    weights = {init.name: index for index, init in enumerate(model.graph.initializer)}
    weighted = [node for node in model.graph.node if node.op_type in ("MatMul", "Gemm", "Conv")
                and any(name in weights for name in node.input)]
    node = weighted[len(weighted) // 2]
    index = next(weights[name] for name in node.input if name in weights)
    array = numpy_helper.to_array(model.graph.initializer[index])
    planted = (array * 1.5 + 0.05 * np.sign(array)).astype(array.dtype)
    model.graph.initializer[index].CopyFrom(numpy_helper.from_array(
        planted, model.graph.initializer[index].name))
    onnx.save(model, str(target))
    return node.name


@pytest.mark.parametrize(("name", "exporter"),
                         [case for case in CASES if case[1] in ARCHITECTURES[case[0]].exporters])
def test_check_names_the_culprit_on_real_models(tmp_path, name, exporter):
    import torch

    torch.manual_seed(0)
    arch = ARCHITECTURES[name]
    model = arch.build().eval()
    inputs = arch.make_input(np.random.default_rng(0))
    clean = tmp_path / "model.onnx"
    bisect_onnx.bisect(model, inputs,
                       export=bisect_onnx.ExportOptions(exporter=exporter, save_to=clean))
    planted = tmp_path / "planted.onnx"
    node = planted_weight(clean, planted)
    for path in (clean, planted):
        report = bisect_onnx.bisect(model, inputs, onnx_model=path)
        reference = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                       onnx_model=path)
        checked = bisect_onnx.check(reference)
        assert checked.verdict == report.verdict
        inside = report.inside_op
        if inside is not None and checked.culprit.onnx_node == inside.node:
            # The look inside the op was recorded (its translation evaluated on PyTorch's
            # values): the check names the node, and the value inside the op it names.
            assert checked.culprit.onnx_value == inside.value
            continue
        # The same culprit value; its node inside a multi-node op (a linear's MatMul
        # under its Add) is named by exporting the op alone, which needs PyTorch: the
        # check names the op's value, and says what needs PyTorch and where it runs.
        assert (checked.culprit and checked.culprit.onnx_value) == (
            report.culprit and report.culprit.onnx_value)
        if report.culprit is not None and checked.culprit.onnx_node != report.culprit.onnx_node:
            assert inside is not None and inside.node == report.culprit.onnx_node
            needs = [warning for warning in checked.warnings
                     if warning.code == "needs-pytorch"]
            assert needs and "the look inside its torch op" in needs[0]
            assert "bisect-onnx MODEL --onnx FILE" in needs[0]
    assert report.culprit.onnx_node == node
