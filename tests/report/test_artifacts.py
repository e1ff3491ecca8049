"""Artifacts of a planted divergence, written by the CLI and read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import onnx
import pytest

from bisect_onnx.cli.command import main
from fixtures.registry import FIXTURES, REPO_ROOT, repo_path
from tests.planting import plant, scale_conv_weight

RESNET = FIXTURES["resnet_like"]


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    """One CLI run on a ResNet-like export with a planted Conv weight, every artifact asked for."""
    folder = tmp_path_factory.mktemp("artifacts")
    plant(repo_path(RESNET.onnx_file), folder / "planted.onnx",
          scale_conv_weight("layer2.bn1", 1.01))
    cwd = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        status = main([RESNET.factory, "--input", RESNET.input_file, "--onnx",
                       str(folder / "planted.onnx"), "--json", str(folder / "report.json"),
                       "--html", str(folder / "report.html"), "--model-explorer",
                       str(folder / "node_data.json"), "--repro-dir", str(folder / "repro"),
                       "--quiet"])
    finally:
        os.chdir(cwd)
    return status, folder


def test_run_diverges_at_the_plant(planted_run):
    status, folder = planted_run
    assert status == 1
    report = json.loads((folder / "report.json").read_text())
    assert report["culprit"]["torch_module"] == "layer2.bn1"
    assert report["culprit"]["node"]["op_type"] == "Conv"
    assert report["repro"]["reproduces"] is True


def test_repro_reproduces_standalone(planted_run):
    _, folder = planted_run
    repro = folder / "repro"
    result = subprocess.run([sys.executable, "repro.py"], cwd=repro, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (repro / "backend_test" / "model.onnx").is_file()
    segment = onnx.load(str(repro / "model.onnx"))
    report = json.loads((folder / "report.json").read_text())
    assert [node.name for node in segment.graph.node] == report["repro"]["nodes"]
    assert report["first_divergence"]["onnx_node"] in report["repro"]["nodes"]


def test_html_holds_the_verdict_and_the_culprit(planted_run):
    _, folder = planted_run
    page = (folder / "report.html").read_text()
    report = json.loads((folder / "report.json").read_text())
    assert "DIVERGED" in page
    assert report["first_divergence"]["onnx_node"] in page and "layer2.bn1" in page
    assert "<svg" in page and "https://" not in page


def test_overlay_is_keyed_by_onnx_node_name(planted_run):
    _, folder = planted_run
    report = json.loads((folder / "report.json").read_text())
    data = json.loads((folder / "node_data.json").read_text())
    (graph,) = data.values()
    aligned = {record["onnx_node"] for record in report["comparisons"]}
    assert aligned <= set(graph["results"])
    values = {record["onnx_value"] for record in report["comparisons"]}
    assert not (values - aligned) & set(graph["results"]), "value names colour nothing"
    culprit = graph["results"][report["first_divergence"]["onnx_node"]]
    assert culprit["value"] > report["atol"] and "bgColor" in culprit
    passing_nodes = {record["onnx_node"] for record in report["comparisons"]
                     if record["status"] == "pass"}
    failing_nodes = {record["onnx_node"] for record in report["comparisons"]
                     if record["status"] != "pass"}
    assert all(graph["results"][node]["value"] <= report["atol"]
               for node in passing_nodes - failing_nodes)


def test_overlay_keys_are_ids_of_the_nodes_the_model_explorer_adapter_draws(planted_run):
    adapter = pytest.importorskip("model_explorer_onnx.main")
    _, folder = planted_run
    graphs = adapter.ONNXAdapter().convert(str(folder / "planted.onnx"), {})["graphs"]
    drawn = {graph.id: {node.id for node in graph.nodes} for graph in graphs}
    data = json.loads((folder / "node_data.json").read_text())
    ((graph_id, graph),) = data.items()
    assert graph_id in drawn
    assert set(graph["results"]) <= drawn[graph_id]
    report = json.loads((folder / "report.json").read_text())
    outputs = {"[value] " + record["onnx_value"] for record in report["final_outputs"]}
    assert outputs <= set(graph["results"])


def test_overlay_keys_unnamed_nodes_as_the_model_explorer_adapter_names_them(tmp_path,
                                                                             monkeypatch):
    adapter = pytest.importorskip("model_explorer_onnx.main")
    pool = FIXTURES["avgpool_divisor"]
    model = onnx.load(repo_path(pool.onnx_file.replace(".onnx", ".torchscript.onnx")))
    for node in model.graph.node:
        node.name = ""
    # A named node taking the adapter's first choice shifts its numbering of the others.
    model.graph.node[-1].name = "node"
    onnx.save(model, tmp_path / "unnamed.onnx")
    monkeypatch.chdir(REPO_ROOT)
    assert main([pool.factory, "--input", pool.input_file, "--onnx",
                 str(tmp_path / "unnamed.onnx"), "--model-explorer",
                 str(tmp_path / "node_data.json"), "--quiet"]) == 1
    (graph,) = adapter.ONNXAdapter().convert(str(tmp_path / "unnamed.onnx"), {})["graphs"]
    ((_, data),) = json.loads((tmp_path / "node_data.json").read_text()).items()
    assert set(data["results"]) <= {node.id for node in graph.nodes}
    (pool_node,) = [node.id for node in graph.nodes if node.label == "AveragePool"]
    assert "bgColor" in data["results"][pool_node], "the culprit is coloured"
    op_nodes = [node for node in graph.nodes if not node.id.startswith("[value] ")]
    assert len(data["results"]) >= len(op_nodes) - 1, "unnamed nodes are not left out"


def test_quiet_prints_only_the_verdict(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    pool = FIXTURES["avgpool_divisor"]
    assert main([pool.factory, "--input", pool.input_file, "--onnx", pool.onnx_file,
                 "-q"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    # The verdict alone: its headline, then its evidence indented below it.
    assert out[0].startswith("DIVERGED") and len(out) > 1
    assert all(line.startswith("  ") for line in out[1:])
    assert not any("\x1b[" in line for line in out)


class _FakeTerminal:
    def __init__(self, tty: bool):
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_colour_only_on_a_terminal_and_never_with_no_color(monkeypatch):
    from bisect_onnx.cli.printing import colour_wanted

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert colour_wanted(_FakeTerminal(True))
    assert not colour_wanted(_FakeTerminal(False))
    monkeypatch.setenv("NO_COLOR", "1")
    assert not colour_wanted(_FakeTerminal(True))


def test_progress_lines_come_from_the_library_events(capsys):
    import bisect_onnx
    from bisect_onnx.cli.printing import show_progress

    model_case = FIXTURES["tiny_mlp"]
    from fixtures.registry import build_model, load_inputs

    with bisect_onnx.events.listening(show_progress):
        bisect_onnx.bisect(build_model(model_case), load_inputs(model_case),
                           onnx_model=repo_path(model_case.onnx_file))
    lines = capsys.readouterr().err.splitlines()
    assert "bisect-onnx: running pytorch and recording every value…" in lines
    assert "bisect-onnx: running ONNX Runtime and recording every value…" in lines
    assert "bisect-onnx: creating an ONNX Runtime session…" in lines
