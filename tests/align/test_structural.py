"""Tests for bisect_onnx.align.structural: hand-built graphs, then renamed and rewritten exports."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from bisect_onnx.align.graph_description import (
    GraphDescription,
    ValueSpec,
    describe_model,
)
from bisect_onnx.align.structural import MAX_REGION_NODES, StructuralMatch, match_graphs
from bisect_onnx.graph.nodes import NodeInfo
from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner
from fixtures.registry import FIXTURES, load_inputs, repo_path

SPEC = ValueSpec((2, 3), "float32")

NodeText = tuple[str, Sequence[str], Sequence[str]]


def graph(nodes: Iterable[NodeText], *, inputs: Sequence[str] = ("x",),
          constants: dict[str, np.ndarray] | None = None,
          specs: dict[str, ValueSpec] | None = None,
          values: dict[str, np.ndarray] | None = None,
          outputs: Sequence[str] = ()) -> GraphDescription:
    """A description from ``(op, inputs, outputs)`` triples; every value (2, 3) float32."""
    nodes = [NodeInfo(index, f"{op}_{index}", op, tuple(outs), None, tuple(ins))
             for index, (op, ins, outs) in enumerate(nodes)]
    names = {*inputs, *(name for node in nodes for name in node.outputs)}
    return GraphDescription(nodes=nodes, inputs=list(inputs),
                            specs={name: SPEC for name in names} | (specs or {}),
                            constants=constants or {}, outputs=list(outputs),
                            values=values or {})


def by_foreign(matches: Iterable[StructuralMatch]) -> dict[str, StructuralMatch]:
    return {match.foreign: match for match in matches}


def pairs(matches: Iterable[StructuralMatch]) -> dict[str, str | None]:
    return {match.foreign: match.template for match in matches}


def weight(seed: int, shape: tuple[int, ...] = (3, 3)) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


W_SPEC = {name: ValueSpec((3, 3), "float32") for name in ("wq", "wk", "wv", "w1", "w2")}


# --- hand-built graphs ---------------------------------------------------------------


def test_a_chain_is_matched_by_topology_commutative_inputs_in_either_order():
    c = weight(0, (2, 3))
    template = graph([("Relu", ["x"], ["a"]), ("Mul", ["a", "c"], ["b"]),
                      ("Sigmoid", ["b"], ["s"])], constants={"c": c})
    foreign = graph([("Relu", ["fx"], ["fa"]), ("Mul", ["fc", "fa"], ["fb"]),
                     ("Sigmoid", ["fb"], ["fs"])], inputs=["fx"], constants={"fc": c.copy()})
    matches = match_graphs(template, foreign)
    assert pairs(matches) == {"fx": "x", "fa": "a", "fb": "b", "fs": "s"}
    assert [m.how for m in matches] == ["input", "topology", "topology", "topology"]
    assert all(m.confidence == 1.0 for m in matches)


def test_parallel_branches_of_one_shape_are_told_apart_by_their_weights():
    weights = {"wq": weight(1), "wk": weight(2), "wv": weight(3)}
    template = graph([("MatMul", ["x", w], [w[1]]) for w in weights],
                     constants=weights, specs=W_SPEC)
    # Renamed, listed in another order, and the initializers are copies: only contents match.
    foreign = graph([("MatMul", ["fx", f"f{w}"], [f"f{w[1]}"]) for w in ("wv", "wq", "wk")],
                    inputs=["fx"], constants={f"f{w}": a.copy() for w, a in weights.items()},
                    specs={f"f{w}": spec for w, spec in W_SPEC.items()})
    matches = match_graphs(template, foreign)
    assert pairs(matches) == {"fx": "x", "fv": "v", "fq": "q", "fk": "k"}
    assert {m.how for m in matches[1:]} == {"topology"}


def equal_branches(values: dict[str, np.ndarray] | None = None,
                   foreign_values: dict[str, np.ndarray] | None = None, *,
                   negated: bool = False):
    """``r = Relu(x)`` then two MatMuls with equal weights: nothing structural tells them apart.

    ``negated`` adds a Neg after each branch (``n1``, ``n2``; ``na``, ``nb``).
    """
    w = weight(4)
    tails = [("Neg", ["m1"], ["n1"]), ("Neg", ["m2"], ["n2"])] if negated else []
    foreign_tails = [("Neg", ["fa"], ["na"]), ("Neg", ["fb"], ["nb"])] if negated else []
    template = graph([("Relu", ["x"], ["r"]), ("MatMul", ["r", "w1"], ["m1"]),
                      ("MatMul", ["r", "w2"], ["m2"]), *tails],
                     constants={"w1": w, "w2": w.copy()}, specs=W_SPEC, values=values)
    foreign = graph([("Relu", ["fx"], ["fr"]), ("MatMul", ["fr", "fw1"], ["fa"]),
                     ("MatMul", ["fr", "fw2"], ["fb"]), *foreign_tails], inputs=["fx"],
                    constants={"fw1": w.copy(), "fw2": w.copy()},
                    specs={"fw1": W_SPEC["w1"], "fw2": W_SPEC["w2"]}, values=foreign_values)
    return template, foreign


def test_equal_weights_leave_parallel_branches_ambiguous():
    template, foreign = equal_branches()
    matches = by_foreign(match_graphs(template, foreign, agree=np.array_equal))
    assert matches["fr"].template == "r"
    for name in ("fa", "fb"):
        assert matches[name].how == "ambiguous"
        assert matches[name].template is None
        assert matches[name].confidence == 0.0
        assert set(matches[name].alternatives) == {"m1", "m2"}


def branch_values(relu_value: float) -> tuple[dict, dict]:
    """Template and foreign run-time values; the foreign ``fa`` holds template ``m2``'s data."""
    ones = np.ones((2, 3), np.float32)
    template = {"x": ones, "r": ones, "m1": ones * 10, "m2": ones * 20}
    foreign = {"fx": ones, "fr": ones * relu_value, "fa": ones * 20, "fb": ones * 10}
    return template, foreign


def test_values_break_the_tie_upstream_of_any_divergence():
    template, foreign = equal_branches(*branch_values(relu_value=1.0))
    matches = by_foreign(match_graphs(template, foreign, agree=np.array_equal))
    assert (matches["fa"].template, matches["fa"].how) == ("m2", "values")
    assert matches["fa"].confidence < 1.0
    assert matches["fb"].template == "m1"  # the one left once m2 is taken


def test_values_break_no_tie_past_a_disagreeing_input():
    # ``fr`` disagrees with ``r``: past the divergence, values disagree because of the bug.
    template, foreign = equal_branches(*branch_values(relu_value=5.0))
    matches = by_foreign(match_graphs(template, foreign, agree=np.array_equal))
    assert matches["fr"].template == "r"
    assert matches["fa"].how == matches["fb"].how == "ambiguous"


def test_values_break_no_tie_without_an_agree_function():
    template, foreign = equal_branches(*branch_values(relu_value=1.0))
    matches = by_foreign(match_graphs(template, foreign))
    assert matches["fa"].how == matches["fb"].how == "ambiguous"


def test_no_template_value_is_taken_twice():
    template = graph([("Relu", ["x"], ["a"]), ("Neg", ["a"], ["n"])])
    # The foreign graph computes Relu(x) twice (a tool that did not dedupe), Neg on the copy.
    foreign = graph([("Relu", ["fx"], ["f1"]), ("Relu", ["fx"], ["f2"]),
                     ("Neg", ["f2"], ["fn"])], inputs=["fx"])
    matches = by_foreign(match_graphs(template, foreign))
    assert (matches["f1"].template, matches["f1"].how) == ("a", "topology")
    assert (matches["f2"].template, matches["f2"].how) == (None, "unmatched")
    taken = [m.template for m in matches.values() if m.template is not None]
    assert len(taken) == len(set(taken))


def conv_bn_relu_graphs():
    """Template Conv-BatchNorm-Relu-Conv-Relu; foreign with the BatchNorm folded away."""
    x_spec, y_spec = ValueSpec((1, 2, 4, 4), "float32"), ValueSpec((1, 3, 4, 4), "float32")
    w1, w2 = weight(5, (3, 2, 1, 1)), weight(7, (3, 3, 1, 1))
    b1, b2 = weight(6, (3,)), weight(8, (3,))
    norm = {name: weight(seed, (3,)) for seed, name in enumerate(("s", "bb", "m"), 9)}
    norm["v"] = np.abs(weight(12, (3,))) + 0.5
    scale = norm["s"] / np.sqrt(norm["v"] + 1e-5)
    folded = {"fw1": w1 * scale[:, None, None, None],
              "fb1": (b1 - norm["m"]) * scale + norm["bb"]}
    template = graph([
        ("Conv", ["x", "w1", "b1"], ["c1"]),
        ("BatchNormalization", ["c1", "s", "bb", "m", "v"], ["n1"]),
        ("Relu", ["n1"], ["r1"]),
        ("Conv", ["r1", "w2", "b2"], ["c2"]),
        ("Relu", ["c2"], ["r2"]),
    ], constants={"w1": w1, "b1": b1, "w2": w2, "b2": b2, **norm},
        specs={"x": x_spec, **{name: y_spec for name in ("c1", "n1", "r1", "c2", "r2")}})
    foreign = graph([
        ("Conv", ["fx", "fw1", "fb1"], ["g1"]),
        ("Relu", ["g1"], ["g2"]),
        ("Conv", ["g2", "fw2", "fb2"], ["g3"]),
        ("Relu", ["g3"], ["g4"]),
    ], inputs=["fx"], constants={**folded, "fw2": w2.copy(), "fb2": b2.copy()},
        specs={"fx": x_spec, **{name: y_spec for name in ("g1", "g2", "g3", "g4")}})
    return template, foreign


def test_a_folded_batchnorm_leaves_the_rest_matched_with_lower_confidence():
    matches = by_foreign(match_graphs(*conv_bn_relu_graphs()))
    # The folded Conv computes the BatchNorm's output: never the template Conv's.
    assert (matches["g1"].template, matches["g1"].how) == ("n1", "consumer")
    assert (matches["g2"].template, matches["g2"].how) == ("r1", "region")
    assert (matches["g3"].template, matches["g3"].how) == ("c2", "topology")
    assert (matches["g4"].template, matches["g4"].how) == ("r2", "topology")
    assert matches["g1"].confidence < matches["g2"].confidence < matches["g3"].confidence == 1.0
    assert "c1" not in {m.template for m in matches.values()}


def test_graph_order_breaks_a_tie_between_alike_fused_regions():
    template = graph([("Abs", ["x"], ["a1"]), ("Neg", ["a1"], ["n1"]),
                      ("Sin", ["x"], ["a2"]), ("Neg", ["a2"], ["n2"])])
    # Two fused ops the template lacks, each feeding a Neg resting on nothing but x.
    foreign = graph([("FusedA", ["fx"], ["g1"]), ("Neg", ["g1"], ["m1"]),
                     ("FusedB", ["fx"], ["g2"]), ("Neg", ["g2"], ["m2"])], inputs=["fx"])
    matches = by_foreign(match_graphs(template, foreign))
    assert (matches["m1"].template, matches["m1"].how) == ("n1", "position")
    assert (matches["m2"].template, matches["m2"].how) == ("n2", "region")
    assert matches["m1"].confidence < matches["m2"].confidence < 1.0
    assert (matches["g1"].template, matches["g2"].template) == ("a1", "a2")


@pytest.mark.parametrize(("input_value", "expected"), [(1.0, ("n2", "values")),
                                                       (5.0, ("n1", "position"))])
def test_values_break_a_region_tie_only_where_what_it_rests_on_agrees(input_value, expected):
    ones = np.ones((2, 3), np.float32)
    template = graph([("Abs", ["x"], ["a1"]), ("Neg", ["a1"], ["n1"]),
                      ("Sin", ["x"], ["a2"]), ("Neg", ["a2"], ["n2"])],
                     values={"x": ones, "n1": ones * 10, "n2": ones * 20})
    # The foreign Neg's own input is unpaired: the region's paired value x is what must agree.
    foreign = graph([("FusedA", ["fx"], ["g1"]), ("Neg", ["g1"], ["m1"])], inputs=["fx"],
                    values={"fx": ones * input_value, "m1": ones * 20})
    matches = by_foreign(match_graphs(template, foreign, agree=np.array_equal))
    assert (matches["m1"].template, matches["m1"].how) == expected


def test_graph_order_breaks_no_tie_downstream_of_an_ambiguous_value():
    matches = by_foreign(match_graphs(*equal_branches(negated=True)))
    assert matches["fa"].how == matches["fb"].how == "ambiguous"
    # Each Neg's input is unpaired: a region tie that graph order must not break here.
    assert matches["na"].how == matches["nb"].how == "ambiguous"
    assert set(matches["na"].alternatives) == {"n1", "n2"}


def test_a_graph_output_left_unmatched_pairs_by_position():
    template = graph([("MatMul", ["x", "w1"], ["m"]), ("Relu", ["m"], ["y"])],
                     constants={"w1": weight(13)}, specs=W_SPEC, outputs=["y"])
    # The last two ops rewritten into one the template lacks: nothing reads its output.
    foreign = graph([("FusedMatMulRelu", ["fx", "fw"], ["fy"])], inputs=["fx"],
                    constants={"fw": weight(13)}, outputs=["fy"])
    matches = by_foreign(match_graphs(template, foreign))
    assert (matches["fy"].template, matches["fy"].how) == ("y", "output")


def test_a_region_must_rest_on_every_value_the_foreign_one_rests_on():
    template = graph([("Abs", ["x"], ["a"]), ("Neg", ["a"], ["n"])], inputs=["x", "y"])
    # The foreign Neg reads something computed from x and y; the template's, from x alone.
    foreign = graph([("FusedAB", ["fx", "fy"], ["g"]), ("Neg", ["g"], ["m"])],
                    inputs=["fx", "fy"])
    matches = by_foreign(match_graphs(template, foreign))
    assert (matches["m"].template, matches["m"].how) == (None, "unmatched")


def test_a_region_longer_than_any_fusion_is_not_matched():
    template = graph([("Abs", ["x"], ["a"]), ("Neg", ["a"], ["n"])])

    def matched_through(length: int) -> str | None:
        """What the Neg after ``length`` ops the template lacks is matched with."""
        chain = [("Foo", ["fx" if i == 0 else f"g{i - 1}"], [f"g{i}"]) for i in range(length)]
        foreign = graph([*chain, ("Neg", [f"g{length - 1}"], ["m"])], inputs=["fx"])
        return by_foreign(match_graphs(template, foreign))["m"].template

    assert matched_through(MAX_REGION_NODES) == "n"
    assert matched_through(MAX_REGION_NODES + 1) is None


@st.composite
def random_graphs(draw):
    """A random DAG, every node with its own weight, and a renamed, reordered, padded copy."""
    count = draw(st.integers(1, 12))
    template_nodes, constants, produced = [], {}, ["x"]
    for index in range(count):
        op = draw(st.sampled_from(["Sub", "Mul", "Sum"]))
        first = draw(st.sampled_from(produced))
        constants[f"w{index}"] = np.full((2, 3), index, np.float32)
        inputs = [first, f"w{index}"]
        if op == "Sum":
            inputs.insert(1, draw(st.sampled_from(produced)))
        template_nodes.append((op, inputs, [f"v{index}"]))
        produced.append(f"v{index}")
    # A random topological order: repeatedly take any node whose inputs are computed.
    pending, ready, order = list(range(count)), {"x"}, []
    while pending:
        choices = [i for i in pending if all(
            name in ready or name in constants for name in template_nodes[i][1])]
        chosen = draw(st.sampled_from(choices))
        pending.remove(chosen)
        ready.add(f"v{chosen}")
        order.append(chosen)
    twins = draw(st.sets(st.integers(0, count - 1)))  # recomputed values nothing reads
    foreign_nodes = []
    for index in order:
        op, inputs, _ = template_nodes[index]
        renamed = [f"f{name}" for name in inputs]
        if op != "Sub":
            renamed = draw(st.permutations(renamed))
        foreign_nodes.append((op, renamed, [f"fv{index}"]))
        if index in twins:
            foreign_nodes.append((op, renamed, [f"fv{index}_twin"]))
    template = graph(template_nodes, constants=constants)
    foreign = graph(foreign_nodes, inputs=["fx"],
                    constants={f"f{name}": a.copy() for name, a in constants.items()})
    return template, foreign


@given(random_graphs())
@settings(max_examples=60, deadline=None)
def test_reordered_and_padded_copies_match_exactly_once_and_correctly(graphs):
    template, foreign = graphs
    matches = match_graphs(template, foreign)
    assert matches == match_graphs(template, foreign)  # deterministic
    taken = [m.template for m in matches if m.template is not None]
    assert len(taken) == len(set(taken))
    for match in matches:
        origin = match.foreign[1:].removesuffix("_twin")
        if match.foreign.endswith("_twin"):
            assert match.template in (None, origin)
        else:
            assert (match.template, match.how) in {(origin, "topology"), (origin, "input")}


# --- describing ONNX models ------------------------------------------------------------


def test_describe_model_reads_types_initializers_and_constant_nodes():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    bias = numpy_helper.from_array(np.arange(3, dtype=np.float32), "bias")
    graph_proto = helper.make_graph([
        helper.make_node("Constant", [], ["two"], value_float=2.0),
        helper.make_node("Constant", [], ["shift"],
                         value=numpy_helper.from_array(np.ones(3, np.float32))),
        helper.make_node("Add", ["x", "bias"], ["a"]),
        helper.make_node("Mul", ["a", "two"], ["m"]),
        helper.make_node("Sub", ["m", "shift"], ["y"]),
    ], "g", [x], [y], initializer=[bias])
    model = helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 18)])
    description = describe_model(model)
    assert description.inputs == ["x"]
    assert description.outputs == ["y"]
    assert [node.op_type for node in description.nodes] == ["Constant", "Constant", "Add",
                                                            "Mul", "Sub"]
    assert set(description.constants) == {"bias", "two", "shift"}
    assert description.constants["two"].dtype == np.float32
    np.testing.assert_array_equal(description.constants["shift"], np.ones(3, np.float32))
    assert description.specs["x"] == ValueSpec((None, 3), "float32")
    assert description.specs["m"] == ValueSpec((None, 3), "float32")


# --- real exports, renamed and rewritten --------------------------------------------------


def renamed(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, str]]:
    """A copy with values called ``t<n>``, nodes ``n<n>``, metadata and value_info dropped.

    Returns the copy and each new name's old one.
    """
    model = copy.deepcopy(model)
    graph_proto = model.graph
    names: dict[str, str] = {}

    def new(name: str) -> str:
        return names.setdefault(name, f"t{len(names)}") if name else ""

    for tensor in graph_proto.initializer:
        tensor.name = new(tensor.name)
    for info in (*graph_proto.input, *graph_proto.output):
        info.name = new(info.name)
    for index, node in enumerate(graph_proto.node):
        node.name = f"n{index}"
        node.input[:] = [new(name) for name in node.input]
        node.output[:] = [new(name) for name in node.output]
        node.ClearField("metadata_props")
        node.doc_string = ""
    for field in ("value_info", "metadata_props", "doc_string"):
        graph_proto.ClearField(field)
    model.ClearField("metadata_props")
    return model, {new_name: old for old, new_name in names.items()}


def ort_optimized(path: Path, level: str, folder: Path) -> onnx.ModelProto:
    """The model as ONNX Runtime's offline optimization at ``level`` saves it."""
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.optimized_model_filepath = str(folder / f"{path.stem}.{level}.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return onnx.load(options.optimized_model_filepath)


def run_everything(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every value of one unoptimized ONNX Runtime run, graph inputs included."""
    capture = OnnxRuntimeRunner(path, opt_level="disabled").run(list(feeds.values())).capture
    return {name: value.array for name, value in capture.values.items()} | feeds


def exported(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    fixture = FIXTURES[name]
    return onnx.load(str(repo_path(fixture.onnx_file))), load_inputs(fixture)


def renamed_feeds(foreign: onnx.ModelProto, old_name: dict[str, str],
                  feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    initializers = {tensor.name for tensor in foreign.graph.initializer}
    return {info.name: feeds[old_name[info.name]] for info in foreign.graph.input
            if info.name not in initializers}


def computed_values(model: onnx.ModelProto) -> set[str]:
    """Graph inputs and node outputs: what a match can name (initializers, constants aside)."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    return ({info.name for info in model.graph.input if info.name not in initializers}
            | {name for node in model.graph.node if node.op_type != "Constant"
               for name in node.output if name})


@pytest.mark.parametrize("name", ["resnet_like", "tiny_transformer"])
def test_a_renamed_export_is_matched_entirely_by_topology(name):
    model, _ = exported(name)
    foreign, old_name = renamed(model)
    matches = match_graphs(describe_model(model), describe_model(foreign))
    assert len(matches) == len(computed_values(model))
    for match in matches:
        assert match.template == old_name[match.foreign], match
        assert match.how in ("input", "topology"), match


# Share of the foreign float values with a template counterpart that must be matched; the
# figures measured when this was written are in the comments.
ORT_CASES = [
    ("resnet_like", "ORT_ENABLE_BASIC", 1.0),  # 24/24: basic leaves this export as it is
    ("tiny_transformer", "ORT_ENABLE_BASIC", 0.9),  # 57/57: 13 MatMul+Add -> Reshape-Gemm-Reshape
    ("resnet_like", "ORT_ENABLE_EXTENDED", 0.9),  # 20/20: Conv+Relu -> FusedConv
    ("tiny_transformer", "ORT_ENABLE_EXTENDED", 0.9),  # 52/54: also FusedMatMul, SkipLayerNorm
]


@pytest.mark.parametrize(("name", "level", "least_share"), ORT_CASES)
def test_an_ort_optimized_renamed_export_is_matched_correctly(name, level, least_share,
                                                             tmp_path):
    model, feeds = exported(name)
    path = repo_path(FIXTURES[name].onnx_file)
    foreign, old_name = renamed(ort_optimized(path, level, tmp_path))
    onnx.save(foreign, tmp_path / "foreign.onnx")
    matches = by_foreign(match_graphs(describe_model(model), describe_model(foreign)))
    template_values = run_everything(path, feeds)
    foreign_values = run_everything(tmp_path / "foreign.onnx",
                                    renamed_feeds(foreign, old_name, feeds))
    template_names = computed_values(model)
    floats = {name for name in computed_values(foreign) if foreign_values[name].dtype.kind == "f"}
    # ONNX Runtime keeps the name of each value it keeps; the values it adds get new names.
    with_counterpart = {name for name in floats if old_name[name] in template_names}
    matched = {name for name in with_counterpart
               if matches[name].template == old_name[name]}
    assert with_counterpart
    assert len(matched) >= least_share * len(with_counterpart)
    for match in matches.values():
        if match.template is not None:
            assert match.template == old_name[match.foreign], match
            np.testing.assert_allclose(foreign_values[match.foreign],
                                       template_values[match.template], rtol=1e-4, atol=1e-5)
        if match.how == "ambiguous":
            assert old_name[match.foreign] in match.alternatives, match


def test_graph_input_values_reach_the_description(fixture_case):
    import numpy as np
    import onnx

    from bisect_onnx.align.graph_description import describe_model

    _, inputs, exported = fixture_case("tiny_mlp")
    arrays = [np.asarray(array) for array in inputs.values()]
    description = describe_model(onnx.load(str(exported)), {}, graph_inputs=arrays)
    (name,) = description.inputs
    assert description.values[name] is arrays[0]  # tie-breaking sees what fed the graph
