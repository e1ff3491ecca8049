"""Bisection by probes of the production graph, end to end: memory budget, fusion-only bugs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

import bisect_onnx
from bisect_onnx.cli.command import main
from bisect_onnx.errors import UsageError
from bisect_onnx.judge.report_parts import Search
from bisect_onnx.runtime.memory import estimate_values_bytes, parse_size
from bisect_onnx.runtime.onnxruntime import capture_plan
from fixtures.registry import FIXTURES, repo_path
from tests.planting import plant, scale_conv_weight
from tests.torch_warnings import DYNAMO_LEAFSPEC_DEPRECATED

pytestmark = DYNAMO_LEAFSPEC_DEPRECATED


@pytest.fixture(scope="module")
def planted_resnet(fixture_case, tmp_path_factory):
    model, inputs, exported = fixture_case("resnet_like")
    planted = tmp_path_factory.mktemp("planted") / "planted.onnx"
    plant(exported, planted, scale_conv_weight("layer2.bn1", 1.003))
    return model, inputs, planted


def test_a_memory_budget_too_small_for_a_full_capture_bisects_to_the_same_culprit(
        planted_resnet):
    model, inputs, planted = planted_resnet
    full = bisect_onnx.bisect(model, inputs, onnx_model=planted)
    probed = bisect_onnx.bisect(model, inputs, onnx_model=planted,
                                runtime=bisect_onnx.RuntimeOptions(max_memory="1KB"))
    assert probed.search.mode == "bisection"
    assert "memory budget" in probed.search.reason
    assert probed.verdict == "diverged"
    # The full capture (trusted: its outputs are production's within a hundredth of
    # the tolerance) sees the Conv fused with its ReLU; the probes pull it out.
    assert full.search == Search()
    assert probed.first_divergence.torch_module == "layer2.bn1"
    assert probed.culprit.onnx_value == full.culprit.onnx_value
    # Only the probed values were fetched (and production's outputs judged), one per
    # probe in a budget this small: the cuts, then the culprit's block, not every value.
    checkpoints = probed.search.checkpoints
    assert len(probed.search.probes) <= checkpoints // 3
    fetched = {name for probe in probed.search.probes for name in probe.values}
    outputs = {output.name for output in onnx.load(str(planted)).graph.output}
    assert {row.onnx_value for row in probed.comparisons} <= fetched | outputs
    assert len(probed.comparisons) < checkpoints / 2
    assert probed.search.graphs_match_production is True
    assert "Found by bisection" in probed.summary()


def test_the_same_model_within_budget_is_captured_in_full(planted_resnet):
    model, inputs, planted = planted_resnet
    report = bisect_onnx.bisect(model, inputs, onnx_model=planted,
                                runtime=bisect_onnx.RuntimeOptions(max_memory="64GiB",
                                                                   opt_level="extended"))
    # At "extended" the capture computes production's outputs bitwise: no probes needed.
    assert report.capture["outputs_match_production"] is True
    assert report.search == Search()


def test_the_cli_takes_a_memory_budget_and_says_how_it_searched(planted_resnet, tmp_path,
                                                               capsys):
    _, _, planted = planted_resnet
    fixture = FIXTURES["resnet_like"]
    target = tmp_path / "report.json"
    # Room for the input (12 KiB), not for both sides' values.
    status = main([fixture.factory, "--input", str(repo_path(fixture.input_file)), "--onnx",
                   str(planted), "--max-memory", "40KiB", "--json", str(target), "-q"])
    assert status == 1
    data = json.loads(target.read_text())
    assert data["search"]["mode"] == "bisection"
    assert data["first_divergence"]["torch_module"] == "layer2.bn1"


@pytest.mark.parametrize("bad", ["lots", "-3GB", "0", "12 parsecs"])
def test_an_unreadable_memory_budget_is_a_usage_error(bad, capsys):
    fixture = FIXTURES["tiny_mlp"]
    status = main([fixture.factory, "--input", str(repo_path(fixture.input_file)),
                   f"--max-memory={bad}"])
    assert status == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "memory" in error


def test_memory_sizes_read_as_people_write_them():
    assert parse_size("2GB") == 2 * 10**9
    assert parse_size("512MiB") == 512 << 20
    assert parse_size("1.5g") == 3 << 29
    assert parse_size(4096) == 4096
    with pytest.raises(UsageError):
        parse_size("two gigs")


def test_the_capture_estimate_is_the_sum_of_the_values_onnx_runtime_computes(fixture_case):
    model, inputs, exported = fixture_case("tiny_mlp")
    proto = onnx.load(str(exported))
    session_inputs = [np.asarray(value) for value in inputs.values()]
    estimate = estimate_values_bytes(proto, session_inputs)
    import onnxruntime as ort

    names = [name for node in proto.graph.node for name in node.output]
    for name in names:
        if name not in {output.name for output in proto.graph.output}:
            proto.graph.output.append(onnx.ValueInfoProto(name=name))
    session = ort.InferenceSession(proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    arrays = session.run(names, dict(zip([i.name for i in session.get_inputs()],
                                         session_inputs, strict=True)))
    assert estimate == sum(array.nbytes for array in arrays)
    # Twice the batch, twice the values.
    doubled = [np.concatenate([array, array]) for array in session_inputs]
    assert estimate_values_bytes(proto, doubled) == 2 * estimate


class ManualLayerNorm(nn.Module):
    """A LayerNorm written out op by op: ONNX Runtime fuses the chain into one kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(16, 16)
        self.weight = nn.Parameter(torch.rand(16) + 0.5)
        self.bias = nn.Parameter(torch.rand(16))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inner(x)
        mean = h.mean(-1, keepdim=True)
        centred = h - mean
        variance = centred.pow(2).mean(-1, keepdim=True)
        normed = centred / torch.sqrt(variance + 1e-5) * self.weight + self.bias
        return self.head(normed)


@pytest.fixture(scope="module")
def fused_norm(tmp_path_factory):
    torch.manual_seed(0)
    model = ManualLayerNorm().eval()
    inputs = torch.randn(2, 8, 16)
    path = tmp_path_factory.mktemp("fused") / "norm.onnx"
    torch.onnx.export(model, (inputs,), str(path), dynamo=True, optimize=True)
    return model, inputs.numpy(), path


def test_a_bug_only_the_fused_kernel_has_is_found_by_probing_production(fused_norm,
                                                                         monkeypatch):
    """No fused kernel of ONNX Runtime is known to misbehave on this machine (float32
    and float16 LayerNorm, RMSNorm, GELU and softmax chains were tried: the fused
    kernels are as accurate as the chains), so the bug is simulated where it would
    live: every session whose graph leaves the LayerNorm chain whole (production, and
    probes that mark nothing inside it) computes the fused kernel with a wrong weight;
    a session that marks a value inside the chain pulls it apart and computes rightly.
    The capture with every value promoted (``promote="all"``) pulls it apart too, so
    it cannot see the bug."""
    model, inputs, path = fused_norm
    proto = onnx.load(str(path))
    kinds = [node.op_type for node in proto.graph.node]
    start = kinds.index("ReduceMean")
    chain = proto.graph.node[start:start + 9]  # ReduceMean ... Mul(weight), Add(bias)
    assert [node.op_type for node in chain][-2:] == ["Mul", "Add"]
    inside = {name for node in chain[:-1] for name in node.output}
    kernel_output = chain[-1].output[0]
    weight = chain[-2].input[1]
    real_session = capture_plan.create_session

    def fused_kernel_bug(source, **options):
        graph = (onnx.load_from_string(source) if isinstance(source, bytes)
                 else onnx.load(str(source)))
        if not inside & {value.name for value in graph.graph.output}:  # chain whole
            for tensor in graph.graph.initializer:
                if tensor.name == weight:
                    tensor.CopyFrom(numpy_helper.from_array(
                        numpy_helper.to_array(tensor) * np.float32(1.01), weight))
            source = graph.SerializeToString()
        return real_session(source, **options)

    monkeypatch.setattr(capture_plan, "create_session", fused_kernel_bug)
    report = bisect_onnx.bisect(model, inputs, onnx_model=path,
                                runtime=bisect_onnx.RuntimeOptions(promote="all"))
    assert report.verdict == "diverged"  # production's outputs decide, not the capture's
    assert report.search.mode == "bisection"
    assert "does not compute the production session's" in report.search.reason
    assert report.first_divergence.onnx_value == kernel_output
    # The capture saw nothing: the rows that fail are values production's probes
    # fetched (with their figures) or production's outputs, the first of them the
    # kernel's output.
    failing = [record.onnx_value for record in report.comparisons if record.failed]
    probed = {name for probe in report.search.probes for name in probe.values}
    outputs = {output.name for output in proto.graph.output}
    assert failing[0] == kernel_output and set(failing) <= probed | outputs
    assert report.search.last_passing in inside | {chain[0].input[0]}
    # Probes inside the chain pulled the kernel apart, and said so.
    graphs = [probe.graph for probe in report.search.probes]
    assert any(graph.startswith("differs only where") for graph in graphs)
    assert report.search.graphs_match_production is True


def test_without_the_simulated_bug_the_same_run_is_parity(fused_norm):
    model, inputs, path = fused_norm
    report = bisect_onnx.bisect(model, inputs, onnx_model=path,
                                runtime=bisect_onnx.RuntimeOptions(promote="all"))
    assert report.verdict == "parity" and report.search == Search()


def test_probes_leave_no_file_behind(planted_resnet, tmp_path, monkeypatch):
    model, inputs, planted = planted_resnet
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    bisect_onnx.bisect(model, inputs, onnx_model=planted,
                       runtime=bisect_onnx.RuntimeOptions(max_memory=1))
    left = [path for path in Path(tmp_path).rglob("*")
            if path.is_file() and path.suffix != ".ses" and "torchinductor" not in str(path)]
    assert left == []


def test_over_budget_without_the_dynamo_program_only_the_outputs_are_compared(fixture_case):
    model, inputs, _ = fixture_case("avgpool_divisor")
    exported = repo_path(FIXTURES["avgpool_divisor"].torchscript_onnx_file)
    report = bisect_onnx.bisect(model, inputs, onnx_model=exported,
                                runtime=bisect_onnx.RuntimeOptions(max_memory=1))
    assert report.verdict == "diverged"  # from production's outputs
    assert report.search.mode == "final outputs only"
    assert report.comparisons == []
    assert any("needs the dynamo exporter's program" in warning for warning in report.warnings)


def test_over_budget_at_parity_says_why_nothing_was_probed(fixture_case):
    model, inputs, exported = fixture_case("tiny_mlp")
    report = bisect_onnx.bisect(model, inputs, onnx_model=exported,
                                runtime=bisect_onnx.RuntimeOptions(max_memory=1))
    assert report.verdict == "parity" and report.search.mode == "final outputs only"
    assert not any("no intermediate value could be aligned" in w for w in report.warnings)
    assert any("values are probed only to locate a divergence" in w for w in report.warnings)


def test_over_budget_at_parity_the_verdict_names_the_budget(fixture_case):
    model, inputs, exported = fixture_case("tiny_mlp")
    report = bisect_onnx.bisect(model, inputs, onnx_model=exported,
                                runtime=bisect_onnx.RuntimeOptions(max_memory=1))
    line = report.summary()
    assert line.startswith("PARITY OF FINAL OUTPUTS ONLY") and "memory budget" in line
    assert "could be aligned" not in line and report.unaligned == []


def _checkpoints(*sizes):
    from bisect_onnx.graph.nodes import NodeInfo
    from bisect_onnx.runtime.sides import CapturedValue
    from bisect_onnx.search.probes import Checkpoint

    return [Checkpoint(f"v{index}", CapturedValue(f"v{index}", np.zeros(size, np.uint8),
                                                  None),
                       NodeInfo(index, f"n{index}", "Op", (f"v{index}",), None, ()))
            for index, size in enumerate(sizes)]


def test_a_probe_marks_what_the_budget_leaves_beside_the_reference_values():
    from bisect_onnx.search.probes import CUTS_PER_PROBE, SEGMENT_PER_PROBE, values_per_probe

    checkpoints = _checkpoints(100, 100, 200)  # 400 bytes of reference values held
    assert values_per_probe(checkpoints, None) == (CUTS_PER_PROBE, SEGMENT_PER_PROBE)
    assert values_per_probe(checkpoints, 1000) == (3, 3)  # 600 left, 200 a value
    assert values_per_probe(checkpoints, 500) == (1, 1)
    assert values_per_probe(checkpoints, 10) == (1, 1)  # never none
    assert values_per_probe(checkpoints, 10**9) == (CUTS_PER_PROBE, SEGMENT_PER_PROBE)
