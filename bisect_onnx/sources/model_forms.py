"""MODEL files, recognised by what they hold rather than by their extension.

Users name their files ``model.pt`` whatever wrote them, so the form is sniffed from
zip member names and magic bytes (nothing is unpickled to do it):

* ``exported_program``: ``torch.export.save`` (a ``.pt2``), loaded with ``torch.export.load``;
* ``torchscript``: ``torch.jit.save``, loaded with ``torch.jit.load``;
* ``pickled_module``: ``torch.save(model)``, a whole pickled ``nn.Module``.

Unpickling runs whatever code the file names, so a pickle is only ever fully
unpickled when the user says they trust it (``--trust-pickle``). That includes the
pickled parts of a ``.pt2``: ``torch.export.load`` unpickles its sample inputs (and
any tensor it could not store raw) with plain pickle when the safe loader refuses
them, so those parts are checked with the safe loader first.
"""

from __future__ import annotations

import io
import json
import logging
import pickle
import sys
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bisect_onnx.errors import InputError, ModelError, one_line
from bisect_onnx.sources.file_kinds import (
    NPY_MAGIC,
    PICKLE_PROTO,
    ZIP_MAGIC,
    looks_like_onnx,
    read_head,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "EXPORTED_PROGRAM",
    "TORCHSCRIPT",
    "PICKLED_MODULE",
    "MODEL_KINDS",
    "LoadedModel",
    "detect_model_file",
    "load_model_file",
]

logger = logging.getLogger(__name__)

EXPORTED_PROGRAM = "exported_program"
TORCHSCRIPT = "torchscript"
PICKLED_MODULE = "pickled_module"
MODEL_KINDS = (EXPORTED_PROGRAM, TORCHSCRIPT, PICKLED_MODULE)

TRUST_FLAG = "--trust-pickle"
SAFER_FORMS = ("a FILE.py:FACTORY that builds the model, a .pt2 from torch.export.save, "
               "or a TorchScript archive from torch.jit.save")

# Member names inside torch's archives, relative to the archive's single root folder
# (torch names it after the file, so only the part after the first "/" is stable).
# torch.export.save writes "archive_format" holding b"pt2"; torch itself recognises
# its archives by exactly that member (torch.export.pt2_archive is_pt2_package).
_PT2_FORMAT_MEMBER = "archive_format"
_PT2_FORMAT_VALUE = b"pt2"
_PT2_MODELS_DIR = "models/"  # one JSON graph per exported program; AOTInductor packages lack it
# torch.export.save before the PT2 archive format (torch < 2.6): flat members.
_LEGACY_PT2_MEMBER = "serialized_exported_program.json"
# torch.jit.save writes the TorchScript source of every class under code/ and the
# tensors the code refers to in constants.pkl; torch.save writes neither.
_TORCHSCRIPT_CODE_DIR = "code/"
_TORCHSCRIPT_CONSTANTS = "constants.pkl"
# torch.save's zip format: the pickle is data.pkl, storages under data/.
_TORCH_SAVE_PICKLE = "data.pkl"
# Constants torch.export.load restores with plain pickle.loads: no safe loader exists.
_PT2_OPAQUE_PREFIX = "opaque_obj_"


@dataclass(frozen=True)
class LoadedModel:
    """A model read from a file, and which form the file was."""

    kind: str
    """One of :data:`MODEL_KINDS`."""
    model: object
    """``ExportedProgram``, ``torch.jit.ScriptModule`` or ``nn.Module``, after ``kind``."""
    path: Path


def detect_model_file(path: Path) -> str:
    """Which form of MODEL file ``path`` is, from its bytes alone; nothing is loaded.

    Returns one of :data:`MODEL_KINDS`. ``pickled_module`` means "a ``torch.save``
    pickle": whether it holds a module or only weights is known once it is loaded.

    Raises:
        InputError: The path is missing, a folder, empty, a truncated archive, or a
            file of another kind (ONNX, NumPy, unknown), with what to do instead.
    """
    path = Path(path)
    head = read_head(path, 16, label="MODEL file", expected=f"a model file ({SAFER_FORMS})")
    if head.startswith(ZIP_MAGIC):
        return _detect_zip(path)
    if head[0] == PICKLE_PROTO:
        return PICKLED_MODULE
    if head.startswith(NPY_MAGIC):
        raise InputError(f"MODEL {path} is a NumPy array, not a model; pass arrays with "
                         "--input")
    if looks_like_onnx(head) or path.suffix.lower() == ".onnx":
        raise InputError(f"MODEL {path} is an ONNX model; pass it with --onnx {path}, and "
                         "the PyTorch model it came from as MODEL")
    hint = " (for Python source, name the factory: FILE.py:FACTORY)" if path.suffix == ".py" \
        else ""
    raise InputError(f"MODEL {path} is not a model file bisect-onnx recognises{hint}; "
                     f"pass {SAFER_FORMS}")


def load_model_file(path: Path, *, trust_pickle: bool = False) -> LoadedModel:
    """Detect the form of ``path`` and load it on the CPU.

    Args:
        path: A ``.pt2`` from ``torch.export.save``, a ``torch.jit.save`` archive or
            a ``torch.save(model)`` file, whatever its extension.
        trust_pickle: Allow full unpickling, which runs any code the file names.
            Without it a whole pickled module is refused, and so is a ``.pt2``
            whose pickled parts the safe loader cannot read.

    Raises:
        InputError: The file is not a model this function can load safely (see
            :func:`detect_model_file`), or holds weights or tensors only.
        ModelError: torch failed to load a file of a recognised form.
    """
    path = Path(path)
    kind = detect_model_file(path)
    if kind == EXPORTED_PROGRAM:
        model: object = _load_exported_program(path, trust_pickle=trust_pickle)
    elif kind == TORCHSCRIPT:
        model = _load_torchscript(path)
    else:
        model = _load_pickled_module(path, trust_pickle=trust_pickle)
    logger.info("loaded %s as %s", path, kind)
    return LoadedModel(kind=kind, model=model, path=path)


def _detect_zip(path: Path) -> str:
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            members = {_below_root(name) for name in names}
            if _PT2_FORMAT_MEMBER in members:
                format_name = next(n for n in names if _below_root(n) == _PT2_FORMAT_MEMBER)
                is_pt2 = archive.read(format_name).strip() == _PT2_FORMAT_VALUE
            else:
                is_pt2 = False
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise InputError(f"MODEL {path} is a truncated or corrupt zip archive ({error}); "
                         "save the model again") from error
    if is_pt2:
        if not any(member.startswith(_PT2_MODELS_DIR) for member in members):
            raise InputError(f"MODEL {path} is a PT2 archive without an exported program "
                             "(an AOTInductor package?); pass the .pt2 written by "
                             "torch.export.save")
        return EXPORTED_PROGRAM
    if _LEGACY_PT2_MEMBER in members:
        return EXPORTED_PROGRAM
    if _TORCHSCRIPT_CONSTANTS in members and any(
            member.startswith(_TORCHSCRIPT_CODE_DIR) for member in members):
        return TORCHSCRIPT
    if _TORCH_SAVE_PICKLE in members:
        return PICKLED_MODULE
    if names and all(name.endswith(".npy") for name in names):
        raise InputError(f"MODEL {path} is a NumPy .npz archive, not a model; pass it with "
                         "--input")
    raise InputError(f"MODEL {path} is a zip archive but not one torch.save, torch.jit.save "
                     f"or torch.export.save wrote; pass {SAFER_FORMS}")


def _below_root(name: str) -> str:
    """``archive/code/x.py`` -> ``code/x.py``: torch puts every member in one root folder."""
    return name.split("/", 1)[1] if "/" in name else name


def _load_exported_program(path: Path, *, trust_pickle: bool) -> torch.export.ExportedProgram:
    if not trust_pickle:
        unsafe = _pt2_members_needing_pickle(path)
        if unsafe:
            raise InputError(
                f"MODEL {path} is a .pt2 whose {', '.join(unsafe[:3])} can only be read by "
                f"full unpickling, which runs any code the file names; pass {TRUST_FLAG} "
                "if you trust where it came from"
            )
    import torch

    try:
        return torch.export.load(str(path))
    except Exception as error:
        raise ModelError(f"torch.export.load could not read {path}: {type(error).__name__}: "
                         f"{one_line(error)}; save it again with torch.export.save from "
                         "this torch version") from error


def _pt2_members_needing_pickle(path: Path) -> list[str]:
    """Members of a ``.pt2`` that ``torch.export.load`` would unpickle unrestricted.

    It unpickles sample inputs, legacy weight/constant files and tensors it stored
    as pickles (``use_pickle`` in the weights and constants configs) with the safe
    loader first and falls back to plain pickle; opaque constants go straight to
    ``pickle.loads``. A member that the safe loader reads is as harmless to the plain
    one (it names only the same allow-listed functions), so only failures count.
    """
    unsafe = []
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        pickled = [name for name in names if name.endswith(".pt")]
        for config in names:
            if not config.endswith(("_weights_config.json", "_constants_config.json")):
                continue
            folder = config.rsplit("/", 1)[0]
            for entry in _config_entries(archive.read(config)):
                member = f"{folder}/{entry.get('path_name', '')}"
                if str(entry.get("path_name", "")).startswith(_PT2_OPAQUE_PREFIX):
                    unsafe.append(member)
                elif entry.get("use_pickle"):
                    pickled.append(member)
        for name in pickled:
            if name in names and not _loads_weights_only(archive.read(name)):
                unsafe.append(name)
    return unsafe


def _config_entries(raw: bytes) -> list[dict[str, object]]:
    """The entries of a weights/constants config; an unreadable one is torch's to report."""
    try:
        config = json.loads(raw).get("config", {})
    except (ValueError, AttributeError):
        return []
    return [entry for entry in config.values() if isinstance(entry, dict)] \
        if isinstance(config, dict) else []


def _loads_weights_only(data: bytes) -> bool:
    import torch

    try:
        torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception:  # refused or unreadable: either way not safe to hand to plain pickle
        return False
    return True


def _load_torchscript(path: Path) -> torch.jit.ScriptModule:
    import torch

    # TorchScript archives are read by torch's own unpickler, which only builds torch
    # types and the classes compiled from the archive's code/: no Python pickle runs.
    try:
        with warnings.catch_warnings():
            # torch 2.13 deprecates torch.jit.load; the archive is what the user gave,
            # and torch's advice (switch to torch.export) is for whoever writes one.
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.load` is deprecated",
                                    category=DeprecationWarning)
            return torch.jit.load(str(path), map_location="cpu")
    except Exception as error:
        raise ModelError(f"torch.jit.load could not read {path}: {type(error).__name__}: "
                         f"{one_line(error)}; save it again with torch.jit.save") from error


def _load_pickled_module(path: Path, *, trust_pickle: bool) -> torch.nn.Module:
    import torch

    if not trust_pickle:
        # The weights-only loader refuses every function and class outside torch's
        # allow list before calling it, so it is safe on any file: it tells plain
        # weights and tensors (which get a precise refusal) from pickled objects.
        try:
            content = torch.load(path, weights_only=True, map_location="cpu")
        except pickle.UnpicklingError as error:
            raise InputError(
                f"MODEL {path} is a pickled Python object (torch.save(model)); unpickling "
                f"it runs any code the file names, so it is loaded only with {TRUST_FLAG} "
                f"(if you trust where it came from); safer: {SAFER_FORMS}"
            ) from error
        except Exception as error:
            raise InputError(f"MODEL {path} is not a readable torch.save file "
                             f"({type(error).__name__}: {one_line(error)}); save the model "
                             "again") from error
        raise InputError(_not_a_module(path, content))
    # The pickle names its classes by module; like a factory, they are looked up
    # from the current folder, which gets no __pycache__ from us.
    saved_path, writes_bytecode = list(sys.path), sys.dont_write_bytecode
    sys.path.insert(0, str(Path.cwd()))
    sys.dont_write_bytecode = True
    try:
        content = torch.load(path, weights_only=False, map_location="cpu")
    except Exception as error:
        raise ModelError(f"torch.load could not read {path}: {type(error).__name__}: "
                         f"{one_line(error)}; the classes it pickled must be importable "
                         "(run from the folder that defines them)") from error
    finally:
        sys.path[:] = saved_path
        sys.dont_write_bytecode = writes_bytecode
    if not isinstance(content, torch.nn.Module):
        raise InputError(_not_a_module(path, content))
    return content


def _not_a_module(path: Path, content: object) -> str:
    """The refusal for a ``torch.save`` file that holds something other than a module."""
    import torch

    if isinstance(content, dict):
        tensors = sum(isinstance(value, torch.Tensor) for value in content.values())
        keys = ", ".join(map(str, list(content)[:4])) + (", ..." if len(content) > 4 else "")
        what = (f"a state_dict of {tensors} tensors" if tensors == len(content) and tensors
                else f"a dict ({keys})")
        return (f"MODEL {path} holds weights only ({what}), not a model; write a factory "
                "that builds the model and calls load_state_dict, and pass it as "
                "FILE.py:FACTORY")
    if isinstance(content, (torch.Tensor, list, tuple)):
        return (f"MODEL {path} holds tensors, not a model; pass inputs with --input, and the "
                "model as FILE.py:FACTORY, .pt2 or TorchScript")
    return (f"MODEL {path} holds a {type(content).__name__}, not a torch.nn.Module; "
            f"pass {SAFER_FORMS}")

