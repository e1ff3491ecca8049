"""The translations: imported beside ONNX Runtime where its sessions hide them, else when used."""

from __future__ import annotations

import subprocess
import sys

import onnx

from fixtures.registry import REPO_ROOT
from tests.planting import node_of_module, plant, scale_initializer_input

SCRIPT = """
import sys
import onnx
from onnx import helper
from bisect_onnx.pytorch.exporter_imports import imported_meanwhile

wanted, elements = sys.argv[1] == "yes", int(sys.argv[2])
weight = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[elements])
weight.data_location = onnx.TensorProto.EXTERNAL
for key, value in (("location", "weights.bin"), ("length", str(elements * 4))):
    weight.external_data.add(key=key, value=value)
model = helper.make_model(helper.make_graph([], "g", [], [], initializer=[weight]))
with imported_meanwhile(model, wanted=wanted):
    pass
print("onnxscript.function_libs.torch_lib.ops" in sys.modules,
      "torch.onnx._internal.exporter._torchlib.ops" in sys.modules)
"""


def _imported(wanted: str, weights_bytes: int) -> list[str]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, wanted, str(weights_bytes // 4)],
                          cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_imported_meanwhile_only_when_wanted_and_the_weights_are_big_enough():
    from bisect_onnx.pytorch.exporter_imports import HIDDEN_FROM

    assert _imported("yes", HIDDEN_FROM) == ["True", "True"]
    assert _imported("yes", HIDDEN_FROM - 4) == ["False", "False"]  # a small model: later
    assert _imported("no", 4 * HIDDEN_FROM) == ["False", "False"]


RUN = """
import sys
import bisect_onnx
from fixtures.registry import FIXTURES, build_model, load_inputs
fixture = FIXTURES["tiny_transformer"]
report = bisect_onnx.bisect(build_model(fixture), load_inputs(fixture), onnx_model=sys.argv[1])
culprit = report.culprit.onnx_node if report.culprit else None
inside = report.inside_op.node if report.inside_op else None
print(report.verdict, culprit, inside, "onnxscript.function_libs.torch_lib.ops" in sys.modules)
"""


def _run(onnx_path) -> list[str]:
    done = subprocess.run([sys.executable, "-c", RUN, str(onnx_path)], cwd=REPO_ROOT,
                          capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_parity_imports_no_translations_and_a_divergence_looks_inside_with_them(
        fixture_case, tmp_path):
    _, _, exported = fixture_case("tiny_transformer")
    verdict, _, _, imported = _run(exported)
    assert (verdict, imported) == ("parity", "False")
    node = node_of_module(onnx.load(str(exported)), "blocks.0.attn.v", "MatMul")
    planted = tmp_path / "planted.onnx"
    plant(exported, planted, scale_initializer_input(node.name, 1, 1.05))
    verdict, culprit, inside, imported = _run(planted)
    assert (verdict, culprit, inside, imported) == ("diverged", node.name, node.name, "True")
