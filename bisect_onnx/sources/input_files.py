"""Inputs saved with ``torch.save``: a tensor, a tuple or list of tensors, or a dict of them.

Files are read with ``torch.load(weights_only=True)``: a ``.pt`` can hold any
pickled Python object, and unpickling one runs arbitrary code, so a file that
needs more than tensors and plain containers is refused, never unpickled.
"""

from __future__ import annotations

import re
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.errors import InputError, one_line
from bisect_onnx.sources.file_kinds import PICKLE_PROTO, ZIP_MAGIC, read_head

if TYPE_CHECKING:
    import torch

__all__ = ["load_pt_inputs", "is_torch_save_file", "torch_file_kind"]

# torch.save's legacy (pre-1.6, or _use_new_zipfile_serialization=False) format
# opens with this number pickled as a LONG1: 0x1950a86a20f9469cfc6c, little-endian.
_LEGACY_MAGIC = bytes.fromhex("6cfc9c46f9206aa85019")
_ACCEPTED = ("save a tensor, a tuple or list of tensors, or a dict of name -> tensor "
             "with torch.save")
_SAVE_PLAIN = ("save plain tensors instead, e.g. torch.save((x, y), path) or "
               "torch.save({'input_ids': ids}, path)")
# The weights-only unpickler's reasons for refusing an object (rather than a corrupt stream).
_GLOBAL_REFUSED = re.compile(r"GLOBAL (\S+)|unrecognized function (\S+)|"
                             r"Can only (?:create|build)|must be imported")


def is_torch_save_file(path: Path) -> bool:
    """Whether ``path`` holds ``torch.save`` data, by content, not by extension.

    A ``torch.save`` file is either a zip whose one top-level folder holds
    ``data.pkl`` or a pickle that starts with torch's legacy magic number.
    TorchScript and ``torch.export`` archives are zips of one folder too, but
    models, not saved inputs; ``.npy``, ``.npz`` and ONNX files are neither.
    """
    return torch_file_kind(Path(path)) == "save"


def torch_file_kind(path: Path) -> str | None:
    """``"save"``, ``"torchscript"``, ``"exported_program"`` or None (not torch's)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(512)  # room for the first zip member's name
    except OSError:
        return None
    if head[:1] == bytes([PICKLE_PROTO]) and _LEGACY_MAGIC in head[:32]:
        return "save"
    if not head.startswith(ZIP_MAGIC):
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        # No central directory (a truncated file): torch.save writes data.pkl first,
        # so the first local header's name still tells it apart from an .npz.
        return "save" if _first_zip_member(head).endswith("/data.pkl") else None
    roots = {name.split("/", 1)[0] for name in names}
    if len(roots) != 1:
        return None
    root = roots.pop()
    if f"{root}/constants.pkl" in names:
        return "torchscript"
    if f"{root}/archive_format" in names:
        return "exported_program"
    return "save" if f"{root}/data.pkl" in names else None


def _first_zip_member(head: bytes) -> str:
    """The file name in the zip local header at the start of ``head`` ("" if cut short)."""
    if len(head) < 30:
        return ""
    length = int.from_bytes(head[26:28], "little")
    return head[30:30 + length].decode("utf-8", "replace") if len(head) >= 30 + length else ""


def load_pt_inputs(path: Path) -> list[np.ndarray] | dict[str, np.ndarray]:
    """Read a ``torch.save`` file of inputs: positional (a list) or named (a dict).

    A tensor is one positional input; a tuple or list gives positional inputs in
    order; a dict of str -> tensor gives named inputs. Tensors become numpy arrays
    (detached, on the CPU, their dtype kept).
    """
    path = Path(path)
    _check_file(path)
    import torch

    try:
        with warnings.catch_warnings():
            # torch's own warnings (pickle protocol, storage deprecations) say nothing the
            # error below does not; a loaded file has nothing to warn about.
            warnings.simplefilter("ignore")
            loaded = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as error:  # any failure to read a user's file is a problem with the file
        raise _load_error(path, error) from error
    return _to_arrays(path, loaded)


def _check_file(path: Path) -> None:
    """Refuse, with the reason, what is not a readable ``torch.save`` file."""
    read_head(path, 1, label="input file", expected="a file written by torch.save")
    kind = torch_file_kind(path)
    if kind == "torchscript":
        raise InputError(f"input {path} is a TorchScript archive (a model), not saved inputs; "
                         f"{_ACCEPTED}")
    if kind == "exported_program":
        raise InputError(f"input {path} is a torch.export archive (a model), not saved inputs; "
                         f"{_ACCEPTED}")
    if kind is None:
        raise InputError(f"input {path} is not a torch.save file (neither torch's zip layout "
                         f"nor its legacy pickle); {_ACCEPTED}, or pass .npy/.npz files")


def _load_error(path: Path, error: Exception) -> InputError:
    import pickle

    message = str(error)
    refused = _GLOBAL_REFUSED.search(message)
    if isinstance(error, pickle.UnpicklingError) and refused:
        what = refused.group(1) or refused.group(2)
        named = f" ({what})" if what else ""
        hint = _SAVE_PLAIN
        if what and what.startswith("numpy"):
            hint = ("convert numpy arrays to tensors with torch.from_numpy before torch.save, "
                    "or save them with numpy.save/numpy.savez")
        return InputError(f"input {path} holds Python objects{named} that would need "
                          f"unpickling, which can run arbitrary code, so it is not loaded; "
                          f"{hint}")
    detail = _reason(message)
    if "Unsupported operand" in detail:
        # Also what a legacy file saved with pickle_protocol > 2 looks like to this loader.
        return InputError(f"input {path} cannot be read without full unpickling ({detail}: "
                          "corrupt data, or a pickle feature the weights-only loader lacks); "
                          "save it again with torch.save and its default settings")
    kind = type(error).__name__
    if kind == "error":  # struct.error, zlib.error: the module says what failed
        kind = f"{type(error).__module__}.error"
    return InputError(f"input {path} is truncated or corrupt ({kind}"
                      f"{': ' + detail if detail else ''}); save it again with torch.save")


def _to_arrays(path: Path, loaded: object) -> list[np.ndarray] | dict[str, np.ndarray]:
    import torch

    if isinstance(loaded, torch.Tensor):
        return [_to_array(path, loaded, "the tensor")]
    if isinstance(loaded, (tuple, list)):
        kind = type(loaded).__name__
        if not loaded:
            raise InputError(f"input {path} holds an empty {kind}; {_ACCEPTED}")
        for position, item in enumerate(loaded):
            if not isinstance(item, torch.Tensor):
                raise InputError(f"input {path} holds a {kind} whose item {position} is "
                                 f"{_describe(item)}; {_ACCEPTED}")
        return [_to_array(path, item, f"item {position}") for position, item in enumerate(loaded)]
    if isinstance(loaded, Mapping):
        if not loaded:
            raise InputError(f"input {path} holds an empty dict; {_ACCEPTED}")
        for key, value in loaded.items():
            if not isinstance(key, str):
                raise InputError(f"input {path} holds a dict with key {key!r} "
                                 f"({type(key).__name__}); {_ACCEPTED}")
            if not isinstance(value, torch.Tensor):
                raise InputError(f"input {path} holds a dict whose entry {key!r} is "
                                 f"{_describe(value)}; {_ACCEPTED}")
        return {key: _to_array(path, value, f"entry {key!r}") for key, value in loaded.items()}
    raise InputError(f"input {path} holds {_describe(loaded)}; {_ACCEPTED}")


def _to_array(path: Path, tensor: torch.Tensor, where: str) -> np.ndarray:
    import torch

    if tensor.dtype == torch.bfloat16:
        # numpy has no bfloat16; a silent float32 copy would test a different graph input.
        raise InputError(f"{where} of input {path} is bfloat16, and bfloat16 inputs are not "
                         "supported yet; save it as float32 or float16 if the model takes that")
    if tensor.layout != torch.strided or tensor.is_quantized:
        what, fix = (("quantized", ".dequantize()") if tensor.is_quantized
                     else (str(tensor.layout), ".to_dense()"))
        raise InputError(f"{where} of input {path} is a {what} tensor; save a dense one "
                         f"(tensor{fix})")
    try:
        array = tensor.detach().cpu().resolve_conj().resolve_neg().numpy()
    except (TypeError, RuntimeError) as error:
        raise InputError(f"{where} of input {path} has dtype {tensor.dtype}, which numpy cannot "
                         f"hold ({one_line(error)}); save it in a numpy-compatible dtype") \
            from error
    # A copy: the array must not share memory with a tensor someone may still write to.
    return array.copy()


def _describe(value: object) -> str:
    """``a dict``, ``an int``: what a loaded value is, for a message."""
    if value is None:
        return "None"
    name = type(value).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"{article} {name}"


_PREAMBLES = ("Weights only load failed", "Please file an issue", "Check the documentation")


def _reason(message: str) -> str:
    """The informative line of a ``torch.load`` message, without its weights_only preamble."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    informative = [line for line in lines if not line.startswith(_PREAMBLES)]
    reason = (informative or lines or [""])[0]
    # torch's messages go on with advice that does not apply here; the first sentence is the fact.
    return reason.split(". ", 1)[0].rstrip(".")[:300]
