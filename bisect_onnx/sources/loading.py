"""MODEL specifications and input files, turned into a module and arrays.

Input files are read with ``allow_pickle=False``: a ``.npy`` of Python objects
would run arbitrary code when loaded, so it is refused, never unpickled.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import reprlib
import sys
import zipfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from tokenize import TokenError
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.chatter import chatter_logged
from bisect_onnx.errors import InputError, ModelError, UsageError, one_line
from bisect_onnx.sources.file_kinds import EMPTY_ZIP_MAGIC, NPY_MAGIC, ZIP_MAGIC, read_head
from bisect_onnx.sources.graph_inputs import (
    check_count,
    check_header,
    check_npz_members,
)
from bisect_onnx.sources.input_files import load_pt_inputs, torch_file_kind
from bisect_onnx.sources.input_sizes import (
    Budget,
    array_bytes,
    check_npz_size,
    input_budget,
    npy_header,
)
from bisect_onnx.sources.output_paths import check_outputs

if TYPE_CHECKING:
    import torch

    from bisect_onnx.runtime.input_specs import InputSpec

__all__ = ["load_model", "load_input_files", "check_writable"]

MODEL_FORMS = "FILE.py:FACTORY or package.module:FACTORY"
SAVED_FORMS = ("a saved model (a .pt2 from torch.export.save, a torch.jit.save archive, or a "
               "torch.save(model) file with --trust-pickle)")
_SAVED_SUFFIXES = (".pt", ".pth", ".pt2", ".jit", ".ts", ".bin", ".pkl")


def load_model(spec: str, *, trust_pickle: bool = False) -> object:
    """The model MODEL names: a factory's ``nn.Module``, or a saved model file's content."""
    location, colon, factory_name = spec.rpartition(":")
    if colon and location and factory_name.isidentifier():
        return _call_factory(spec, location, factory_name)
    path = Path(spec)
    if path.exists() or path.suffix.lower() in _SAVED_SUFFIXES:
        from bisect_onnx.sources.model_forms import load_model_file

        return load_model_file(path, trust_pickle=trust_pickle).model
    raise UsageError(f"MODEL {spec!r} is not {MODEL_FORMS}, nor {SAVED_FORMS}")


def _call_factory(spec: str, location: str, factory_name: str) -> torch.nn.Module:
    """Call the factory named by ``spec`` and return the ``nn.Module`` it builds."""
    import torch

    module = _import_location(location)
    factory = getattr(module, factory_name, None)
    if factory is None:
        available = sorted(
            name for name, value in vars(module).items()
            if callable(value) and not name.startswith("_")
            and getattr(value, "__module__", None) == module.__name__
        )
        raise InputError(
            f"{location} has no {factory_name!r}; callables defined there: "
            f"{', '.join(available) or 'none'}"
        )
    if not callable(factory):
        raise InputError(f"{location}:{factory_name} is a {type(factory).__name__}, "
                         "not a factory; name a function or class that returns an nn.Module")
    _check_no_arguments(spec, factory_name, factory)
    try:
        # What building the model prints and logs (transformers' config checks, a
        # loading bar) is for the log, as the exporters' chatter is: stderr is the tool's.
        with chatter_logged(f"{spec}()", native=True):
            model = factory()
    except SystemExit as error:  # it would end the run with its status, and no verdict
        raise ModelError(f"{spec}() called sys.exit({error.code!r}); a factory must return "
                         "the model, not exit") from error
    except Exception as error:
        raise ModelError(f"{spec}() raised {type(error).__name__}: {one_line(error)}") \
            from error
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"{spec}() returned {reprlib.repr(model)} (of type "
                         f"{type(model).__name__}), not a torch.nn.Module; the factory must "
                         "build and return the model")
    return model


def _check_no_arguments(spec: str, factory_name: str, factory: Callable[..., object]) -> None:
    """A one-line error for a factory that needs arguments: it is called with none."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin or C type without a signature: call it
        return
    needed = [parameter.name for parameter in parameters
              if parameter.default is parameter.empty
              and parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)]
    if needed:
        raise UsageError(f"{spec} needs arguments ({', '.join(needed)}) and MODEL's factory "
                         f"is called with none; name a function that builds the model "
                         f"without them (def build(): return {factory_name}(...))")


def _import_location(location: str):  # noqa: ANN202 - returns a module
    """Import ``path/to/file.py`` or ``package.module``, the current folder importable."""
    if location.endswith(".py") or "/" in location or "\\" in location:
        path = Path(location)
        if not path.is_file():
            what = "is a folder" if path.is_dir() else "does not exist"
            raise InputError(f"model file {location} {what}; MODEL is {MODEL_FORMS}")
        if path.stat().st_size == 0:
            raise InputError(f"model file {location} is empty (0 bytes); MODEL is "
                             f"{MODEL_FORMS}, the file defining the factory")
        # Sibling imports in the user's file should work as when they run it directly.
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        # A stable, unique module name per file (hash() changes between processes).
        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
        name = f"_bisect_onnx_model_{path.stem}_{digest}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise InputError(f"cannot import {location} as Python; MODEL is {MODEL_FORMS}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        # No __pycache__ beside the user's file: their folder is not ours to write.
        writes_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
        try:
            spec.loader.exec_module(module)
        except SystemExit as error:  # a script's top level: it would end the run
            sys.modules.pop(name, None)
            raise ModelError(f"importing {location} called sys.exit({error.code!r}); put "
                             "the script's part under if __name__ == '__main__'") from error
        except Exception as error:
            sys.modules.pop(name, None)
            raise ModelError(f"importing {location} raised {type(error).__name__}: "
                             f"{one_line(error)}") from error
        finally:
            sys.dont_write_bytecode = writes_bytecode
        return module
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return importlib.import_module(location)
    except ModuleNotFoundError as error:
        raise InputError(f"cannot import module {location!r} ({error}); run from the folder "
                         f"that holds it, or give {MODEL_FORMS}") from error
    except Exception as error:
        raise ModelError(f"importing {location} raised {type(error).__name__}: "
                         f"{one_line(error)}") from error


def load_input_files(paths: Sequence[Path], *, max_memory: int | str | None = None,
                     graph_inputs: Sequence[InputSpec] | None = None,
                     ) -> list[np.ndarray] | dict[str, np.ndarray]:
    """Read ``.npy`` files (positional inputs) or one ``.npz`` (named inputs).

    Each file's size once loaded is checked against ``max_memory`` (by default most
    of the memory available) before it is read. ``graph_inputs``, when the ONNX
    graph is known already: ``.npy`` and ``.npz`` headers are checked against its
    inputs before their data is read.
    """
    if not paths:
        raise UsageError("no inputs: pass --input FILE.npy once per forward argument, "
                         "or one --input FILE.npz")
    budget = input_budget(max_memory)
    paths = [Path(path) for path in paths]
    kinds = [_sniff(path) for path in paths]
    if graph_inputs is not None and set(kinds) == {"npy"}:
        check_count(len(paths), "file(s)", graph_inputs)
    arrays: list[np.ndarray] = []
    for path, kind in zip(paths, kinds, strict=True):
        if kind == "npy":
            arrays.append(_load_npy(path, budget, graph_inputs, position=len(arrays)))
            continue
        if kind == "pt":  # torch.save stores tensors uncompressed: the file bounds them
            budget.check(path.stat().st_size, f"input {path}", "pass smaller inputs")
        loaded = (_load_npz(path, budget, graph_inputs) if kind == "npz"
                  else load_pt_inputs(path))
        if isinstance(loaded, list) and len(loaded) == 1:
            arrays.extend(loaded)  # a .pt of one tensor stands for one input, like a .npy
        elif len(paths) > 1:
            raise UsageError(f"{path} holds several named or ordered inputs: pass it as the "
                             "only --input, or use one file per input")
        else:
            return loaded
    return arrays


def _sniff(path: Path) -> str:
    head = read_head(path, 6, label="input file",
                     expected=".npy or .pt files, or one .npz file, with --input")
    if head.startswith(NPY_MAGIC):
        return "npy"
    kind = torch_file_kind(path)
    if kind == "save":
        return "pt"
    if kind is not None:
        raise InputError(f"input {path} is a saved model ({kind.replace('_', ' ')}), not "
                         "inputs; pass it as MODEL, and the inputs with --input")
    if head.startswith(ZIP_MAGIC):
        return "npz"
    if head.startswith(EMPTY_ZIP_MAGIC):
        raise InputError(f"input {path} is an .npz archive holding no arrays; save the "
                         "inputs into it with numpy.savez(path, x=...)")
    raise InputError(f"input {path} is neither .npy, .npz nor torch.save data; save arrays "
                     "with numpy.save or numpy.savez, or tensors with torch.save")


def _load_npy(path: Path, budget: Budget, graph_inputs: Sequence[InputSpec] | None,
              position: int) -> np.ndarray:
    header = _check_npy_size(path, budget)
    if header is not None and graph_inputs is not None and position < len(graph_inputs):
        check_header(f"input {path}", position, *header, graph_inputs)
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as error:
        if "allow_pickle" in str(error):
            raise InputError(_OBJECT_ARRAY.format(path=path)) from error
        raise InputError(f"input {path} is not a readable .npy file ({error}); "
                         "save it again with numpy.save") from error
    except (OSError, EOFError) as error:
        raise InputError(f"input {path} is truncated or unreadable ({error}); "
                         "save it again with numpy.save") from error


def _check_npy_size(path: Path, budget: Budget) -> tuple[tuple[int, ...], np.dtype] | None:
    """Refuse a ``.npy`` whose header promises more data than the file holds, or the budget.

    numpy would first try to allocate the promised size (a MemoryError for a
    corrupt header) before noticing the file is short. The header's shape and dtype,
    where it could be read (``None`` for an object array: loading refuses it).
    """
    try:
        with path.open("rb") as handle:
            shape, dtype = npy_header(handle)
            offset = handle.tell()
    except ValueError as error:
        if "allow_pickle" in str(error) or "object" in str(error):
            return None  # np.load gives the precise refusal
        raise InputError(f"input {path} has a corrupt .npy header ({error}); "
                         "save it again with numpy.save") from error
    except (SyntaxError, TokenError, EOFError) as error:  # numpy parses the header as Python
        raise InputError(f"input {path} has a corrupt .npy header ({type(error).__name__}); "
                         "save it again with numpy.save") from error
    if dtype.hasobject:
        return None
    needed = array_bytes(shape, dtype)
    available = path.stat().st_size - offset
    if needed > available:
        raise InputError(f"input {path} is truncated: its header describes {needed} bytes of "
                         f"data but the file holds {available}; save it again with numpy.save")
    budget.check(needed, f"input {path} ({dtype} {list(shape)})", "pass smaller inputs")
    return shape, dtype


def _load_npz(path: Path, budget: Budget,
              graph_inputs: Sequence[InputSpec] | None = None) -> dict[str, np.ndarray]:
    check_npz_size(path, budget)  # a member can inflate a thousandfold
    if graph_inputs is not None:
        check_npz_members(path, graph_inputs)
    arrays: dict[str, np.ndarray] = {}
    try:
        with np.load(path, allow_pickle=False) as archive:
            for key in archive.files:
                arrays[key] = archive[key]
                if not isinstance(arrays[key], np.ndarray):
                    raise InputError(f"entry {key!r} of {path} is not a numpy array; "
                                     "save the inputs with numpy.savez")
    except ValueError as error:
        if "allow_pickle" in str(error):
            raise InputError(_OBJECT_ARRAY.format(path=path)) from error
        raise InputError(f"input {path} is not a readable .npz file ({error}); "
                         "save it again with numpy.savez") from error
    except (OSError, EOFError, MemoryError, zipfile.BadZipFile, zlib.error) as error:
        raise InputError(f"input {path} is truncated or corrupt ({type(error).__name__}: "
                         f"{error}); save it again with numpy.savez") from error
    if not arrays:
        raise InputError(f"input {path} is an .npz archive holding no arrays; save the "
                         "inputs into it with numpy.savez(path, x=...)")
    return arrays


_OBJECT_ARRAY = ("input {path} holds Python objects (dtype=object), which cannot be loaded "
                 "without unpickling; save plain numeric arrays instead")


def check_writable(path: Path, option: str, *, creates_folder: bool = False) -> None:
    """Refuse an output path that cannot be written, before the slow steps.

    ``creates_folder``: the writer makes a missing parent folder itself. The whole
    check, against the run's inputs too, is :func:`~bisect_onnx.sources.output_paths.
    check_outputs`.
    """
    check_outputs({option: path}, makes_parents={option} if creates_folder else ())
