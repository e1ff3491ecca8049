"""The probe search on graphs with branches: a pass speaks only for its own ancestors."""

from __future__ import annotations

import pytest

from bisect_onnx.search.bisection import ProbeSearch
from bisect_onnx.search.value_graph import ValueGraph
from tests.search.random_graphs import random_case

# Two residual blocks: x -> [conv_a -> relu_a -> conv_b] + x -> add1 -> relu1, then the
# same with a downsampling shortcut (conv_s) -> add2 -> out.
RESIDUAL = [
    ("Conv", ["x"], ["conv_a"]), ("Relu", ["conv_a"], ["relu_a"]),
    ("Conv", ["relu_a"], ["conv_b"]), ("Add", ["conv_b", "x"], ["add1"]),
    ("Relu", ["add1"], ["relu1"]),
    ("Conv", ["relu1"], ["conv_c"]), ("Relu", ["conv_c"], ["relu_c"]),
    ("Conv", ["relu_c"], ["conv_d"]), ("Conv", ["relu1"], ["conv_s"]),
    ("Shape", ["relu1"], ["shape"]), ("Sqrt", ["shape"], ["scale"]),
    ("Add", ["conv_d", "conv_s"], ["add2"]), ("Reshape", ["add2", "scale"], ["out"]),
]


def residual_graph():
    return ValueGraph.from_nodes(RESIDUAL, ["x"])


def test_shape_computations_are_not_on_the_data_path():
    graph = residual_graph()
    assert "shape" not in graph and "scale" not in graph
    assert graph.parents["out"] == ("add2",)


def test_the_cuts_of_a_residual_model_are_the_block_boundaries():
    graph = residual_graph()
    assert graph.dominators("out") == ["x", "add1", "relu1", "add2"]
    assert graph.dominators("conv_d") == ["x", "add1", "relu1", "conv_c", "relu_c"]


def test_a_pass_on_the_shortcut_does_not_hide_the_branch_that_fails():
    graph = residual_graph()
    fails = {"conv_c", "relu_c", "conv_d", "add2", "out"}  # planted in conv_c
    checkpoints = [name for name in graph.parents if name != "x"]
    log = []

    def probe(names):
        log.append(list(names))
        return {name: name in fails for name in names}

    search = ProbeSearch(graph, checkpoints, failing=["out"], per_probe=2).run(probe)
    assert search.first_failing == "conv_c"
    assert search.last_passing == "relu1"
    # conv_s (the shortcut) passes but says nothing of conv_c's branch.
    assert any("conv_s" in names for names in log)


def test_a_value_the_capture_saw_fail_is_probed_first_and_narrows_the_search():
    graph = residual_graph()
    fails = {"conv_c", "relu_c", "conv_d", "add2", "out"}
    checkpoints = [name for name in graph.parents if name != "x"]
    log = []

    def probe(names):
        log.append(list(names))
        return {name: name in fails for name in names}

    search = ProbeSearch(graph, checkpoints, failing=["out"],
                         suspects=["conv_d", "relu_c", "add2"]).run(probe)
    assert log[0] == ["relu_c"]  # the earliest the capture saw fail on its branch
    assert search.first_failing == "conv_c"


def test_a_suspect_that_passes_in_production_is_not_named():
    graph = residual_graph()
    fails = {"add2", "out"}  # error enters at add2; the capture wrongly saw conv_a fail
    checkpoints = [name for name in graph.parents if name != "x"]
    search = ProbeSearch(graph, checkpoints, failing=["out"], suspects=["conv_a"]).run(
        lambda names: {name: name in fails for name in names})
    assert search.probes[0].values == ("conv_a",)
    assert search.first_failing == "add2"


def test_several_failing_outputs_are_searched_through_what_they_share():
    graph = ValueGraph.from_nodes([("Op", ["x"], ["a"]), ("Op", ["a"], ["b"]),
                                   ("Op", ["b"], ["head1"]), ("Op", ["b"], ["head2"])],
                                  ["x"])
    search = ProbeSearch(graph, ["a", "b"], failing=["head1", "head2"]).run(
        lambda names: {name: name == "b" for name in names})
    assert search.first_failing == "b" and search.last_passing == "a"


@pytest.mark.parametrize("per_probe, segment_size", [(1, 1), (1, 32), (3, 4), (4, 64)])
def test_the_entry_of_the_error_is_found_on_every_random_graph(per_probe, segment_size):
    """1000 random DAGs per setting: branches, skip connections, shape subgraphs,
    values that cannot be compared or have no reference, and descendants that mask
    the error. The culprit is always found, and never by probing the whole graph
    one value at a time."""
    found = probes = checkpoints = 0
    seed = 0
    while found < 1000:
        case = random_case(seed)
        seed += 1
        if case is None:
            continue
        suspects = [name for name in case.checkpoints
                    if case.fails[name] or hash((seed, name)) % 7 == 0]
        search = ProbeSearch(case.graph, case.checkpoints, failing=case.failing_outputs,
                             per_probe=per_probe, segment_size=segment_size,
                             suspects=suspects if seed % 2 else ())
        search.run(case.probe())
        assert search.first_failing == case.culprit, f"seed {seed - 1}"
        assert all(len(probe.values) <= max(per_probe, segment_size)
                   for probe in search.probes)
        found += 1
        probes += len(search.probes)
        checkpoints += len(case.checkpoints)
    if segment_size > 1:
        assert probes < checkpoints / 2


def test_nodes_out_of_graph_order_are_put_in_order():
    # onnxruntime's float16 converter lists the graph input's Cast after its readers.
    graph = ValueGraph.from_nodes([("Conv", ["x16"], ["conv"]), ("Relu", ["conv"], ["out"]),
                                   ("Cast", ["x"], ["x16"])], ["x"])
    assert list(graph.parents) == ["x", "x16", "conv", "out"]
    assert graph.dominators("out") == ["x", "x16", "conv"]
