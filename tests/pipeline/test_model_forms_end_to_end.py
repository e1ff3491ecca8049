"""Every form a model arrives in, end to end through the CLI or the API."""

from __future__ import annotations

import json
import pickle

import numpy as np
import onnx
import onnx_ir
import pytest
import torch

import bisect_onnx
from bisect_onnx.cli.command import main
from fixtures.registry import FIXTURES, REPO_ROOT, repo_path
from tests.planting import node_of_module, plant, scale_conv_weight
from tests.torch_warnings import DYNAMO_LEAFSPEC_DEPRECATED, TORCH_JIT_DEPRECATED

pytestmark = [TORCH_JIT_DEPRECATED, DYNAMO_LEAFSPEC_DEPRECATED]

MODULE_ROWS = bisect_onnx.SearchOptions(granularity="module")

POOL = FIXTURES["avgpool_divisor"]
RESNET = FIXTURES["resnet_like"]


def run_cli(tmp_path, *args):
    report = tmp_path / "report.json"
    status = main([*map(str, args), "--json", str(report)])
    return status, json.loads(report.read_text()) if report.exists() else None


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)


def _args(fixture_case, name):
    _, inputs, _ = fixture_case(name)
    return tuple(torch.from_numpy(array) for array in inputs.values())


def test_pt2_exported_here_names_the_diverging_module(fixture_case, tmp_path, in_repo):
    model, _, _ = fixture_case("avgpool_divisor")
    torch.export.save(torch.export.export(model, _args(fixture_case, "avgpool_divisor")),
                      tmp_path / "model.pt2")
    status, report = run_cli(tmp_path, tmp_path / "model.pt2", "--input", POOL.input_file)
    assert status == 1
    assert report["reference"]["kind"] == "exported_program"
    assert report["first_divergence"]["torch_module"] == "pool"


@pytest.mark.parametrize("compile_", [torch.jit.trace, torch.jit.script],
                         ids=["traced", "scripted"])
def test_torchscript_archive_is_compared_module_by_module(fixture_case, tmp_path, in_repo,
                                                          compile_):
    model, _, _ = fixture_case("avgpool_divisor")
    args = _args(fixture_case, "avgpool_divisor")
    torch.jit.save(compile_(model, args) if compile_ is torch.jit.trace else compile_(model),
                   tmp_path / "model.ts")
    status, report = run_cli(tmp_path, tmp_path / "model.ts", "--input", POOL.input_file)
    assert status == 1
    assert report["reference"]["kind"] == "torchscript"
    assert report["environment"]["exporter"] == "torchscript"
    assert report["first_divergence"]["torch_module"] == "pool"


def _save_pt2(model, args, path):
    torch.export.save(torch.export.export(model, args), path)


def _save_traced(model, args, path):
    torch.jit.save(torch.jit.trace(model, args), path)


@pytest.mark.parametrize(("save", "onnx_file", "planted_node", "module"), [
    (_save_pt2, RESNET.onnx_file, "layer2.bn1", "layer2.bn1"),
    (_save_traced, RESNET.torchscript_onnx_file, "/layer3/conv2/Conv", "layer3.bn2"),
], ids=["pt2-vs-dynamo-export", "torchscript-vs-torchscript-export"])
def test_saved_model_against_a_planted_onnx_file(fixture_case, tmp_path, in_repo, save,
                                                 onnx_file, planted_node, module):
    model, _, _ = fixture_case("resnet_like")
    save(model, _args(fixture_case, "resnet_like"), tmp_path / "model.saved")
    plant(repo_path(onnx_file), tmp_path / "planted.onnx",
          scale_conv_weight(planted_node, 1.003))
    status, report = run_cli(tmp_path, tmp_path / "model.saved", "--input", RESNET.input_file,
                             "--onnx", tmp_path / "planted.onnx")
    assert status == 1
    assert report["culprit"]["torch_module"] == module


def test_scripted_control_flow_is_named_as_not_compared(fixture_case, tmp_path, in_repo):
    model, _, _ = fixture_case("resnet_like")
    torch.jit.save(torch.jit.script(model), tmp_path / "model.ts")  # Upsample branches
    status, report = run_cli(tmp_path, tmp_path / "model.ts", "--input", RESNET.input_file,
                             "--onnx", RESNET.torchscript_onnx_file)
    assert status == 0
    assert any("not compared: up" in warning for warning in report["warnings"])


def test_trusted_pickle_is_bisected_like_the_module(fixture_case, tmp_path, in_repo):
    from fixtures import models

    torch.save(models.avgpool_divisor(), tmp_path / "whole_model.pt")
    status, report = run_cli(tmp_path, tmp_path / "whole_model.pt", "--trust-pickle",
                             "--input", POOL.input_file)
    assert status == 1
    assert report["first_divergence"]["torch_module"] == "pool"


class _Payload:
    """Unpickling this creates a file: proof that code ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_pickle_without_the_flag_is_refused_and_never_run(tmp_path, capsys, in_repo):
    marker = tmp_path / "pwned"
    with open(tmp_path / "evil.pt", "wb") as handle:
        torch.save({"model": _Payload(marker)}, handle, pickle_module=pickle)
    status = main([str(tmp_path / "evil.pt"), "--input", POOL.input_file])
    err = capsys.readouterr().err
    assert status == 2
    assert "--trust-pickle" in err and len(err.strip().splitlines()) == 1
    assert not marker.exists()


def test_onnx_program_is_tested_as_the_users_own_export(fixture_case):
    model, inputs, _ = fixture_case("resnet_like")
    program = torch.onnx.export(model, _args(fixture_case, "resnet_like"), dynamo=True,
                                verbose=False)
    # model_proto is a fresh copy each time: plant in the program's own IR model.
    node = node_of_module(program.model_proto, "layer2.bn1", "Conv")
    weight = program.model.graph.initializers[node.input[1]]
    weight.const_value = onnx_ir.tensor(weight.const_value.numpy() * np.float32(1.003))
    report = bisect_onnx.bisect(program, inputs)
    assert report.reference["kind"] == "exported_program"
    assert report.candidate["model"] == "(torch.onnx.ONNXProgram)"
    assert report.culprit.torch_module == "layer2.bn1"
    assert report.culprit.onnx_node == node.name


def test_exported_program_object_with_keyword_inputs(fixture_case):
    model, inputs, exported = fixture_case("two_inputs")
    program = torch.export.export(model, _args(fixture_case, "two_inputs"))
    report = bisect_onnx.bisect(program, {"y": inputs["y"], "x": inputs["x"]},
                                onnx_model=exported, search=MODULE_ROWS)
    assert report.verdict == "parity"
    assert {record.torch_module for record in report.comparisons} == {"a", "b", "c"}


def test_random_token_ids_stay_in_the_vocabulary_over_samples(tmp_path, in_repo):
    fixture = FIXTURES["token_classifier"]
    status, report = run_cli(tmp_path, fixture.factory, "--onnx", fixture.onnx_file,
                             "--samples", "3", "--seed", "7")
    assert status == 0
    assert "worst of 3 random samples (0 diverged)" in report["note"]
    assert report["reference"]["inputs"].startswith("random (seed 7, sample ")


def test_random_inputs_need_an_onnx_model_or_inputs(tmp_path, capsys, in_repo):
    status = main([FIXTURES["tiny_mlp"].factory])
    assert status == 2
    assert "no inputs" in capsys.readouterr().err


def test_pt_input_files(fixture_case, tmp_path, in_repo):
    _, inputs, _ = fixture_case("two_inputs")
    torch.save({name: torch.from_numpy(array) for name, array in inputs.items()},
               tmp_path / "inputs.pt")
    fixture = FIXTURES["two_inputs"]
    status, report = run_cli(tmp_path, fixture.factory, "--input", tmp_path / "inputs.pt",
                             "--onnx", fixture.onnx_file)
    assert status == 0 and report["verdict"] == "parity"


def test_dynamic_batch_export_runs_on_another_batch_size(fixture_case, tmp_path, in_repo):
    saved = tmp_path / "dynamic.onnx"
    status, _ = run_cli(tmp_path, RESNET.factory, "--input", RESNET.input_file, "--dynamic",
                        "--save-onnx", saved)
    assert status == 0
    batch = onnx.load(str(saved)).graph.input[0].type.tensor_type.shape.dim[0]
    assert batch.dim_param and not batch.dim_value
    np.save(tmp_path / "batch3.npy", np.random.RandomState(1).randn(3, 3, 32, 32)
            .astype(np.float32))
    status, report = run_cli(tmp_path, RESNET.factory, "--input", tmp_path / "batch3.npy",
                             "--onnx", saved)
    assert status == 0
    assert report["final_outputs"][0]["shape"] == [3, 10]


def test_keyword_inputs_that_skip_a_parameter(tmp_path):
    (tmp_path / "keywords.py").write_text(
        "import torch\n"
        "class Tagger(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.embed = torch.nn.Embedding(20, 4)\n"
        "        self.segment = torch.nn.Embedding(2, 4)\n"
        "    def forward(self, input_ids, attention_mask=None, token_type_ids=None):\n"
        "        out = self.embed(input_ids)\n"
        "        if token_type_ids is not None:\n"
        "            out = out + self.segment(token_type_ids)\n"
        "        return out\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    return Tagger()\n"
    )
    from bisect_onnx.sources.loading import load_model

    model = load_model(f"{tmp_path}/keywords.py:make")
    rng = np.random.RandomState(0)
    inputs = {"token_type_ids": rng.randint(0, 2, (2, 5)), "input_ids": rng.randint(0, 20, (2, 5))}
    report = bisect_onnx.bisect(model, inputs, search=MODULE_ROWS)
    assert report.verdict == "parity"
    assert {record.torch_module for record in report.comparisons} == {"embed", "segment"}


CACHE_BEFORE_MASK = """
import torch
class Decoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(20, 4)
    def forward(self, input_ids, cache=None, attention_mask=None):
        out = self.embed(input_ids)
        if cache is not None:  # a [2, 5] mask here cannot broadcast with [2, 5, 4]
            out = out + cache
        return out * attention_mask.unsqueeze(-1)
def make():
    torch.manual_seed(0)
    return Decoder().eval()
"""


def test_random_inputs_go_to_forward_by_the_graphs_input_names(tmp_path):
    factory = _write_model(tmp_path, CACHE_BEFORE_MASK)
    from bisect_onnx.sources.loading import load_model

    ids = torch.zeros((2, 5), dtype=torch.int64)
    torch.onnx.export(load_model(factory), (ids,), tmp_path / "decoder.onnx", dynamo=True,
                      kwargs={"attention_mask": torch.ones_like(ids)}, verbose=False)
    assert [i.name for i in onnx.load(str(tmp_path / "decoder.onnx")).graph.input] == [
        "input_ids", "attention_mask"]
    # By position the mask was forward's cache, and forward raised: exit 3.
    status, report = run_cli(tmp_path, factory, "--onnx", tmp_path / "decoder.onnx")
    assert status == 0 and report["verdict"] == "parity"
    assert report["reference"]["inputs"].startswith("random")


def _write_model(tmp_path, source: str) -> str:
    (tmp_path / "inline_model.py").write_text(source)
    return f"{tmp_path}/inline_model.py:make"


MULTI_OUTPUT_OPS = """
import torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.pool = torch.nn.AdaptiveMaxPool2d(2)   # max_pool returns values and indices
        self.fc = torch.nn.Linear(16, 3)
    def forward(self, x):
        return self.fc(self.pool(self.conv(x)).flatten(1))
def make():
    torch.manual_seed(0)
    return Net().eval()
"""


def test_traced_archive_compares_what_a_multi_output_op_returns(tmp_path):
    from bisect_onnx.sources.loading import load_model

    model = load_model(_write_model(tmp_path, MULTI_OUTPUT_OPS))
    x = np.random.RandomState(0).randn(2, 3, 8, 8).astype(np.float32)
    torch.jit.save(torch.jit.trace(model, (torch.from_numpy(x),)), tmp_path / "net.ts")
    report = bisect_onnx.bisect(str(tmp_path / "net.ts"), x)
    pool = next(record for record in report.comparisons if record.torch_module == "pool")
    assert pool.figures.status == "pass" and pool.dtype == "float32"  # not the int64 indices
    assert report.verdict == "parity" and report.hidden_divergences == []


REUSED_TWICE = """
import torch
class Squash(torch.nn.Module):
    def forward(self, x):
        return torch.tanh(torch.tanh(x) * 2)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.squash = Squash()
        self.fc = torch.nn.Linear(4, 4)
    def forward(self, x):
        return self.squash(self.fc(self.squash(x)))
def make():
    torch.manual_seed(0)
    return Net().eval()
"""


def test_torchscript_call_suffixes_tell_the_calls_apart(tmp_path):
    from bisect_onnx.sources.loading import load_model

    model = load_model(_write_model(tmp_path, REUSED_TWICE))
    x = np.random.RandomState(0).randn(2, 4).astype(np.float32) * 3
    report = bisect_onnx.bisect(model, x, export=bisect_onnx.ExportOptions(
        exporter="torchscript"))
    nodes = {record.torch_module: record.onnx_node for record in report.comparisons}
    assert nodes["squash"] == "/squash/Tanh_1"
    assert nodes["squash@1"] == "/squash_1/Tanh_1"
    assert report.hidden_divergences == []


def test_scripted_forward_with_an_optional_argument(tmp_path):
    source = MULTI_OUTPUT_OPS.replace("def forward(self, x):",
                                      "def forward(self, x, scale: float = 1.0):")
    from bisect_onnx.sources.loading import load_model

    model = load_model(_write_model(tmp_path, source))
    torch.jit.save(torch.jit.script(model), tmp_path / "net.ts")
    x = np.random.RandomState(0).randn(2, 3, 8, 8).astype(np.float32)
    # The TorchScript exporter cannot take this scripted signature (a torch assertion):
    # compare against the dynamo export of the module instead.
    torch.onnx.export(model, (torch.from_numpy(x),), dynamo=True, verbose=False).save(
        str(tmp_path / "net.onnx"))
    report = bisect_onnx.bisect(str(tmp_path / "net.ts"), x, onnx_model=tmp_path / "net.onnx")
    assert report.verdict == "parity"
    assert report.reference["kind"] == "torchscript"
    assert any(record.torch_module == "pool" for record in report.comparisons)


def test_model_archive_given_as_input_is_named_as_a_model(fixture_case, tmp_path, capsys,
                                                         in_repo):
    model, _, _ = fixture_case("tiny_mlp")
    torch.export.save(torch.export.export(model, _args(fixture_case, "tiny_mlp")),
                      tmp_path / "model.pt2")
    status = main([FIXTURES["tiny_mlp"].factory, "--input", str(tmp_path / "model.pt2")])
    assert status == 2
    assert "is a saved model" in capsys.readouterr().err


def test_dynamic_batch_is_refused_for_an_exported_program(fixture_case):
    model, inputs, _ = fixture_case("tiny_mlp")
    program = torch.export.export(model, _args(fixture_case, "tiny_mlp"))
    with pytest.raises(bisect_onnx.UsageError, match="dynamic_shapes"):
        bisect_onnx.bisect(program, inputs,
                           export=bisect_onnx.ExportOptions(dynamic_batch=True))
