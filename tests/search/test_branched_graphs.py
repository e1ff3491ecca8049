"""End to end on branched graphs: a plant in a residual branch is named, not a later node.

Residual blocks whose shortcut is computed after the branch (Hugging Face's order)
put shortcut values between the plant and the block's sum in graph order: a search
that bisects values in that order sees the shortcut pass and looks past the culprit.
Attention blocks do the same with their q, k and v branches.
"""

from __future__ import annotations

import contextlib
import io

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import bisect_onnx
from bisect_onnx.runtime.memory import estimate_values_bytes
from fixtures.models import shortcut_last_resnet
from fixtures.registry import FIXTURES, repo_path
from tests.planting import node_of_module, plant, scale_conv_weight, scale_initializer_input
from tests.torch_warnings import DYNAMO_LEAFSPEC_DEPRECATED, LEGACY_EXPORTER_DEPRECATED

pytestmark = [DYNAMO_LEAFSPEC_DEPRECATED, LEGACY_EXPORTER_DEPRECATED]

# (module whose Conv is scaled, that Conv's TorchScript node name): the residual
# branch, never the shortcut, at three depths (the last two in downsampling blocks).
BRANCH_PLANTS = [
    ("stages.0.1.bn1", "/stages/stages.0/stages.0.1/conv1/Conv"),
    ("stages.1.0.bn2", "/stages/stages.1/stages.1.0/conv2/Conv"),
    ("stages.2.0.bn1", "/stages/stages.2/stages.2.0/conv1/Conv"),
]


def _export(model: nn.Module, args: tuple, path, *, dynamo: bool):
    with contextlib.redirect_stdout(io.StringIO()):  # the exporter's progress lines
        torch.onnx.export(model, args, str(path), dynamo=dynamo)
    return path


@pytest.fixture(scope="module")
def residual(tmp_path_factory):
    """The model, its input, and a dynamo and a TorchScript export of it."""
    folder = tmp_path_factory.mktemp("shortcut_last")
    model = shortcut_last_resnet()
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    exports = {name: _export(model, (x,), folder / f"{name}.onnx", dynamo=name == "dynamo")
               for name in ("dynamo", "torchscript")}
    return model, {"x": x.numpy()}, exports


def _planted(residual, tmp_path, exporter: str, module: str, torchscript_node: str):
    _, _, exports = residual
    target = tmp_path / "planted.onnx"
    plant(exports[exporter], target,
          scale_conv_weight(module if exporter == "dynamo" else torchscript_node, 1.05))
    return target


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("module, torchscript_node", BRANCH_PLANTS)
def test_a_plant_in_a_residual_branch_is_named_at_default_settings(
        residual, tmp_path, exporter, module, torchscript_node):
    model, inputs, _ = residual
    planted = _planted(residual, tmp_path, exporter, module, torchscript_node)
    report = bisect_onnx.bisect(model, inputs, onnx_model=planted)
    assert report.verdict == "diverged"
    assert report.culprit is not None
    assert report.culprit.torch_module == module
    block = module.rsplit(".", 1)[0]
    # Where ONNX Runtime fused the Conv with the ReLU (or the sum) after it, the
    # first value to fail is that kernel's output, in the same block, never a later
    # block's value.
    assert report.first_divergence.torch_module.startswith(block + ".")


@pytest.mark.parametrize("room", ["none", "some"])
@pytest.mark.parametrize("module, torchscript_node", BRANCH_PLANTS)
def test_the_probe_search_alone_finds_a_plant_in_a_residual_branch(
        residual, tmp_path, module, torchscript_node, room):
    model, inputs, _ = residual
    planted = _planted(residual, tmp_path, "dynamo", module, torchscript_node)
    one_side = estimate_values_bytes(onnx.load(str(planted)), [inputs["x"]])
    # Too little for both sides' values: with room for no more than one value per
    # probe, or for a few besides the reference values.
    budget = 1024 if room == "none" else int(1.5 * one_side)
    report = bisect_onnx.bisect(model, inputs, onnx_model=planted,
                                runtime=bisect_onnx.RuntimeOptions(max_memory=budget))
    search = report.search
    assert search.mode == "bisection"
    assert report.first_divergence.torch_module == module
    assert report.culprit.torch_module == module
    if room == "some":  # several values per probe: the cuts, then a whole segment
        assert max(len(probe.values) for probe in search.probes) > 1
        assert len(search.probes) <= 4


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_plant_in_one_attention_branch_of_block_0_is_named(fixture_case, tmp_path, exporter):
    model, inputs, _ = fixture_case("tiny_transformer")
    fixture = FIXTURES["tiny_transformer"]
    source = repo_path(fixture.onnx_file if exporter == "dynamo"
                       else fixture.torchscript_onnx_file)
    proto = onnx.load(str(source))
    node = (node_of_module(proto, "blocks.0.attn.v", "MatMul") if exporter == "dynamo"
            else node_of_module(proto, "/blocks.0/attn/v/MatMul", "MatMul"))
    planted = tmp_path / "planted.onnx"
    plant(source, planted, scale_initializer_input(node.name, 1, 1.05))
    budgets = [None, "1KB"] if exporter == "dynamo" else [None]  # probes need FX names
    for budget in budgets:
        report = bisect_onnx.bisect(model, inputs, onnx_model=planted,
                                    runtime=bisect_onnx.RuntimeOptions(max_memory=budget))
        assert report.culprit.torch_module == "blocks.0.attn.v", budget
        if exporter == "dynamo":  # q and k, computed alongside, do not hide it
            assert report.first_divergence.torch_module == "blocks.0.attn.v", budget


def test_onnx_against_onnx_names_the_plant_in_block_0_of_torchscript_exports(tmp_path):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(1))
    reference = _export(model, (x,), tmp_path / "reference.onnx", dynamo=False)
    candidate = tmp_path / "candidate.onnx"
    plant(reference, candidate, scale_initializer_input("/layers.0/linear2/MatMul", 1, 1.01))
    report = bisect_onnx.bisect_onnx_models(reference, candidate, x.numpy())
    assert report.verdict == "diverged"
    assert report.first_divergence.onnx_node == "/layers.0/linear2/MatMul"
    assert report.culprit.onnx_node == "/layers.0/linear2/MatMul"
    if report.search.mode == "bisection":
        # Shape arithmetic (a Sqrt of the head size) is never a checkpoint.
        probed = {name for probe in report.search.probes for name in probe.values}
        assert not any("Sqrt" in name for name in probed)
    assert np.isfinite(report.first_divergence.figures.max_abs_error)
