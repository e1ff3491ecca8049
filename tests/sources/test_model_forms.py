"""MODEL files detected by content (sources.model_forms), and pickles never run unasked."""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from bisect_onnx.errors import InputError, ModelError
from bisect_onnx.sources.model_forms import (
    EXPORTED_PROGRAM,
    PICKLED_MODULE,
    TORCHSCRIPT,
    detect_model_file,
    load_model_file,
)
from tests.torch_warnings import TORCH_JIT_DEPRECATED


class Tiny(torch.nn.Module):
    """Defined at module level so that ``torch.save(model)`` can find it again."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class WritesMarker:
    """Unpickling this opens (creates) ``marker``: proof that a pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


X = torch.randn(2, 4)


@pytest.fixture(scope="module")
def model() -> Tiny:
    torch.manual_seed(0)
    return Tiny().eval()


@pytest.fixture(scope="module")
def pt2_file(model, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pt2") / "model.bin"  # the extension says nothing
    torch.export.save(torch.export.export(model, (X,)), path)
    return path


def refusal(error_type, path: Path, **kwargs) -> str:
    with pytest.raises(error_type) as caught:
        load_model_file(path, **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_exported_program_detected_and_loaded(pt2_file, model):
    assert detect_model_file(pt2_file) == EXPORTED_PROGRAM
    loaded = load_model_file(pt2_file)
    assert (loaded.kind, loaded.path) == (EXPORTED_PROGRAM, pt2_file)
    assert isinstance(loaded.model, torch.export.ExportedProgram)
    torch.testing.assert_close(loaded.model.module()(X), model(X))


@pytest.mark.parametrize("make", [torch.jit.script, lambda m: torch.jit.trace(m, (X,))],
                         ids=["script", "trace"])
@TORCH_JIT_DEPRECATED
def test_torchscript_detected_and_loaded(model, tmp_path, make):
    path = tmp_path / "model.pt2"  # a misleading extension
    torch.jit.save(make(model), path)
    assert detect_model_file(path) == TORCHSCRIPT
    loaded = load_model_file(path)
    assert isinstance(loaded.model, torch.jit.ScriptModule)
    torch.testing.assert_close(loaded.model(X), model(X))


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_pickled_module_loaded_only_with_trust(model, tmp_path, zip_format):
    path = tmp_path / "model.pt"
    torch.save(model, path, _use_new_zipfile_serialization=zip_format)
    assert detect_model_file(path) == PICKLED_MODULE

    message = refusal(InputError, path)
    for wanted in ("--trust-pickle", "FILE.py:FACTORY", ".pt2", "TorchScript", str(path)):
        assert wanted in message

    loaded = load_model_file(path, trust_pickle=True)
    assert loaded.kind == PICKLED_MODULE
    torch.testing.assert_close(loaded.model(X), model(X))


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_pickle_is_never_executed_without_trust(tmp_path, zip_format):
    marker = tmp_path / "pickle-ran"
    path = tmp_path / "model.pt"
    torch.save(WritesMarker(marker), path, _use_new_zipfile_serialization=zip_format)

    assert detect_model_file(path) == PICKLED_MODULE
    assert "--trust-pickle" in refusal(InputError, path)
    assert not marker.exists()

    # The control: the pickle is armed, and trusting it does run it.
    assert "not a torch.nn.Module" in refusal(InputError, path, trust_pickle=True)
    assert marker.exists()


def test_pt2_with_a_hostile_pickle_inside_is_refused_without_trust(pt2_file, tmp_path):
    # torch.export.load unpickles the sample inputs with plain pickle when the safe
    # loader refuses them: a .pt2 can run code too.
    marker = tmp_path / "pickle-ran"
    hostile = io.BytesIO()
    torch.save((WritesMarker(marker),), hostile)
    path = tmp_path / "hostile.pt2"
    with zipfile.ZipFile(pt2_file) as source, zipfile.ZipFile(path, "w") as target:
        for info in source.infolist():
            data = source.read(info)
            target.writestr(info, hostile.getvalue() if "sample_inputs/" in info.filename
                            else data)

    assert detect_model_file(path) == EXPORTED_PROGRAM
    message = refusal(InputError, path)
    assert "sample_inputs/model.pt" in message and "--trust-pickle" in message
    assert not marker.exists()


@pytest.mark.parametrize("trust", [False, True])
def test_state_dict_is_refused_as_weights_only(model, tmp_path, trust):
    path = tmp_path / "weights.pt"
    torch.save(model.state_dict(), path)
    message = refusal(InputError, path, trust_pickle=trust)
    assert "weights only" in message and "state_dict of 2 tensors" in message
    assert "FILE.py:FACTORY" in message


def test_saved_tensors_are_refused_pointing_to_input(tmp_path):
    path = tmp_path / "inputs.pt"
    torch.save((X,), path)
    assert "--input" in refusal(InputError, path)


def _onnx_bytes() -> bytes:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(graph, producer_name="test").SerializeToString()


def _numpy_bytes(save) -> bytes:
    buffer = io.BytesIO()
    save(buffer)
    return buffer.getvalue()


def _half_a_torch_save() -> bytes:
    whole = _numpy_bytes(lambda buffer: torch.save(Tiny(), buffer))
    return whole[: len(whole) // 2]  # the zip's central directory is at the end


def _plain_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("readme.txt", "hello")
    return buffer.getvalue()


BAD_FILES = {
    "missing.pt": (None, "does not exist"),
    "folder": ("dir", "is a folder"),
    "empty.pt": (lambda: b"", "is empty"),
    "truncated.pt": (_half_a_torch_save, "truncated or corrupt zip"),
    "model.onnx.bak": (_onnx_bytes, "--onnx"),
    "x.npy": (lambda: _numpy_bytes(lambda b: np.save(b, np.zeros(3))), "--input"),
    "x.pt": (lambda: _numpy_bytes(lambda b: np.savez(b, x=np.zeros(2))), "--input"),
    "model.py": (lambda: b"import torch\n", "FILE.py:FACTORY"),
    "other.zip": (_plain_zip, "not one torch.save"),
}


@pytest.mark.parametrize("name", BAD_FILES)
def test_bad_files_are_input_errors(tmp_path, name):
    make, fix = BAD_FILES[name]
    path = tmp_path / name
    if make == "dir":
        path.mkdir()
    elif make is not None:
        path.write_bytes(make())
    with pytest.raises(InputError) as caught:
        detect_model_file(path)
    message = refusal(InputError, path)
    assert message == str(caught.value)
    assert fix in message and str(path) in message


def test_pt2_archive_without_a_graph_is_refused(tmp_path):
    path = tmp_path / "compiled.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("package/archive_format", "pt2")
        archive.writestr("package/data/aotinductor/model/model.so", b"\0")
    assert "AOTInductor" in refusal(InputError, path)


def test_broken_archive_of_a_known_form_is_a_model_error(tmp_path):
    path = tmp_path / "broken.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("broken/code/__torch__.py", "this is not TorchScript")
        archive.writestr("broken/constants.pkl", b"not a pickle")
    assert detect_model_file(path) == TORCHSCRIPT
    assert "torch.jit.load could not read" in refusal(ModelError, path)


def test_legacy_exported_program_layout_is_detected(tmp_path):
    path = tmp_path / "old.pt2"  # torch.export.save before the PT2 archive format
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("serialized_exported_program.json", "{}")
        archive.writestr("version", "5.1")
    assert detect_model_file(path) == EXPORTED_PROGRAM


def test_importing_the_module_does_not_import_torch():
    code = ("import sys, bisect_onnx.sources.model_forms, bisect_onnx.pytorch.program_side; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
