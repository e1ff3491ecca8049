"""Reliability and security gaps (issue 12) not covered by the other test files.

Odd graphs (If, several same-shaped inputs, dynamic batch), runtimes that cannot run an
op, NaN-only and zero-size inputs, external data outside the model's folder, temporary
folders on failure and Ctrl-C, and property tests on the input loaders.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import bisect_onnx
import bisect_onnx.pipeline.torch_sample
from bisect_onnx.cli.command import main
from bisect_onnx.errors import BisectOnnxError, InputError
from bisect_onnx.sources.loading import load_input_files
from fixtures.registry import FIXTURES, REPO_ROOT

MLP = FIXTURES["tiny_mlp"]
FLOAT23 = [2, 3]
THIRD_PARTY_TEMP_FILES = {".ses", "torchinductor_root"}


def _model(nodes, inputs, outputs, initializers=(), domains=()):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(name, TensorProto.FLOAT, FLOAT23)
                     for name in inputs],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, FLOAT23) for name in outputs],
        initializer=[numpy_helper.from_array(np.asarray(value, np.float32), name)
                     for name, value in initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    *(helper.make_opsetid(d, 1) for d in domains)])
    model.ir_version = 9
    return model


def _write_module(folder, body: str, args: str = "x") -> str:
    (folder / "mod.py").write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        f"    def forward(self, {args}):\n"
        f"        {body}\n"
        "def make():\n"
        "    return M()\n")
    return f"{folder}/mod.py:make"


def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("bisect-onnx: error: ")
    assert "Traceback" not in captured.err
    return lines[0]


X23 = np.random.RandomState(0).randn(2, 3).astype(np.float32)


# --- If: subgraph values are not promotable; compared at the boundary, and said so ---


class _Branchy(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2 if x.sum() > 0 else x - 1)


def _if_model():
    then_graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [],
                                   [helper.make_tensor_value_info("t", TensorProto.FLOAT, FLOAT23)])
    else_graph = helper.make_graph([helper.make_node("Sub", ["x", "one"], ["e"])], "else", [],
                                   [helper.make_tensor_value_info("e", TensorProto.FLOAT, FLOAT23)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["r"], name="branch", then_branch=then_graph,
                              else_branch=else_graph),
             helper.make_node("Relu", ["r"], ["y"])]
    return _model(nodes, ["x"], ["y"], [("zero", 0), ("two", 2), ("one", 1)])


@pytest.mark.parametrize("sign", [1, -1], ids=["then", "else"])
def test_hand_built_if_graph_gives_a_verdict_and_says_subgraphs_were_not_compared(tmp_path,
                                                                                  sign):
    path = tmp_path / "if.onnx"
    onnx.save(_if_model(), path)
    report = bisect_onnx.bisect(_Branchy(), np.abs(X23) * sign, onnx_model=path)
    assert report.verdict == "parity"
    assert any("subgraph" in warning and "branch" in warning for warning in report.warnings)


def test_if_graph_whose_branch_is_wrong_diverges_at_the_output(tmp_path):
    model = _if_model()
    then_branch = next(a.g for a in model.graph.node[2].attribute if a.name == "then_branch")
    then_branch.node[0].op_type = "Add"  # then: x + 2, not x * 2
    path = tmp_path / "if.onnx"
    onnx.save(model, path)
    report = bisect_onnx.bisect(_Branchy(), np.abs(X23), onnx_model=path)
    assert report.diverged


class _Cond(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x):
        h = self.fc(x)
        return torch.relu(torch.cond(h.sum() > 0, lambda t: t * 2, lambda t: t - 1, (h,)))


def test_torch_cond_export_compares_at_the_if_boundary_and_says_so():
    torch.manual_seed(0)
    report = bisect_onnx.bisect(_Cond().eval(), X23)
    assert report.verdict == "parity"
    assert " If " in report.table(show="all")  # the If node itself is a compared row
    assert any("subgraph" in warning for warning in report.warnings)


def _loop_model():
    """y = x * 2 ** 3, computed by a Loop of three doublings, then a Relu."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Mul", ["v_in", "two"], ["v_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, FLOAT23)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, FLOAT23)])
    model = _model([helper.make_node("Loop", ["trips", "keep_going", "x"], ["r"], name="doubling",
                                     body=body),
                    helper.make_node("Relu", ["r"], ["y"])], ["x"], ["y"], [("two", 2)])
    model.graph.initializer.extend([numpy_helper.from_array(np.array(3, np.int64), "trips"),
                                    numpy_helper.from_array(np.array(True), "keep_going")])
    return model


class _Doubling(torch.nn.Module):
    def forward(self, x):
        for _ in range(3):
            x = x * 2
        return torch.relu(x)


def test_hand_built_loop_graph_gives_a_verdict_and_says_subgraphs_were_not_compared(tmp_path):
    path = tmp_path / "loop.onnx"
    onnx.save(_loop_model(), path)
    report = bisect_onnx.bisect(_Doubling(), X23, onnx_model=path)
    assert report.verdict == "parity"
    assert any("subgraph" in warning and "doubling" in warning for warning in report.warnings)
    model = _loop_model()
    model.graph.initializer[-2].CopyFrom(numpy_helper.from_array(np.array(4, np.int64), "trips"))
    onnx.save(model, path)  # one doubling too many
    assert bisect_onnx.bisect(_Doubling(), X23, onnx_model=path).diverged


# --- ops or domains ONNX Runtime cannot run: exit 3, one line naming the op ---


@pytest.mark.parametrize("domain", ["com.example", ""], ids=["custom-domain", "unknown-op"])
def test_op_onnx_runtime_cannot_run_exits_3_in_one_line(tmp_path, capsys, domain):
    model = _model([helper.make_node("Frobnicate", ["x"], ["y"], domain=domain)], ["x"], ["y"],
                   domains=[domain] if domain else [])
    onnx.save(model, tmp_path / "frob.onnx")
    np.save(tmp_path / "x.npy", X23)
    status = main([_write_module(tmp_path, "return torch.relu(x)"), "--input",
                   str(tmp_path / "x.npy"), "--onnx", str(tmp_path / "frob.onnx")])
    assert status == 3
    assert "Frobnicate" in _one_line_error(capsys)


# --- NaN-only and zero-size inputs, dynamic batch ---


@pytest.fixture(scope="module")
def dynamic_mlp(tmp_path_factory):
    """tiny_mlp exported here with a dynamic batch (one export shared by the tests)."""
    folder = tmp_path_factory.mktemp("dynamic")
    cwd = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        status = main([MLP.factory, "--input", MLP.input_file, "--dynamic", "-q",
                       "--save-onnx", str(folder / "mlp.onnx")])
    finally:
        os.chdir(cwd)
    assert status == 0
    return folder / "mlp.onnx"


@pytest.mark.parametrize("batch", [5, 1, 0])
def test_dynamic_export_runs_with_another_batch_size(dynamic_mlp, tmp_path, capsys, monkeypatch,
                                                     batch):
    monkeypatch.chdir(REPO_ROOT)
    np.save(tmp_path / "x.npy", np.random.RandomState(1).randn(batch, 16).astype(np.float32))
    status = main([MLP.factory, "--input", str(tmp_path / "x.npy"), "--onnx", str(dynamic_mlp),
                   "-q"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert captured.out.startswith("PARITY")
    assert "Traceback" not in captured.err


def test_fixed_batch_export_refuses_another_batch_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    np.save(tmp_path / "x.npy", np.zeros((5, 16), np.float32))
    assert main([MLP.factory, "--input", str(tmp_path / "x.npy"), "--onnx", MLP.onnx_file]) == 2
    _one_line_error(capsys)


@pytest.mark.parametrize("fill", [np.nan, np.inf], ids=["nan", "inf"])
def test_nan_or_inf_only_inputs_give_a_verdict(fixture_case, fill):
    model, _, exported = fixture_case("tiny_mlp")
    report = bisect_onnx.bisect(model, np.full((2, 16), fill, np.float32), onnx_model=exported)
    assert report.verdict in {"parity", "diverged"}
    assert report.summary()


# --- several graph inputs of the same shape: matched by name, not by position ---


def test_same_shaped_inputs_are_matched_by_name(tmp_path):
    path = tmp_path / "sub.onnx"
    onnx.save(_model([helper.make_node("Sub", ["x", "y"], ["z"])], ["x", "y"], ["z"]), path)

    class Sub(torch.nn.Module):
        def forward(self, x, y):
            return x - y

    x, y = X23, X23[::-1].copy() + 1
    assert bisect_onnx.bisect(Sub(), {"y": y, "x": x}, onnx_model=path).verdict == "parity"
    assert bisect_onnx.bisect(Sub(), [x, y], onnx_model=path).verdict == "parity"

    class Swapped(torch.nn.Module):  # the same inputs fed the other way round must diverge
        def forward(self, x, y):
            return y - x

    assert bisect_onnx.bisect(Swapped(), [x, y], onnx_model=path).diverged


# --- external data: locations outside the model's folder are refused, never read ---


def _external_model(tmp_path, location: str):
    folder = tmp_path / "model"
    folder.mkdir()
    model = _model([helper.make_node("Add", ["x", "w"], ["y"])], ["x"], ["y"],
                   [("w", np.ones(FLOAT23))])
    onnx.save(model, folder / "ext.onnx", save_as_external_data=True, location="w.bin",
              size_threshold=0)
    if location != "w.bin":
        target = (folder / location) if not os.path.isabs(location) else location
        os.replace(folder / "w.bin", target)
        model = onnx.load(folder / "ext.onnx", load_external_data=False)
        for entry in model.graph.initializer[0].external_data:
            if entry.key == "location":
                entry.value = location
        onnx.save(model, folder / "ext.onnx")
    np.save(tmp_path / "x.npy", X23)
    return folder / "ext.onnx"


@pytest.mark.parametrize("where", ["inside", "parent", "absolute"])
def test_external_data_outside_the_model_folder_is_refused(tmp_path, capsys, where):
    location = {"inside": "w.bin", "parent": "../w.bin",
                "absolute": str(tmp_path / "w.bin")}[where]
    path = _external_model(tmp_path, location)
    status = main([_write_module(tmp_path, "return x + 1"), "--input", str(tmp_path / "x.npy"),
                   "--onnx", str(path), "-q"])
    if where == "inside":
        assert status == 0, capsys.readouterr().err
        return
    assert status == 2
    line = _one_line_error(capsys)
    assert "outside" in line and "w.bin" in line


def test_external_data_outside_is_refused_by_the_api_too(tmp_path):
    path = _external_model(tmp_path, "../w.bin")

    class AddOne(torch.nn.Module):
        def forward(self, x):
            return x + 1

    with pytest.raises(InputError, match="outside the model's folder"):
        bisect_onnx.bisect(AddOne(), X23, onnx_model=path)


# --- temporary folders: removed after a failure and after Ctrl-C ---


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    assert tempfile.gettempdir() == str(folder)
    return folder


@pytest.mark.parametrize("raised", [KeyboardInterrupt, RuntimeError, InputError],
                         ids=["ctrl-c", "bug", "input-error"])
def test_temporary_folder_is_removed_on_every_exit_path(private_tmp, monkeypatch, capsys,
                                                        raised):
    monkeypatch.chdir(REPO_ROOT)
    seen = []

    def explode(arrays, specs):
        seen.extend(name for name in os.listdir(private_tmp) if name.startswith("bisect-onnx-"))
        raise raised("boom")

    monkeypatch.setattr(bisect_onnx.pipeline.torch_sample, "check_against_onnx", explode)
    status = main([MLP.factory, "--input", MLP.input_file, "--onnx", MLP.onnx_file])
    assert seen, "the step ran inside bisect-onnx's temporary folder"
    assert status == {KeyboardInterrupt: 130, RuntimeError: 4, InputError: 2}[raised]
    if raised is KeyboardInterrupt:
        assert _one_line_error(capsys) == "bisect-onnx: error: interrupted"
    assert [name for name in os.listdir(private_tmp) if name.startswith("bisect-onnx-")] == []


def test_temporary_folder_is_removed_after_an_export_failure(private_tmp, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.ones((3, 3), np.float32))
    status = main([_write_module(tmp_path, "return torch.histc(x, bins=4)"), "--input",
                   str(tmp_path / "x.npy")])
    assert status == 3
    _one_line_error(capsys)
    assert set(os.listdir(private_tmp)) <= THIRD_PARTY_TEMP_FILES
    assert not [name for name in os.listdir(private_tmp) if name.startswith("bisect-onnx-")]


# --- tolerances that are not numbers ---


@pytest.mark.parametrize("value", ["abc", "nan", "-inf"])
def test_non_numeric_or_nan_tolerance_is_one_line_exit_2(capsys, monkeypatch, value):
    monkeypatch.chdir(REPO_ROOT)
    try:
        status = main([MLP.factory, "--input", MLP.input_file, "--atol", value])
    except SystemExit as stop:  # argparse refuses "abc" itself
        status = stop.code
    assert status == 2
    _one_line_error(capsys)


# --- property tests on the input loaders ---

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

DTYPES = st.sampled_from([np.float16, np.float32, np.float64, np.int8, np.int32, np.int64,
                          np.uint8, np.bool_, np.complex64])
ARRAYS = DTYPES.flatmap(lambda dtype: hnp.arrays(
    dtype, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrays=st.lists(ARRAYS, min_size=1, max_size=3), as_npz=st.booleans(),
       compressed=st.booleans())
def test_loaders_return_the_arrays_or_a_clean_input_error(tmp_path, arrays, as_npz, compressed):
    folder = tempfile.mkdtemp(dir=tmp_path)
    if as_npz:
        path = os.path.join(folder, "in.npz")
        (np.savez_compressed if compressed else np.savez)(
            path, **{f"a{i}": array for i, array in enumerate(arrays)})
        paths = [path]
    else:
        paths = []
        for i, array in enumerate(arrays):
            paths.append(os.path.join(folder, f"{i}.npy"))
            np.save(paths[-1], array)
    try:
        loaded = load_input_files(paths)
    except BisectOnnxError as error:
        assert "\n" not in str(error)
        return
    values = list(loaded.values()) if isinstance(loaded, dict) else loaded
    assert len(values) == len(arrays)
    for got, want in zip(values, arrays, strict=True):
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(min_size=0, max_size=200), keep=st.integers(0, 400))
def test_loaders_turn_damaged_files_into_input_errors(tmp_path, data, keep):
    buffer = os.path.join(tempfile.mkdtemp(dir=tmp_path), "x.npy")
    np.save(buffer, np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    with open(buffer, "rb") as handle:
        good = handle.read()
    with open(buffer, "wb") as handle:
        handle.write(good[:keep] + data)
    try:
        load_input_files([buffer])
    except BisectOnnxError as error:
        assert "\n" not in str(error)


# --- property tests on the comparison: any dtype, zero-size and 0-d shapes ---

from bisect_onnx.judge.compare import Status, compare_arrays  # noqa: E402

ANY_SHAPE = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
FLOATS = st.sampled_from([np.float16, np.float32, np.float64, np.complex64])
TOLERANCES = st.floats(min_value=0.0, max_value=1e30, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None, database=None)
@given(array=DTYPES.flatmap(lambda dtype: hnp.arrays(dtype, ANY_SHAPE)), rtol=TOLERANCES,
       atol=TOLERANCES)
def test_an_array_always_agrees_with_itself(array, rtol, atol):
    with np.errstate(all="ignore"):
        result = compare_arrays(array, array.copy(), rtol=rtol, atol=atol)
    assert result.status == Status.PASS, result


@settings(max_examples=150, deadline=None, database=None)
@given(array=FLOATS.flatmap(lambda dtype: hnp.arrays(
           dtype, hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=5))),
       data=st.data(), rtol=TOLERANCES, atol=TOLERANCES)
def test_nan_on_one_side_only_is_always_a_divergence(array, data, rtol, atol):
    index = data.draw(st.integers(0, array.size - 1))
    other = array.copy()
    nan_side, plain_side = (array, other) if data.draw(st.booleans()) else (other, array)
    nan_side.flat[index] = np.nan
    plain_side.flat[index] = data.draw(st.sampled_from([0.0, 1.0, -np.inf, np.inf]))
    with np.errstate(all="ignore"):
        result = compare_arrays(array, other, rtol=rtol, atol=atol)
    assert result.status != Status.PASS
    assert result.nan_mismatch >= 1


@settings(max_examples=100, deadline=None, database=None)
@given(a=DTYPES.flatmap(lambda dtype: hnp.arrays(dtype, ANY_SHAPE)),
       b=DTYPES.flatmap(lambda dtype: hnp.arrays(dtype, ANY_SHAPE)))
def test_any_two_arrays_get_a_status_never_an_exception(a, b):
    with np.errstate(all="ignore"):
        result = compare_arrays(a, b, rtol=1e-3, atol=1e-5)
    assert result.status in {Status.PASS, Status.FAIL, Status.SHAPE_MISMATCH,
                             Status.DTYPE_MISMATCH, Status.NAN_MISMATCH}
    if a.shape != b.shape:
        assert result.status == Status.SHAPE_MISMATCH
    elif a.dtype != b.dtype:
        assert result.status == Status.DTYPE_MISMATCH


# --- nothing is written outside the temporary folder and the paths the user named ---


def test_a_diverging_run_writes_only_the_named_paths(private_tmp, tmp_path, monkeypatch, capsys,
                                                     fixtures_untouched):
    pool = FIXTURES["avgpool_divisor"]
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    monkeypatch.chdir(work)
    model_file, factory = pool.factory.split(":")
    status = main([f"{REPO_ROOT / model_file}:{factory}", "--input",
                   str(REPO_ROOT / pool.input_file), "--onnx", str(REPO_ROOT / pool.onnx_file),
                   "--json", str(out / "r.json"), "--html", str(out / "r.html"),
                   "--repro-dir", str(out / "repro"), "-q"])
    assert status == 1, capsys.readouterr().err
    assert os.listdir(work) == []
    # ONNX Runtime (".ses") and torch.export ("torchinductor_root") leave their own files
    # in the system's temporary folder; bisect-onnx itself must leave nothing there.
    assert set(os.listdir(private_tmp)) <= THIRD_PARTY_TEMP_FILES
    assert sorted(os.listdir(out)) == ["r.html", "r.json", "repro"]
