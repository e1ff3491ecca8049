"""The repro folder: the smallest failing segment, its data, and a repro.py that runs alone."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import uses_external_data

from bisect_onnx.errors import InputError
from bisect_onnx.graph.segments import MAX_SEGMENT_NODES
from bisect_onnx.judge.compare import compare_arrays
from bisect_onnx.judge.tolerances import Tolerance
from bisect_onnx.report.repro import write_repro
from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner
from bisect_onnx.runtime.sides import SampleArrays
from fixtures.registry import FIXTURES, build_model, load_inputs, repo_path

RTOL, ATOL = 1e-3, 1e-5
nan, inf = float("nan"), float("inf")
ENVIRONMENT = {"onnxruntime": "test", "opt_level": "all", "provider": "CPUExecutionProvider"}


@pytest.fixture(scope="module")
def avgpool():
    """The avgpool_divisor export with PyTorch's and ONNX Runtime's values by ONNX name."""
    fixture = FIXTURES["avgpool_divisor"]
    module = build_model(fixture)
    inputs = load_inputs(fixture)
    captured = {}
    # Module output -> the ONNX value the dynamo export gives it.
    for module_name, value in (("conv", "conv2d"), ("relu", "relu"), ("pool", "avg_pool2d"),
                               ("flatten", "view"), ("fc", "linear")):
        getattr(module, module_name).register_forward_hook(
            lambda _m, _i, out, value=value: captured.__setitem__(value, out.detach().numpy()))
    with torch.no_grad():
        module(torch.from_numpy(inputs["x"]))
    path = repo_path(fixture.onnx_file)
    side = OnnxRuntimeRunner(path)
    capture = side.run([inputs["x"]]).capture
    candidate = {name: value.array for name, value in capture.values.items()}
    return path, side.model, inputs, captured, candidate


def _repro(folder, avgpool, failing_value, reference_names):
    path, model, inputs, reference, candidate = avgpool
    return write_repro(
        folder, model=model, model_dir=path.parent, failing_value=failing_value,
        values=SampleArrays({name: reference[name] for name in reference_names}, candidate, inputs),
        tolerance=Tolerance(RTOL, ATOL),
        environment=ENVIRONMENT)


def _run_script(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "repro.py"], cwd=folder, capture_output=True,
                          text=True, timeout=120)


def _npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as archive:
        return {name: archive[name] for name in archive.files}


def test_culprit_node_alone_reproduces_and_repro_py_exits_1_until_fixed(tmp_path, avgpool):
    folder = tmp_path / "repro"
    repro = _repro(folder, avgpool, "avg_pool2d", ["relu", "avg_pool2d"])

    assert repro.reproduces
    assert repro.nodes == ["node_avg_pool2d"]
    assert repro.inputs == {"relu": "reference"}
    _, _, _, reference, candidate = avgpool
    np.testing.assert_array_equal(_npz(folder / "inputs.npz")["relu"], reference["relu"])
    np.testing.assert_array_equal(_npz(folder / "expected.npz")["avg_pool2d"],
                                  reference["avg_pool2d"])
    np.testing.assert_array_equal(_npz(folder / "candidate.npz")["avg_pool2d"],
                                  candidate["avg_pool2d"])
    segment = onnx.load(str(folder / "model.onnx"))
    assert [node.name for node in segment.graph.node] == ["node_avg_pool2d"]
    assert segment.graph.node[0].metadata_props  # the exporter's torch metadata kept
    assert [value.name for value in segment.graph.input] == ["relu"]
    assert [value.name for value in segment.graph.output] == ["avg_pool2d"]

    environment = json.loads((folder / "environment.json").read_text())
    assert environment["onnxruntime"] == "test"
    assert environment["repro"] == {
        "failing_value": "avg_pool2d", "nodes": ["node_avg_pool2d"],
        "inputs": {"relu": "reference"}, "rtol": RTOL, "atol": ATOL,
        "provider": "CPUExecutionProvider", "opt_level": "all", "onnx_checker": "passed",
        "reproduces": True,
    }
    assert 5 <= len((folder / "README.txt").read_text().splitlines()) <= 10

    result = _run_script(folder)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "MISMATCH" in result.stdout
    assert "max abs error" in result.stdout and "out of tolerance" in result.stdout

    # The exporter "fixed": ONNX Runtime's value is now what PyTorch expects.
    shutil.copyfile(folder / "candidate.npz", folder / "expected.npz")
    result = _run_script(folder)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK" in result.stdout


def test_backend_test_layout_holds_the_same_case(tmp_path, avgpool):
    folder = tmp_path / "repro"
    _repro(folder, avgpool, "avg_pool2d", ["relu", "avg_pool2d"])
    backend = folder / "backend_test"
    model = onnx.load(str(backend / "model.onnx"))
    onnx.checker.check_model(model)
    data = backend / "test_data_set_0"
    assert sorted(path.name for path in data.iterdir()) == ["input_0.pb", "output_0.pb"]

    def tensor(path):
        proto = TensorProto()
        proto.ParseFromString(path.read_bytes())
        return proto

    given, wanted = tensor(data / "input_0.pb"), tensor(data / "output_0.pb")
    assert given.name == model.graph.input[0].name == "relu"
    assert wanted.name == model.graph.output[0].name == "avg_pool2d"
    np.testing.assert_array_equal(numpy_helper.to_array(given), _npz(folder / "inputs.npz")["relu"])
    np.testing.assert_array_equal(numpy_helper.to_array(wanted),
                                  _npz(folder / "expected.npz")["avg_pool2d"])


@pytest.mark.parametrize(("failing_value", "references", "nodes", "inputs"), [
    # Two nodes past the last PyTorch value: the pool, then the flatten's Reshape (and its
    # shape initializer), then the classifier.
    ("linear", ["relu", "linear"], ["node_avg_pool2d", "node_view", "node_linear"],
     {"relu": "reference"}),
    # No PyTorch value on the way: back to the user's input.
    ("avg_pool2d", ["avg_pool2d"], ["node_conv2d", "node_relu", "node_avg_pool2d"],
     {"x": "graph_input"}),
])
def test_segment_spans_nodes_back_to_known_values(tmp_path, avgpool, failing_value, references,
                                                  nodes, inputs):
    folder = tmp_path / "repro"
    repro = _repro(folder, avgpool, failing_value, references)
    assert repro.nodes == nodes
    assert repro.inputs == inputs
    assert repro.reproduces
    assert _run_script(folder).returncode == 1


def test_external_weights_are_embedded_and_the_repro_outlives_the_model(tmp_path):
    weight = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["mm"], name="matmul"),
         helper.make_node("Relu", ["mm"], ["y"], name="relu")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=[numpy_helper.from_array(weight, "w")])
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]),
              str(model_dir / "m.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="w.bin", size_threshold=0)
    model = onnx.load(str(model_dir / "m.onnx"), load_external_data=False)
    assert uses_external_data(model.graph.initializer[0])

    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    actual = np.maximum(x @ weight, 0)
    folder = tmp_path / "repro"
    repro = write_repro(
        folder, model=model, model_dir=model_dir, failing_value="y",
        values=SampleArrays({"y": actual + 1}, {"y": actual}, {"x": x}),
        tolerance=Tolerance(RTOL, ATOL), environment={})
    assert repro.nodes == ["matmul", "relu"]
    assert repro.inputs == {"x": "graph_input"}
    assert repro.reproduces
    assert uses_external_data(model.graph.initializer[0])  # the caller's model untouched

    shutil.rmtree(model_dir)
    segment = onnx.load(str(folder / "model.onnx"))
    assert not any(uses_external_data(tensor) for tensor in segment.graph.initializer)
    np.testing.assert_array_equal(numpy_helper.to_array(segment.graph.initializer[0]), weight)
    assert not list(folder.rglob("*.bin"))
    assert _run_script(folder).returncode == 1


def test_external_data_outside_the_model_folder_is_refused(tmp_path):
    weight = numpy_helper.from_array(np.ones(3, dtype=np.float32), "w")
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    weight.external_data.add(key="location", value="../secret.bin")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"], name="add")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], initializer=[weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    (tmp_path / "secret.bin").write_bytes(np.ones(3, dtype=np.float32).tobytes())
    (tmp_path / "model").mkdir()
    y = np.full(3, 2, dtype=np.float32)
    with pytest.raises(InputError, match="outside the model's folder"):
        write_repro(tmp_path / "repro", model=model, model_dir=tmp_path / "model",
                    failing_value="y",
                    values=SampleArrays({"y": y}, {"y": y}, {"x": np.ones(3, dtype=np.float32)}),
                    tolerance=Tolerance(RTOL, ATOL), environment={})


def test_a_long_walk_is_cut_and_fed_onnx_runtime_values(tmp_path):
    length = MAX_SEGMENT_NODES + 10
    one = numpy_helper.from_array(np.ones(2, dtype=np.float32), "one")
    nodes = [helper.make_node("Add", [f"v{i}", "one"], [f"v{i + 1}"], name=f"add{i}")
             for i in range(length)]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("v0", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info(f"v{length}", TensorProto.FLOAT, [2])],
        initializer=[one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = np.zeros(2, dtype=np.float32)
    candidate = {f"v{i}": x + i for i in range(length + 1)}
    last = f"v{length}"
    repro = write_repro(
        tmp_path / "repro", model=model, model_dir=tmp_path, failing_value=last,
        values=SampleArrays({last: candidate[last]}, candidate, {"v0": x}),
        tolerance=Tolerance(RTOL, ATOL), environment={})
    assert repro.nodes == [f"add{i}" for i in range(10, length)]
    assert repro.inputs == {"v10": "candidate"}
    assert not repro.reproduces  # PyTorch's value was ONNX Runtime's: nothing to see
    assert _run_script(tmp_path / "repro").returncode == 0


def test_nodes_computed_from_weights_alone_do_not_cut_the_walk(tmp_path):
    """A bias made from a table over many nodes (BEiT's relative positions) is taken whole.

    Production's capture holds none of its values: cut at the limit, the walk would
    need one, and the local check of the attention reading it could not run.
    """
    length = MAX_SEGMENT_NODES + 10
    one = numpy_helper.from_array(np.ones(2, dtype=np.float32), "one")
    table = numpy_helper.from_array(np.zeros(2, dtype=np.float32), "w0")
    nodes = [helper.make_node("Add", [f"w{i}", "one"], [f"w{i + 1}"], name=f"bias{i}")
             for i in range(length)]
    nodes.append(helper.make_node("Add", ["x", f"w{length}"], ["y"], name="attention"))
    graph = helper.make_graph(
        nodes, "bias", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], initializer=[one, table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = np.zeros(2, dtype=np.float32)
    y = x + length + 1  # PyTorch's value: off by one from what the file computes
    repro = write_repro(
        tmp_path / "repro", model=model, model_dir=tmp_path, failing_value="y",
        values=SampleArrays({"y": y}, {"y": x + length}, {"x": x}),
        tolerance=Tolerance(RTOL, ATOL), environment={})
    assert repro.nodes == [f"bias{i}" for i in range(length)] + ["attention"]
    assert repro.inputs == {"x": "graph_input"}
    assert repro.reproduces


def test_a_value_computed_by_a_taken_node_is_not_also_an_input(tmp_path):
    # Add reads b before a; b has a PyTorch value, but the Split is taken in for a.
    graph = helper.make_graph(
        [helper.make_node("Split", ["x"], ["a", "b"], name="split", axis=0, num_outputs=2),
         helper.make_node("Add", ["b", "a"], ["y"], name="add")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = np.arange(4, dtype=np.float32)
    y = x[:2] + x[2:]
    repro = write_repro(
        tmp_path / "repro", model=model, model_dir=tmp_path, failing_value="y",
        values=SampleArrays({"b": x[2:], "y": y + 1}, {"b": x[2:], "y": y}, {"x": x}),
        tolerance=Tolerance(RTOL, ATOL), environment={})
    assert repro.nodes == ["split", "add"]
    assert repro.inputs == {"x": "graph_input"}
    assert repro.reproduces


def test_outer_values_read_inside_a_subgraph_become_inputs(tmp_path):
    branch = helper.make_graph(
        [helper.make_node("Neg", ["h"], ["out"], name="neg")], "branch", [],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])])
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["h"], name="relu"),
         helper.make_node("If", ["cond"], ["y"], name="if", then_branch=branch,
                          else_branch=branch)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    h = np.array([1, 2], dtype=np.float32)
    repro = write_repro(
        tmp_path / "repro", model=model, model_dir=tmp_path, failing_value="y",
        values=SampleArrays({"h": h, "y": h}, {"h": h, "y": -h}, {"x": h, "cond": np.array(True)}),
        tolerance=Tolerance(RTOL, ATOL), environment={})
    assert repro.nodes == ["if"]
    assert repro.inputs == {"cond": "graph_input", "h": "reference"}
    assert repro.reproduces


@pytest.mark.parametrize(("op", "value"), [
    ("Neg", np.array(3, dtype=np.int64)),  # a 0-d integer
    ("Not", np.array([True, False])),
    ("Neg", np.array([[1.5, nan]], dtype=np.float64)),
])
def test_repro_py_reports_any_dtype_and_rank(tmp_path, op, value):
    kind = helper.np_dtype_to_tensor_dtype(value.dtype)
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], name="op")], "g",
        [helper.make_tensor_value_info("x", kind, value.shape)],
        [helper.make_tensor_value_info("y", kind, value.shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    result = ~value if value.dtype == bool else -value
    folder = tmp_path / "repro"
    repro = write_repro(
        folder, model=model, model_dir=tmp_path, failing_value="y",
        values=SampleArrays({"y": value}, {"y": result}, {"x": value}),
        tolerance=Tolerance(RTOL, ATOL), environment={})
    assert repro.reproduces
    run = _run_script(folder)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "MISMATCH" in run.stdout and "Traceback" not in run.stderr
    shutil.copyfile(folder / "candidate.npz", folder / "expected.npz")
    assert _run_script(folder).returncode == 0


def test_a_failing_value_no_node_computes_is_refused(tmp_path, avgpool):
    path, model, inputs, _, _ = avgpool
    with pytest.raises(InputError, match="not the output of any top-level node"):
        write_repro(tmp_path / "repro", model=model, model_dir=path.parent, failing_value="x",
                    values=SampleArrays(inputs, inputs, inputs),
                    tolerance=Tolerance(RTOL, ATOL), environment={})


@pytest.fixture(scope="module")
def script_rule(tmp_path_factory, avgpool):
    """The comparison function of a written repro.py, imported."""
    folder = tmp_path_factory.mktemp("rule")
    _repro(folder, avgpool, "avg_pool2d", ["relu", "avg_pool2d"])
    spec = importlib.util.spec_from_file_location("written_repro", folder / "repro.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (module.RTOL, module.ATOL) == (RTOL, ATOL)
    return module.out_of_tolerance


@pytest.mark.parametrize(("expected", "actual"), [
    ([1.0, 2.0], [1.0, 2.0]),
    ([1.0, 2.0], [1.0, 2.1]),
    ([100.0], [100.09]),  # inside rtol
    ([100.0], [100.2]),
    ([0.0], [9e-6]),  # inside atol
    ([nan, 1.0], [nan, 1.0]),
    ([nan, 1.0], [0.0, 1.0]),
    ([1.0], [nan]),
    ([inf, -inf], [inf, -inf]),
    ([inf], [-inf]),
    ([inf], [1.0]),
    (["max"], ["-max"]),  # the difference overflows to inf: a failure
])
def test_repro_py_judges_like_compare_arrays(script_rule, expected, actual):
    for dtype in (np.float32, np.float64):
        big = {"max": np.finfo(dtype).max, "-max": -np.finfo(dtype).max}
        ref = np.array([big.get(item, item) for item in expected], dtype=dtype)
        got = np.array([big.get(item, item) for item in actual], dtype=dtype)
        passed = compare_arrays(ref, got, rtol=RTOL, atol=ATOL).passed
        assert (not script_rule(ref, got).any()) == passed, (dtype, expected, actual)


def test_repro_py_compares_integers_exactly(script_rule):
    ref = np.array([2**60, 3], dtype=np.int64)
    assert not script_rule(ref, ref.copy()).any()
    assert script_rule(ref, ref + [1, 0]).tolist() == [True, False]
