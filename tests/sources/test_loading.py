"""Unit tests for bisect_onnx.sources: input files, their arrangement and checks, MODEL specs."""

from __future__ import annotations

import io
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

from bisect_onnx.errors import InputError, ModelError, UsageError
from bisect_onnx.runtime.input_specs import InputSpec
from bisect_onnx.sources.arrangement import (
    arrange_inputs,
    check_input_count,
    forward_parameters,
    graph_keyword_order,
)
from bisect_onnx.sources.graph_inputs import check_against_onnx
from bisect_onnx.sources.loading import load_input_files, load_model


def raises_one_line(error_type, call, *args, **kwargs):
    """Call and return the message of the expected error, checking it is one line."""
    with pytest.raises(error_type) as caught:
        call(*args, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- load_input_files ---------------------------------------------------------------------


def test_npy_files_load_as_a_positional_list_in_order(tmp_path):
    first, second = np.arange(6.0).reshape(2, 3), np.array([1, 2], dtype=np.int64)
    np.save(tmp_path / "a.npy", first)
    np.save(tmp_path / "b.npy", second)
    loaded = load_input_files([tmp_path / "a.npy", tmp_path / "b.npy"])
    assert isinstance(loaded, list)
    assert len(loaded) == 2
    np.testing.assert_array_equal(loaded[0], first)
    np.testing.assert_array_equal(loaded[1], second)
    assert loaded[1].dtype == np.int64


def test_npy_is_recognised_by_content_not_extension(tmp_path):
    path = tmp_path / "input.bin"
    with path.open("wb") as handle:
        np.save(handle, np.ones(3, np.float32))
    [loaded] = load_input_files([path])
    np.testing.assert_array_equal(loaded, np.ones(3, np.float32))


def test_npz_loads_as_a_dict_of_named_arrays(tmp_path):
    np.savez(tmp_path / "in.npz", x=np.ones((2, 2)), mask=np.array([True, False]))
    loaded = load_input_files([tmp_path / "in.npz"])
    assert isinstance(loaded, dict)
    assert set(loaded) == {"x", "mask"}
    np.testing.assert_array_equal(loaded["mask"], [True, False])


def test_compressed_npz_loads(tmp_path):
    np.savez_compressed(tmp_path / "in.npz", x=np.arange(10))
    loaded = load_input_files([tmp_path / "in.npz"])
    np.testing.assert_array_equal(loaded["x"], np.arange(10))


def test_npz_mixed_with_npy_is_a_usage_error(tmp_path):
    np.save(tmp_path / "a.npy", np.ones(2))
    np.savez(tmp_path / "b.npz", x=np.ones(2))
    message = raises_one_line(UsageError, load_input_files,
                              [tmp_path / "a.npy", tmp_path / "b.npz"])
    assert "b.npz" in message


def test_two_npz_files_are_a_usage_error(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.ones(2))
    np.savez(tmp_path / "b.npz", y=np.ones(2))
    raises_one_line(UsageError, load_input_files, [tmp_path / "a.npz", tmp_path / "b.npz"])


def test_no_input_files_is_a_usage_error():
    raises_one_line(UsageError, load_input_files, [])


def test_missing_file_is_an_input_error_naming_it(tmp_path):
    path = tmp_path / "nope.npy"
    message = raises_one_line(InputError, load_input_files, [path])
    assert str(path) in message
    assert "does not exist" in message


def test_folder_is_an_input_error_naming_it(tmp_path):
    message = raises_one_line(InputError, load_input_files, [tmp_path])
    assert str(tmp_path) in message
    assert "folder" in message


def test_empty_file_is_an_input_error_naming_it(tmp_path):
    path = tmp_path / "empty.npy"
    path.write_bytes(b"")
    message = raises_one_line(InputError, load_input_files, [path])
    assert str(path) in message
    assert "empty" in message


def test_garbage_bytes_are_an_input_error_naming_the_file(tmp_path):
    path = tmp_path / "garbage.npy"
    path.write_bytes(b"this is not numpy data at all")
    message = raises_one_line(InputError, load_input_files, [path])
    assert str(path) in message


def _npy_bytes(array):
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


@pytest.mark.parametrize("keep", [6, 20, 100, -8], ids=["magic", "header", "data", "tail"])
def test_truncated_npy_is_an_input_error_naming_the_file(tmp_path, keep):
    path = tmp_path / "cut.npy"
    path.write_bytes(_npy_bytes(np.arange(64, dtype=np.float64))[:keep])
    message = raises_one_line(InputError, load_input_files, [path])
    assert str(path) in message


def test_truncated_npz_is_an_input_error_naming_the_file(tmp_path):
    np.savez(tmp_path / "full.npz", x=np.arange(100.0))
    path = tmp_path / "cut.npz"
    path.write_bytes((tmp_path / "full.npz").read_bytes()[:80])
    message = raises_one_line(InputError, load_input_files, [path])
    assert str(path) in message


def test_npy_error_in_a_later_file_names_that_file(tmp_path):
    np.save(tmp_path / "good.npy", np.ones(2))
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"junk")
    message = raises_one_line(InputError, load_input_files, [tmp_path / "good.npy", bad])
    assert str(bad) in message


def _corrupt_deflate_npz(path: Path) -> None:
    """A compressed .npz whose zip directory is intact but whose deflate stream is not."""
    np.savez_compressed(path, x=np.arange(1000.0))
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("x.npy")
    header = info.header_offset
    name_length = int.from_bytes(data[header + 26:header + 28], "little")
    extra_length = int.from_bytes(data[header + 28:header + 30], "little")
    data[header + 30 + name_length + extra_length] = 0xFF  # BTYPE 11: a reserved block type
    path.write_bytes(bytes(data))


def test_corrupt_compressed_npz_is_an_input_error(tmp_path):
    path = tmp_path / "corrupt.npz"
    _corrupt_deflate_npz(path)
    try:
        load_input_files([path])
    except InputError as error:
        assert str(path) in str(error)
    else:
        pytest.fail("a corrupt .npz loaded without error")


def test_npz_member_that_is_not_npy_data_is_an_input_error(tmp_path):
    path = tmp_path / "odd.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", b"definitely not an array")
    try:
        loaded = load_input_files([path])
    except InputError as error:
        assert str(path) in str(error)
    else:
        assert all(isinstance(value, np.ndarray) for value in loaded.values()), loaded


def test_npy_header_claiming_a_huge_shape_is_an_input_error(tmp_path):
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": "<f8", "fortran_order": False, "shape": (10**17,)}
    )
    path = tmp_path / "lying.npy"
    path.write_bytes(buffer.getvalue() + b"\0" * 64)
    message = raises_one_line(InputError, load_input_files, [path])
    assert str(path) in message


# --- object arrays are refused, never unpickled ---------------------------------------------


class _WritesMarkerWhenUnpickled:
    """Unpickling this calls ``open(marker, "w")``, which creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _object_array(marker: Path) -> np.ndarray:
    array = np.empty(2, dtype=object)
    array[0] = _WritesMarkerWhenUnpickled(marker)
    array[1] = 1
    return array


def test_marker_payload_really_fires_when_unpickled(tmp_path):
    # Control: the payload below is live, so its absence later means it was not unpickled.
    marker = tmp_path / "control-marker"
    np.save(tmp_path / "control.npy", _object_array(marker), allow_pickle=True)
    loaded = np.load(tmp_path / "control.npy", allow_pickle=True)
    loaded[0].close()
    assert marker.exists()


def test_object_npy_is_refused_without_unpickling(tmp_path):
    marker = tmp_path / "unpickled-marker"
    path = tmp_path / "objects.npy"
    np.save(path, _object_array(marker), allow_pickle=True)
    message = raises_one_line(InputError, load_input_files, [path])
    assert str(path) in message
    assert "object" in message
    assert not marker.exists()


def test_object_npz_is_refused_without_unpickling(tmp_path):
    marker = tmp_path / "unpickled-marker"
    path = tmp_path / "objects.npz"
    np.savez(path, x=np.ones(2), payload=_object_array(marker))
    message = raises_one_line(InputError, load_input_files, [path])
    assert str(path) in message
    assert "object" in message
    assert not marker.exists()


# --- arrange_inputs ---------------------------------------------------------------------


def test_positional_inputs_are_kept_in_order():
    a, b = np.zeros(1), np.ones(2)
    arranged = arrange_inputs([a, b], forward_names=["y", "x"])
    assert len(arranged) == 2
    np.testing.assert_array_equal(arranged[0], a)
    np.testing.assert_array_equal(arranged[1], b)


def test_named_inputs_follow_forward_order_not_file_order():
    given = {"mask": np.array([1]), "x": np.array([2])}
    arranged = arrange_inputs(given, forward_names=["x", "mask"])
    assert [int(a[0]) for a in arranged] == [2, 1]


def test_named_inputs_may_use_onnx_input_names():
    given = {"input_b": np.array([2]), "input_a": np.array([1])}
    arranged = arrange_inputs(given, forward_names=["x", "y"], onnx_names=["input_a", "input_b"])
    assert [int(a[0]) for a in arranged] == [1, 2]


def test_named_inputs_may_leave_out_trailing_parameters():
    arranged = arrange_inputs({"x": np.array([1])}, forward_names=["x", "scale"])
    assert len(arranged) == 1


GPT2_FORWARD = ["input_ids", "cache", "attention_mask", "token_type_ids"]


def test_graph_inputs_that_skip_a_parameter_go_by_name_in_the_graphs_order():
    order = graph_keyword_order(["attention_mask", "input_ids"], forward_names=GPT2_FORWARD,
                                required=1)
    assert order == ["attention_mask", "input_ids"]


@pytest.mark.parametrize("onnx_names", [
    ["input_ids"],                      # a leading run: by position
    ["input_ids", "cache"],
    ["input.1", "attention_mask"],      # a name forward does not take
    ["attention_mask"],                 # leaves out the required input_ids
])
def test_graph_inputs_go_by_position_unless_names_must_be_used(onnx_names):
    assert graph_keyword_order(onnx_names, forward_names=GPT2_FORWARD, required=1) == []


def test_positional_npz_keys_are_ordered_numerically():
    given = {f"arr_{i}": np.array([i]) for i in (10, 2, 0, 1, 3, 4, 5, 6, 7, 8, 9)}
    arranged = arrange_inputs(given, forward_names=[])
    assert [int(a[0]) for a in arranged] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]


def test_positional_npz_keys_with_a_gap_are_an_input_error():
    given = {"arr_0": np.zeros(1), "arr_2": np.zeros(1)}
    message = raises_one_line(InputError, arrange_inputs, given, forward_names=["x", "y"])
    assert "arr_2" in message


def test_missing_named_input_is_an_input_error_naming_it():
    message = raises_one_line(InputError, arrange_inputs, {"x": np.zeros(1)},
                              forward_names=["ids", "x"])
    assert "missing ids" in message


def test_extra_named_input_is_an_input_error_naming_it():
    given = {"x": np.zeros(1), "bogus": np.zeros(1)}
    message = raises_one_line(InputError, arrange_inputs, given, forward_names=["x"])
    assert "unexpected bogus" in message


def test_optional_parameters_are_not_listed_as_missing():
    message = raises_one_line(InputError, arrange_inputs, {"q": np.zeros(1)},
                              forward_names=["x", "y", "mask"], required=2)
    assert "missing x, y;" in message and "optional: mask" in message


def test_a_state_dict_given_as_inputs_is_named_as_such():
    weights = {"fc1.weight": np.zeros((2, 2)), "fc1.bias": np.zeros(2)}
    message = raises_one_line(InputError, arrange_inputs, weights, forward_names=["x"],
                              weight_names=["fc1.weight", "fc1.bias", "fc2.weight"])
    assert "the model's weights (a state_dict)" in message
    assert "forward takes (x)" in message and ".npz" not in message


def test_mismatched_keys_error_lists_forward_and_onnx_names():
    message = raises_one_line(InputError, arrange_inputs, {"q": np.zeros(1)},
                              forward_names=["x"], onnx_names=["input_0"])
    assert "q" in message
    assert "x" in message
    assert "input_0" in message


# --- check_against_onnx -------------------------------------------------------------------


FLOAT_SPEC = InputSpec("x", np.dtype(np.float32), (1, 3, 8))


def test_matching_inputs_pass_the_onnx_check():
    assert check_against_onnx([np.zeros((1, 3, 8), np.float32)], [FLOAT_SPEC]) is None


def test_wrong_input_count_is_an_input_error():
    arrays = [np.zeros((1, 3, 8), np.float32)] * 2
    message = raises_one_line(InputError, check_against_onnx, arrays, [FLOAT_SPEC])
    assert "got 2 input(s)" in message
    assert "takes 1" in message


def test_wrong_dtype_is_an_input_error():
    message = raises_one_line(InputError, check_against_onnx,
                              [np.zeros((1, 3, 8), np.float64)], [FLOAT_SPEC])
    assert "dtype float64, expected float32" in message
    assert "(x)" in message


def test_wrong_rank_is_an_input_error():
    message = raises_one_line(InputError, check_against_onnx,
                              [np.zeros((3, 8), np.float32)], [FLOAT_SPEC])
    assert "rank 2, expected 3" in message


def test_wrong_fixed_dimension_is_an_input_error():
    message = raises_one_line(InputError, check_against_onnx,
                              [np.zeros((1, 4, 8), np.float32)], [FLOAT_SPEC])
    assert "dimension 1 is 4, expected 3" in message


@pytest.mark.parametrize("free", [None, "batch"])
def test_free_dimension_accepts_any_size(free):
    spec = InputSpec("x", np.dtype(np.float32), (free, 3))
    for batch in (1, 7, 0):
        assert check_against_onnx([np.zeros((batch, 3), np.float32)], [spec]) is None


def test_free_dimension_still_checks_the_fixed_ones():
    spec = InputSpec("x", np.dtype(np.float32), ("batch", 3))
    raises_one_line(InputError, check_against_onnx, [np.zeros((5, 4), np.float32)], [spec])


def test_unknown_shape_accepts_any_rank():
    spec = InputSpec("x", np.dtype(np.int64), None)
    assert check_against_onnx([np.zeros((2, 3, 4), np.int64)], [spec]) is None


def test_second_input_error_names_its_position():
    specs = [FLOAT_SPEC, InputSpec("ids", np.dtype(np.int64), (2,))]
    arrays = [np.zeros((1, 3, 8), np.float32), np.zeros(2, np.int32)]
    message = raises_one_line(InputError, check_against_onnx, arrays, specs)
    assert "input 1 (ids)" in message


# --- headers checked against the graph before the data is read --------------------------


def _npz_lying_about_its_shape(path: Path, key: str, shape: tuple[int, ...]) -> Path:
    """An archive whose member's header declares ``shape`` over far fewer bytes of data."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"{key}.npy", header.getvalue() + b"\0" * 64)
    return path


@pytest.fixture
def data_never_read(monkeypatch):
    """Loading any array's data fails the test: only headers may be read."""
    def refuse(*args, **kwargs):
        raise AssertionError("the data was read")
    monkeypatch.setattr(np, "load", refuse)


@pytest.mark.parametrize("key", ["x", "arr_0"])
def test_npz_member_of_the_wrong_shape_is_refused_from_its_header(tmp_path, key,
                                                                   data_never_read):
    # 40 GB declared, 64 bytes stored: reading it would fail as truncated, not as this.
    path = _npz_lying_about_its_shape(tmp_path / "in.npz", key, (10_000, 1_000_000))
    message = raises_one_line(InputError, load_input_files, [path], max_memory="1TiB",
                              graph_inputs=[FLOAT_SPEC])
    assert f"entry {key!r} of {path} (input 0, x)" in message
    assert "rank 2, expected 3" in message and "x: float32[1,3,8]" in message


def test_npz_member_of_the_wrong_dtype_is_refused_from_its_header(tmp_path, data_never_read):
    path = tmp_path / "in.npz"
    np.savez(path, x=np.zeros((1, 3, 8), np.float64))
    message = raises_one_line(InputError, load_input_files, [path], graph_inputs=[FLOAT_SPEC])
    assert "dtype float64, expected float32 (convert with .astype)" in message


def test_npz_with_more_members_than_graph_inputs_is_refused_unread(tmp_path, data_never_read):
    path = tmp_path / "in.npz"
    np.savez(path, x=np.zeros((1, 3, 8), np.float32), y=np.zeros(2, np.float32))
    message = raises_one_line(InputError, load_input_files, [path], graph_inputs=[FLOAT_SPEC])
    assert "got 2 input array(s)" in message and "(x, y)" in message and "takes 1" in message


def test_npz_members_that_fit_the_graph_load(tmp_path):
    path = tmp_path / "in.npz"
    big_endian = np.arange(24, dtype=">f4").reshape(1, 3, 8)  # made native before compared
    np.savez(path, x=big_endian)
    loaded = load_input_files([path], graph_inputs=[FLOAT_SPEC])
    np.testing.assert_array_equal(loaded["x"], big_endian)


def test_npz_keyed_by_forward_parameters_is_checked_only_after_loading(tmp_path):
    # Which graph input "image" is, only forward's signature says: the model is not known yet.
    path = tmp_path / "in.npz"
    np.savez(path, image=np.zeros((5, 5), np.float32))
    loaded = load_input_files([path], graph_inputs=[FLOAT_SPEC])
    assert loaded["image"].shape == (5, 5)


def test_npy_of_the_wrong_shape_is_refused_from_its_header(tmp_path, data_never_read):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros((1, 4, 8), np.float32))
    message = raises_one_line(InputError, load_input_files, [path], graph_inputs=[FLOAT_SPEC])
    assert f"input {path} (input 0, x)" in message and "dimension 1 is 4, expected 3" in message


def test_more_npy_files_than_graph_inputs_are_refused_unread(tmp_path, data_never_read):
    paths = [tmp_path / "a.npy", tmp_path / "b.npy"]
    for path in paths:
        np.save(path, np.zeros((1, 3, 8), np.float32))
    message = raises_one_line(InputError, load_input_files, paths, graph_inputs=[FLOAT_SPEC])
    assert "got 2 input file(s)" in message and "takes 1" in message


# --- load_model ---------------------------------------------------------------------------


@pytest.fixture
def model_file(tmp_path, monkeypatch):
    """Write a model file into tmp_path; load_model's sys.path change is undone afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))

    def write(source: str, name: str = "user_model.py") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path

    return write


MODEL_SOURCE = """
    import torch

    class Net(torch.nn.Module):
        def forward(self, x):
            return x * 2

    def build():
        return Net()

    def helper():
        return 1

    def not_a_model():
        return 42

    def broken():
        raise RuntimeError("weights missing\\nsecond line of detail")

    def sized(width, depth=2, *layers, **options):
        return Net()

    NUMBER = 3
"""


def test_load_model_calls_the_factory(model_file):
    import torch

    path = model_file(MODEL_SOURCE)
    model = load_model(f"{path}:build")
    assert isinstance(model, torch.nn.Module)
    assert type(model).__name__ == "Net"


def test_what_a_factory_logs_and_prints_goes_to_the_log(model_file, capfd, caplog):
    # As transformers' config checks do: a logger with its own handler on stderr.
    path = model_file(textwrap.dedent("""
        import logging, sys
        import torch

        def chatty():
            logger = logging.getLogger("a_model_library")
            logger.propagate = False
            logger.addHandler(logging.StreamHandler())
            logger.warning("[a_model_library] bos_token_id is outside the vocabulary")
            print("building the model")
            return torch.nn.Identity()
        """))
    with caplog.at_level("INFO", logger="bisect_onnx"):
        load_model(f"{path}:chatty")
    assert capfd.readouterr() == ("", "")
    assert "bos_token_id is outside the vocabulary" in caplog.text


def test_load_model_accepts_a_class_as_factory(model_file):
    path = model_file(MODEL_SOURCE)
    assert type(load_model(f"{path}:Net")).__name__ == "Net"


def test_missing_factory_lists_the_available_callables(model_file):
    path = model_file(MODEL_SOURCE)
    message = raises_one_line(InputError, load_model, f"{path}:biuld")
    assert "'biuld'" in message
    for name in ("build", "helper", "Net", "not_a_model"):
        assert name in message
    assert "NUMBER" not in message


def test_non_callable_factory_is_an_input_error(model_file):
    path = model_file(MODEL_SOURCE)
    message = raises_one_line(InputError, load_model, f"{path}:NUMBER")
    assert "int" in message


def test_factory_returning_a_non_module_is_an_input_error(model_file):
    path = model_file(MODEL_SOURCE)
    message = raises_one_line(InputError, load_model, f"{path}:not_a_model")
    assert "int" in message
    assert "torch.nn.Module" in message


def test_factory_raising_is_a_model_error_with_the_first_line(model_file):
    path = model_file(MODEL_SOURCE)
    message = raises_one_line(ModelError, load_model, f"{path}:broken")
    assert "RuntimeError" in message
    assert "weights missing" in message
    assert "second line" not in message


def test_a_factory_that_needs_arguments_is_a_usage_error_naming_them(model_file):
    path = model_file(MODEL_SOURCE)
    message = raises_one_line(UsageError, load_model, f"{path}:sized")
    assert "needs arguments (width)" in message  # depth has a default; *layers may be empty
    assert "def build(): return sized(...)" in message


def test_model_file_failing_to_import_is_a_model_error(model_file):
    path = model_file("import torch\nraise ImportError('needs cuda')\n", name="bad_model.py")
    message = raises_one_line(ModelError, load_model, f"{path}:build")
    assert "needs cuda" in message


def test_missing_model_file_is_an_input_error(tmp_path):
    path = tmp_path / "absent.py"
    message = raises_one_line(InputError, load_model, f"{path}:build")
    assert str(path) in message
    assert "does not exist" in message


def test_model_folder_is_an_input_error(tmp_path):
    folder = tmp_path / "pkg.py"
    folder.mkdir()
    message = raises_one_line(InputError, load_model, f"{folder}:build")
    assert "folder" in message


def test_missing_module_is_an_input_error(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    message = raises_one_line(InputError, load_model, "no_such_package_xyz.models:build")
    assert "no_such_package_xyz" in message


@pytest.mark.parametrize("spec", ["model.py", "models.build", "model.py:", ":build",
                                  "model.py:not-an-identifier"])
def test_malformed_model_spec_is_a_usage_error(spec):
    message = raises_one_line(UsageError, load_model, spec)
    assert "FACTORY" in message


@pytest.mark.parametrize("spec", ["model.pt", "weights.pth", "exported.pt2"])
def test_missing_saved_model_file_is_an_input_error(spec):
    message = raises_one_line(InputError, load_model, spec)
    assert "does not exist" in message


def test_onnx_file_as_model_is_a_usage_error_naming_the_forms():
    message = raises_one_line(UsageError, load_model, "exported.onnx")
    assert "FACTORY" in message and ".pt2" in message


# --- check_forward_count ------------------------------------------------------------------


def check_forward_count(inputs, model):
    names, required, variadic = forward_parameters(model)
    return check_input_count(inputs, names=names, required=required, variadic=variadic,
                             owner=type(model).__name__)


def _module(forward):
    import torch

    class Model(torch.nn.Module):
        pass

    Model.forward = forward
    return Model()


def test_forward_count_accepts_required_and_optional_arguments():
    model = _module(lambda self, x, mask=None: x)
    assert check_forward_count([np.zeros(1)], model) is None
    assert check_forward_count([np.zeros(1), np.zeros(1)], model) is None


def test_forward_count_refuses_too_few_inputs():
    model = _module(lambda self, x, mask=None: x)
    message = raises_one_line(InputError, check_forward_count, [], model)
    assert "got 0 input(s)" in message
    assert "1 to 2" in message
    assert "(x; optional: mask): missing x" in message


def test_forward_count_names_the_missing_required_inputs_apart_from_optional_ones():
    model = _module(lambda self, x, y, mask=None, scale=1.0: x)
    message = raises_one_line(InputError, check_forward_count, [np.zeros(1)], model)
    assert "(x, y; optional: mask, scale): missing y;" in message


def test_forward_count_refuses_too_many_inputs():
    model = _module(lambda self, x: x)
    message = raises_one_line(InputError, check_forward_count, [np.zeros(1)] * 2, model)
    assert "got 2 input(s)" in message
    assert "takes 1" in message


def test_forward_count_with_var_args_accepts_any_extra_inputs():
    model = _module(lambda self, x, *rest: x)
    assert check_forward_count([np.zeros(1)] * 5, model) is None
    raises_one_line(InputError, check_forward_count, [], model)
