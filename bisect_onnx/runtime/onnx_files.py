"""Reading the user's ONNX file: its graph without external weights, checked, parsed once.

The file is never written to. External weights stored outside the model's folder are
refused before anything reads them. A file with its weights inside takes seconds to
parse: the model read to check the inputs is handed to the side that runs the file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from bisect_onnx.errors import InputError
from bisect_onnx.graph.walk import graph_tensors

if TYPE_CHECKING:
    import onnx

__all__ = ["load_onnx_model", "hand_over", "file_key"]

#: A model read for its graph's inputs alone, kept for the next reader of the same
#: file (unchanged since): a file with its weights inside takes seconds to parse.
_HANDED_OVER: dict[tuple[str, int, int], onnx.ModelProto] = {}


def hand_over(path: Path, model: onnx.ModelProto) -> None:
    """Give ``model``, just read from ``path`` and no longer used, to its next reader."""
    _HANDED_OVER.clear()
    _HANDED_OVER[_file_key(path)] = model


def _file_key(path: Path) -> tuple[str, int, int]:
    status = path.stat()
    return str(path.resolve()), status.st_mtime_ns, status.st_size


def file_key(path: Path) -> tuple[str, int, int] | None:
    """What tells the file at ``path`` changed: where it is, when written, its size."""
    try:
        return _file_key(path)
    except OSError:
        return None


def load_onnx_model(path: Path, *, read: Callable[[Path, tuple[str, int, int]],
                                                 onnx.ModelProto | None] | None = None,
                    ) -> onnx.ModelProto:
    """Read an ONNX file's graph (not its external weights), with a clear error if it is not one.

    ``read``: a faster reading of the file as it is now (its key), tried first; where it
    gives ``None``, protobuf parses the file whole.
    """
    import onnx

    if not path.exists():
        raise InputError(f"ONNX file {path} does not exist; check the --onnx path")
    if path.is_dir():
        raise InputError(f"--onnx {path} is a folder; pass the .onnx file inside it")
    key = _file_key(path)
    handed = _HANDED_OVER.pop(key, None)
    if handed is not None:
        return handed
    for stale in [known for known in _HANDED_OVER if known[0] == key[0]]:
        del _HANDED_OVER[stale]  # the file changed since: that model is not its graph
    model = read(path, key) if read is not None else None
    if model is not None:
        _check_external_data_locations(model, path)
        return model
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # protobuf raises DecodeError, others for truncation
        raise InputError(
            f"{path} is not a readable ONNX model ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else 'parse failed'}); "
            "pass the .onnx file that torch.onnx.export wrote"
        ) from error
    _check_external_data_locations(model, path)
    return model


def _check_external_data_locations(model: onnx.ModelProto, path: Path) -> None:
    """Refuse external weights stored outside the model's folder (never read them)."""
    from onnx.external_data_helper import uses_external_data

    folder = path.resolve().parent
    for tensor in graph_tensors(model.graph):
        if not uses_external_data(tensor):
            continue
        location = next((entry.value for entry in tensor.external_data
                         if entry.key == "location"), "")
        target = (folder / location).resolve()
        if Path(location).is_absolute() or not target.is_relative_to(folder):
            raise InputError(
                f"{path}: weight {tensor.name!r} names external data {location!r}, outside "
                f"the model's folder {folder}; refused: keep the weights file beside the "
                ".onnx file and name it by a relative path")
