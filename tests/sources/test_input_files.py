"""Inputs saved with torch.save: what loads, what is refused, and that nothing is unpickled."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from bisect_onnx.errors import InputError
from bisect_onnx.sources.input_files import is_torch_save_file, load_pt_inputs
from tests.torch_warnings import TORCH_JIT_DEPRECATED


class WritesMarker:
    """Unpickling this opens (creates) the marker file: a stand-in for arbitrary code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def save(tmp_path: Path, obj: object, name: str = "inputs.pt", **kwargs) -> Path:
    path = tmp_path / name
    torch.save(obj, path, **kwargs)
    return path


def refusal(path: Path) -> str:
    with pytest.raises(InputError) as caught:
        load_pt_inputs(path)
    message = str(caught.value)
    assert "\n" not in message
    assert str(path) in message
    return message


def test_a_tensor_is_one_positional_input(tmp_path):
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    arrays = load_pt_inputs(save(tmp_path, tensor))
    assert isinstance(arrays, list) and len(arrays) == 1
    np.testing.assert_array_equal(arrays[0], tensor.numpy())
    assert arrays[0].dtype == np.float32


@pytest.mark.parametrize("container", [tuple, list])
def test_a_tuple_or_list_gives_positional_inputs_in_order(tmp_path, container):
    ids = torch.tensor([[1, 2, 3]])
    scale = torch.tensor(0.5, dtype=torch.float64)
    arrays = load_pt_inputs(save(tmp_path, container([ids, scale])))
    assert [array.dtype for array in arrays] == [np.int64, np.float64]
    np.testing.assert_array_equal(arrays[0], [[1, 2, 3]])
    assert arrays[1].shape == () and arrays[1] == 0.5


def test_a_dict_gives_named_inputs(tmp_path):
    saved = {"input_ids": torch.tensor([[5, 6]]), "attention_mask": torch.ones(1, 2,
                                                                               dtype=torch.bool)}
    arrays = load_pt_inputs(save(tmp_path, saved))
    assert list(arrays) == ["input_ids", "attention_mask"]
    np.testing.assert_array_equal(arrays["input_ids"], [[5, 6]])
    assert arrays["attention_mask"].dtype == np.bool_


def test_tensors_that_need_grad_or_are_views_load_as_plain_copies(tmp_path):
    parameter = torch.nn.Parameter(torch.ones(2, 3))
    view = torch.arange(12.0).reshape(3, 4).t()
    first, second = load_pt_inputs(save(tmp_path, (parameter, view)))
    np.testing.assert_array_equal(first, np.ones((2, 3)))
    np.testing.assert_array_equal(second, np.arange(12.0).reshape(3, 4).T)
    assert second.flags.c_contiguous


def test_the_legacy_format_loads(tmp_path):
    path = save(tmp_path, {"x": torch.ones(2)}, _use_new_zipfile_serialization=False)
    assert is_torch_save_file(path)
    np.testing.assert_array_equal(load_pt_inputs(path)["x"], [1.0, 1.0])


def test_a_pickled_object_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "marker"
    # The payload is live: plain unpickling creates the marker file.
    pickle.loads(pickle.dumps(WritesMarker(marker)))
    assert marker.exists()
    marker.unlink()

    path = save(tmp_path, {"x": torch.ones(1), "payload": WritesMarker(marker)})
    message = refusal(path)
    assert not marker.exists()
    assert "Python objects" in message and "unpickling" in message
    assert "torch.save(" in message  # how to save plain tensors


def test_numpy_arrays_inside_a_pt_file_are_refused_with_a_hint(tmp_path):
    message = refusal(save(tmp_path, (np.ones(2),)))
    assert "Python objects" in message and "torch.from_numpy" in message


def test_bfloat16_is_refused_not_converted(tmp_path):
    message = refusal(save(tmp_path, {"x": torch.ones(2, dtype=torch.bfloat16)}))
    assert "bfloat16 inputs are not supported yet" in message and "'x'" in message


@pytest.mark.parametrize(("content", "expected"), [
    (3, "holds an int"),
    ("text", "holds a str"),
    (None, "holds None"),
    ((), "holds an empty tuple"),
    ({}, "holds an empty dict"),
    ([torch.ones(1), 2], "item 1 is an int"),
    ((torch.ones(1), (torch.ones(1),)), "item 1 is a tuple"),
    ({"a": {"b": torch.ones(1)}}, "entry 'a' is a dict"),
    ({0: torch.ones(1)}, "key 0"),
    (torch.ones(2, 2).to_sparse(), "sparse"),
])
def test_other_contents_are_refused_saying_what_is_accepted(tmp_path, content, expected):
    message = refusal(save(tmp_path, content))
    assert expected in message
    if "sparse" not in expected:
        assert "a tuple or list of tensors, or a dict" in message


def _zip_save(tmp_path: Path) -> bytes:
    return save(tmp_path, torch.ones(100), "source.pt").read_bytes()


@pytest.mark.parametrize(("make", "expected"), [
    (lambda tmp: tmp / "missing.pt", "does not exist"),
    (lambda tmp: tmp, "is a folder"),
    (lambda tmp: _write(tmp, b""), "is empty"),
    (lambda tmp: _write(tmp, b"hello, not a tensor"), "not a torch.save file"),
    (lambda tmp: _write(tmp, _zip_save(tmp)[:200]), "truncated or corrupt"),
    (lambda tmp: _write(tmp, save(tmp, torch.ones(3), "legacy.pt",
                                  _use_new_zipfile_serialization=False).read_bytes()[:30]),
     "truncated or corrupt"),
    (lambda tmp: _corrupt_data_pkl(tmp), "cannot be read"),
    (lambda tmp: _npy(tmp), "not a torch.save file"),
])
def test_unreadable_files_give_one_line(tmp_path, make, expected):
    assert expected in refusal(make(tmp_path))


@TORCH_JIT_DEPRECATED
def test_a_torchscript_archive_is_named_as_a_model(tmp_path):
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(torch.nn.ReLU()), path)
    assert not is_torch_save_file(path)
    assert "TorchScript archive" in refusal(path)


def _write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "bad.pt"
    path.write_bytes(data)
    return path


def _corrupt_data_pkl(tmp_path: Path) -> Path:
    source = save(tmp_path, torch.ones(2), "good.pt")
    path = tmp_path / "bad.pt"
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(path, "w") as copy:
        for name in original.namelist():
            data = original.read(name)
            copy.writestr(name, b"\x80\x02garbage" if name.endswith("/data.pkl") else data)
    return path


def _npy(tmp_path: Path) -> Path:
    path = tmp_path / "array.pt"  # the extension lies; the content decides
    with path.open("wb") as handle:
        np.save(handle, np.ones(3))
    return path


def test_is_torch_save_file_reads_content_not_extensions(tmp_path):
    assert is_torch_save_file(save(tmp_path, torch.ones(2), "tensor.bin"))
    assert is_torch_save_file(save(tmp_path, (torch.ones(2),), "legacy.npy",
                                   _use_new_zipfile_serialization=False))
    # A cut-off torch.save zip is still one (so the loader can say it is truncated).
    assert is_torch_save_file(_write(tmp_path, _zip_save(tmp_path)[:200]))

    np.save(tmp_path / "a.npy", np.ones(2))
    np.savez(tmp_path / "b.npz", x=np.ones(2))
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])]))
    onnx.save(model, tmp_path / "model.pt")
    (tmp_path / "garbage.pt").write_bytes(b"\x80\x02not torch")
    (tmp_path / "empty.pt").write_bytes(b"")
    for name in ("a.npy", "b.npz", "model.pt", "garbage.pt", "empty.pt", "missing.pt"):
        assert not is_torch_save_file(tmp_path / name), name
    assert not is_torch_save_file(tmp_path)


def test_the_graph_read_for_the_inputs_is_handed_to_the_side_and_not_kept(tmp_path):
    import os

    from bisect_onnx.runtime import onnx_files
    from bisect_onnx.sources.input_samples import load_input_samples
    from fixtures.registry import FIXTURES, load_inputs, repo_path

    fixture = FIXTURES["tiny_mlp"]
    path = tmp_path / "model.onnx"
    path.write_bytes(repo_path(fixture.onnx_file).read_bytes())
    np.savez(tmp_path / "inputs.npz", **load_inputs(fixture))
    load_input_samples([tmp_path / "inputs.npz"], onnx_model=path)
    # The file is parsed once: the next reader gets that model, and it is not kept.
    handed = onnx_files.load_onnx_model(path)
    assert onnx_files.load_onnx_model(path) is not handed
    load_input_samples([tmp_path / "inputs.npz"], onnx_model=path)
    # A file changed since is read again.
    os.utime(path, ns=(0, 0))
    again = onnx_files.load_onnx_model(path)
    assert again == handed and not onnx_files._HANDED_OVER
