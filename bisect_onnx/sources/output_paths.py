"""The files a run writes, checked against the files it reads, before anything runs.

A report written over the model it describes, ``--save-onnx`` over the factory's
source, two reports on one path: each destroys something, and each is known from the
paths alone. So every output (``--json``, ``--html``, ``--model-explorer``,
``--save-onnx``, ``--repro-dir``, the pytest plugin's artifacts) is resolved, links
followed and hard links told by their inode, and refused when it is one of the run's
inputs, when two outputs share it, when the file system cannot hold its name, or
when its folder cannot be written. The CLI, the API entry points and the report
writers all call :func:`check_outputs`, so the refusal is the same one-line error
(exit status 2) whichever way the path came in.
"""

from __future__ import annotations

import inspect
import os
import sys
import tempfile
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from bisect_onnx.errors import InputError, UsageError

if TYPE_CHECKING:
    from bisect_onnx.judge.records import Report

__all__ = ["check_outputs", "check_run_files", "check_report_path", "same_file", "model_files",
           "onnx_files", "source_file"]

Labelled = tuple[str, "str | Path | None"]
"""A path and how the user named it (``--input``, ``MODEL``, ``onnx_model``)."""

# What most file systems (ext4, xfs, btrfs, APFS, NTFS) allow, where os.pathconf
# cannot say: 255 bytes per name, 4096 per path (Linux's PATH_MAX).
_NAME_MAX = 255
_PATH_MAX = 4096
# A folder output (a repro) writes model.onnx, inputs.npz, ... directly inside, and
# again in these subfolders; an input there would be overwritten.
_WRITTEN_SUBFOLDERS = ("sample-", "backend_test")
_SHOWN = 60  # characters of an over-long name a message shows


def check_outputs(
    outputs: Mapping[str, str | Path | None],
    *,
    inputs: Iterable[Labelled] = (),
    folders: Collection[str] = (),
    makes_parents: Collection[str] = (),
) -> None:
    """Refuse output paths that would destroy an input or each other, or cannot be written.

    Args:
        outputs: Each output by the option that names it (``{"--json": path}``);
            ``None`` values are skipped.
        inputs: The files the run reads, each with how the user named it.
        folders: The options in ``outputs`` that name a folder the writer fills (made
            if missing), not a file.
        makes_parents: The file options whose writer makes a missing parent folder.

    Raises:
        UsageError: An output is an input (or, for a folder, holds one where it
            writes), or two outputs are the same file.
        InputError: An output's name is too long, it is a folder where a file is
            wanted (or the reverse), or its folder does not exist or is not writable.
    """
    written = [(option, Path(path)) for option, path in outputs.items() if path is not None]
    _check_collisions(written, inputs, folders)  # first: the most important thing to say
    for option, path in written:
        _check_name(option, path)
        _check_place(option, path, folder=option in folders,
                     makes_parents=option in makes_parents)


def check_run_files(
    outputs: Mapping[str, str | Path | None],
    *,
    model: object = None,
    onnx_models: Mapping[str, object] | None = None,
    tolerances: object = None,
    folders: Collection[str] = (),
    makes_parents: Collection[str] = (),
) -> None:
    """The API entry points' check, before anything runs: inputs readable, outputs safe.

    ``onnx_models`` maps each ONNX argument's name to its value (a path is checked to
    be a non-empty regular file, other forms are not files; what it holds is for the
    step that reads it); ``tolerances`` is checked when it is a path. The outputs are
    then checked by :func:`check_outputs` against every file these stand for.
    """
    from bisect_onnx.sources.file_kinds import read_head

    onnx_models = onnx_models or {}
    for label, value in onnx_models.items():
        if isinstance(value, (str, Path)):
            read_head(Path(value), 1, label=f"{label} file", expected="an .onnx file")
    tolerance_file = tolerances if isinstance(tolerances, (str, Path)) else None
    if tolerance_file is not None:
        read_head(Path(tolerance_file), 1, label="tolerance file",
                  expected="a text file of lines 'PATTERN RTOL ATOL'")
    inputs = [*(model_files(model, "model") if model is not None else []),
              *(entry for label, value in onnx_models.items()
                for entry in onnx_files(value, label, outputs=outputs)),
              ("tolerances", tolerance_file)]
    check_outputs(outputs, inputs=inputs, folders=folders, makes_parents=makes_parents)


def check_report_path(report: Report, path: str | Path, option: str) -> None:
    """A report writer's check: the path is not one of the files the report compared.

    The report names its models as the user gave them (a path, or ``FILE.py:FACTORY``);
    those that are files, and a factory's source, are refused as the report's path.
    """
    inputs: list[Labelled] = []
    for side in (getattr(report, "reference", None), getattr(report, "candidate", None)):
        named = side.get("model") if isinstance(side, Mapping) else None
        if isinstance(named, str) and named and not named.startswith("("):
            inputs.extend(model_files(named, "the compared model"))
    # Where it can be written is the writer's to say (it names the OSError).
    _check_collisions([(option, Path(path))], inputs, ())


def model_files(model: object, label: str = "MODEL") -> list[Labelled]:
    """The files a model argument stands for: a saved model, or the factory's source.

    ``FILE.py:FACTORY`` and ``package.module:FACTORY`` name their source file (found
    without importing anything); an ``nn.Module`` the file that defines its class.
    """
    if isinstance(model, (str, Path)):
        location, colon, factory = str(model).rpartition(":")
        if colon and location and factory.isidentifier():
            source = source_file(location)
            return [(f"{label}'s source", source)] if source is not None else []
        return [(label, Path(model))]
    if not hasattr(model, "forward"):
        return []
    try:
        source = inspect.getsourcefile(type(model))
    except (TypeError, OSError):  # a class built at run time, or from C
        return []
    return [(f"the source of {type(model).__name__}", Path(source))] if source else []


def source_file(location: str) -> Path | None:
    """The ``.py`` file of ``path/to/file.py`` or ``package.module``, without importing it."""
    if location.endswith(".py") or "/" in location or "\\" in location:
        return Path(location)
    parts = location.split(".")
    for folder in [Path.cwd(), *(Path(entry) for entry in sys.path if entry)]:
        for candidate in (folder.joinpath(*parts).with_suffix(".py"),
                          folder.joinpath(*parts, "__init__.py")):
            if candidate.is_file():
                return candidate
    return None


def onnx_files(model: object, label: str, *,
               outputs: Mapping[str, str | Path | None]) -> list[Labelled]:
    """An ONNX path and the external data files it names.

    ONNX Runtime reads external data only inside the model's folder, so the model is
    opened (without its weights) only when an output lies in that folder.
    """
    if not isinstance(model, (str, Path)) or not Path(model).is_file():
        return []
    path = Path(model)
    files: list[Labelled] = [(label, path)]
    folder = _identity(path)[0].parent
    if not any(_identity(Path(output))[0].is_relative_to(folder)
               for output in outputs.values() if output is not None):
        return files
    import onnx

    from bisect_onnx.graph.walk import graph_tensors
    from bisect_onnx.graph.weights import external_location

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:  # not ONNX, or corrupt: the step that reads it says so
        return files
    locations = {external_location(tensor) for tensor in graph_tensors(proto.graph)}
    files.extend((f"external data of {label}", path.parent / location)
                 for location in sorted(filter(None, locations)))
    return files


def _check_collisions(written: list[tuple[str, Path]], inputs: Iterable[Labelled],
                      folders: Collection[str]) -> None:
    """Refuse an output that is an input (or, a folder, holds one), or another output."""
    read = [(label, Path(path)) for label, path in inputs if path is not None]
    claimed: list[tuple[str, Path, tuple]] = []
    for option, path in written:
        identity = _identity(path)
        for label, source in read:
            if _same(identity, _identity(source)):
                raise UsageError(f"{option} {path} is {_as_named(label, source)}, which this "
                                 "run reads: writing there would destroy it; choose another "
                                 "path")
            if option in folders and _written_by_folder(identity[0], _identity(source)[0]):
                raise UsageError(f"{option} {path} holds {_as_named(label, source)}, which "
                                 "this run reads, where the repro writes its files; choose a "
                                 "new or empty folder")
        for other_option, other_path, other in claimed:
            if _same(identity, other):
                raise UsageError(f"{option} {path} and {other_option} {other_path} are the "
                                 "same file: one would replace the other; give each its "
                                 "own path")
        claimed.append((option, path, identity))


def _identity(path: Path) -> tuple[Path, tuple[int, int] | None]:
    """Where a path really leads (links followed), and its file's inode if it exists."""
    resolved = Path(os.path.abspath(path)).resolve()
    try:
        status = os.stat(resolved)
    except OSError:
        return resolved, None
    return resolved, (status.st_dev, status.st_ino)


def same_file(one: Path, other: Path) -> bool:
    """Whether two paths name one file: links followed, hard links (one inode) included."""
    return _same(_identity(one), _identity(other))


def _same(one: tuple, other: tuple) -> bool:
    return one[0] == other[0] or (one[1] is not None and one[1] == other[1])


def _written_by_folder(folder: Path, source: Path) -> bool:
    """Whether a folder output writes where ``source`` is: directly in it, or a sample's."""
    parent = source.parent
    if parent == folder:
        return True
    return parent.parent == folder and (parent.name.startswith(_WRITTEN_SUBFOLDERS)
                                        or parent.suffix == ".repro")


def _as_named(label: str, path: Path) -> str:
    return f"{label} {path}" if label.startswith(("-", "MODEL")) else f"{label} ({path})"


def _check_name(option: str, path: Path) -> None:
    """Refuse a name longer than the file system takes (an OSError at the end otherwise)."""
    anchor = _existing_ancestor(path)
    name_max = _limit(anchor, "PC_NAME_MAX", _NAME_MAX)
    for part in path.parts:
        size = len(os.fsencode(part))
        if size > name_max:
            raise InputError(f"{option}: the name {part[:_SHOWN]}… is {size} bytes long, over "
                             f"the {name_max} a file name may have here; choose a shorter "
                             "name")
    size = len(os.fsencode(os.path.abspath(path)))
    path_max = _limit(anchor, "PC_PATH_MAX", _PATH_MAX)
    if size > path_max:
        raise InputError(f"{option}: the path {str(path)[:_SHOWN]}… is {size} bytes long, over "
                         f"the {path_max} a path may have here; choose a shorter path")


def _limit(folder: Path, name: str, default: int) -> int:
    try:
        return int(os.pathconf(folder, name))
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows), or no limit
        return default


def _existing_ancestor(path: Path) -> Path:
    """The nearest folder above ``path`` (or ``path`` itself) that exists."""
    current = Path(os.path.abspath(path))
    while not os.path.lexists(current) and current != current.parent:
        current = current.parent
    return current


def _check_place(option: str, path: Path, *, folder: bool, makes_parents: bool) -> None:
    """Refuse an output that cannot be written where it is, before the slow steps."""
    if folder:
        if path.exists() and not path.is_dir():
            raise InputError(f"{option} {path} is a file; name a folder (it is made if "
                             "missing)")
        _check_writable_folder(option, path, path if path.is_dir() else
                               _existing_ancestor(path))
        return
    if path.is_dir():
        raise InputError(f"{option} {path} is a folder; name a file inside it")
    parent = path.parent if str(path.parent) else Path(".")
    if not makes_parents and not parent.exists():
        raise InputError(f"{option} {path}: folder {parent} does not exist; create it, or "
                         "choose a path in an existing folder")
    _check_writable_folder(option, path, parent if parent.exists() else
                           _existing_ancestor(parent))
    if path.exists() and not os.access(path, os.W_OK):
        raise InputError(f"{option} {path} is read-only; choose another path")


def _check_writable_folder(option: str, path: Path, folder: Path) -> None:
    """Refuse when nothing can be created in ``folder`` (tried: root ignores permissions)."""
    if not folder.is_dir():
        raise InputError(f"{option} {path}: {folder} is not a folder; choose another path")
    try:
        handle, probe = tempfile.mkstemp(prefix=".bisect-onnx-", dir=folder)
    except OSError as error:
        raise InputError(f"{option} {path}: cannot write in {folder} "
                         f"({error.strerror or error}); choose a writable place") from error
    os.close(handle)
    os.unlink(probe)
