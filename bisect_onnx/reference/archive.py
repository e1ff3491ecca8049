"""The reference archive's container: a NumPy ``.npz`` with a ``manifest.json`` member.

Any numpy reads it (``np.load(path, allow_pickle=False)``); this module writes it
member by member, each array streamed into its ``.npy`` member so that writing never
holds a second copy, and reads it back header first: every member's name and ``.npy``
header is checked (names that could escape a folder, object arrays, which only a pickle
can hold, sizes over the memory budget) before any array's data is read.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import zipfile
import zlib
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from tokenize import TokenError
from typing import Any

import numpy as np

from bisect_onnx.errors import InputError
from bisect_onnx.runtime.memory import format_size
from bisect_onnx.sources.input_sizes import Budget, array_bytes, npy_header

__all__ = ["MANIFEST", "MODEL", "Member", "write_archive", "read_members", "read_manifest",
           "read_array", "read_bytes", "NOT_AN_ARCHIVE", "looks_like_reference"]

#: The manifest's member name.
MANIFEST = "manifest.json"
#: The ONNX file the values were aligned to, where it was exported at recording.
MODEL = "model.onnx"
#: Every other member: an input or a value, numbered (value names are the manifest's).
_ARRAY_MEMBER = re.compile(r"(inputs|values)/[0-9]{1,9}\.npy")
#: A manifest is a few MB even for a model of thousands of values.
_MANIFEST_LIMIT = 256 * 2 ** 20

NOT_AN_ARCHIVE = ("{path} is not a bisect-onnx reference archive ({why}); write one with "
                  "bisect-onnx MODEL --input ... --record {path}")

_HEADER_ERRORS = (ValueError, SyntaxError, TokenError, EOFError, OSError,
                  zipfile.BadZipFile, zlib.error)


@dataclass(frozen=True)
class Member:
    """One ``.npy`` member of the archive, from its header: what reading it gives."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        """The bytes its array takes once read."""
        return array_bytes(self.shape, self.dtype)


def write_archive(path: Path, manifest: dict[str, Any],
                  arrays: Iterable[tuple[str, np.ndarray]], *,
                  model: Path | None = None) -> None:
    """Write the archive at ``path``: the manifest, each ``(member, array)``, the model.

    Written beside ``path`` and moved onto it when complete, so that an interrupted
    write leaves no half archive under its name. Members are stored, not compressed
    (float values barely compress, and a stored member reads at disk speed).
    """
    path = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(handle)
    try:
        with zipfile.ZipFile(temporary, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            archive.writestr(MANIFEST, json.dumps(manifest, indent=1, allow_nan=False))
            for member, array in arrays:
                with archive.open(member, "w", force_zip64=True) as stream:
                    # Written in chunks from the array itself: no copy of it is made.
                    np.lib.format.write_array(stream, np.asarray(array), allow_pickle=False)
            if model is not None:
                archive.write(model, MODEL)
        os.replace(temporary, path)
    finally:
        with suppress(FileNotFoundError):
            os.unlink(temporary)


def read_manifest(archive: zipfile.ZipFile, path: Path) -> dict[str, Any]:
    """The manifest's JSON object, its size checked before it is read."""
    try:
        info = archive.getinfo(MANIFEST)
    except KeyError:
        raise InputError(NOT_AN_ARCHIVE.format(path=path, why=f"no {MANIFEST} member")) from None
    if info.file_size > _MANIFEST_LIMIT:
        raise InputError(f"{path}: its {MANIFEST} claims {format_size(info.file_size)}, more "
                         "than any manifest holds; the archive is corrupt or not bisect-onnx's")
    try:
        manifest = json.loads(archive.read(MANIFEST).decode("utf-8"))
    except (ValueError, UnicodeDecodeError, zipfile.BadZipFile, zlib.error, OSError) as error:
        raise InputError(f"{path}: its {MANIFEST} cannot be read ({error}); the archive is "
                         "corrupt: record it again") from None
    if not isinstance(manifest, dict):
        raise InputError(NOT_AN_ARCHIVE.format(path=path, why=f"{MANIFEST} is no object"))
    return manifest


def read_members(archive: zipfile.ZipFile, path: Path, budget: Budget) -> dict[str, Member]:
    """Every array member's header, each name and size checked; no data is read.

    Refused: a name that is not one this format writes (one that could escape a folder
    a tool extracts into, above all), an object array (only a pickle holds one), a
    header that cannot be read, and a member that would not fit in ``budget``.
    """
    members: dict[str, Member] = {}
    for info in archive.infolist():
        name = info.filename
        if name in (MANIFEST, MODEL):
            continue
        if not _ARRAY_MEMBER.fullmatch(name):
            shown = name if len(name) <= 80 else name[:80] + "…"
            raise InputError(f"{path}: member {shown!r} is not one a reference archive holds"
                             f"{' and would escape the archive' if _escapes(name) else ''}; "
                             "refused (record the reference again)")
        try:
            with archive.open(info) as stream:
                shape, dtype = npy_header(stream)
        except _HEADER_ERRORS as error:
            raise InputError(f"{path}: member {name!r} has no readable .npy header "
                             f"({error}); the archive is corrupt: record it again") from None
        if dtype.hasobject:
            raise InputError(f"{path}: member {name!r} holds Python objects ({dtype}), which "
                             "only a pickle can hold; refused: a reference holds numbers only")
        members[name] = Member(name, tuple(shape), dtype)
        if info.file_size < members[name].nbytes:  # its header lies: not read, nor allocated
            raise InputError(f"{path}: member {name!r}'s header claims {dtype} "
                             f"{list(shape)} ({format_size(members[name].nbytes)}) and it "
                             f"holds {format_size(info.file_size)}; the archive is corrupt: "
                             "record it again")
        budget.check(members[name].nbytes, f"{path}: member {name!r} ({dtype} {list(shape)})",
                     "check it on a machine with more memory, or a larger --max-memory")
    # All of them together may be over the budget: a check then reads them one at a
    # time, as production's probes ask (pipeline/check_budget.py).
    return members


def read_array(archive: zipfile.ZipFile, path: Path, member: Member) -> np.ndarray:
    """One member's array (never unpickled), as its checked header says."""
    try:
        with archive.open(member.name) as stream:
            array = np.lib.format.read_array(stream, allow_pickle=False)
    except _HEADER_ERRORS as error:
        raise InputError(f"{path}: member {member.name!r} cannot be read ({error}); the "
                         "archive is truncated or corrupt: record it again") from None
    if array.shape != member.shape or array.dtype != member.dtype:
        raise InputError(f"{path}: member {member.name!r} changed while it was read; "
                         "record it again")
    return array


def read_bytes(archive: zipfile.ZipFile, path: Path, name: str, limit: int | None) -> bytes:
    """A member's bytes (the embedded model), its size checked before it is read."""
    info = archive.getinfo(name)
    if limit is not None and info.file_size > limit:
        raise InputError(f"{path}: member {name!r} claims {format_size(info.file_size)}, "
                         f"over the memory budget of {format_size(limit)}; check it on a "
                         "machine with more memory, or a larger --max-memory")
    try:
        return archive.read(name)
    except (zipfile.BadZipFile, zlib.error, OSError) as error:
        raise InputError(f"{path}: member {name!r} cannot be read ({error}); the archive "
                         "is truncated or corrupt: record it again") from None


def _escapes(name: str) -> bool:
    """Whether extracting ``name`` would write outside the folder it is extracted into."""
    parts = re.split(r"[/\\]", name)
    return name.startswith(("/", "\\")) or ".." in parts or re.match(r"[A-Za-z]:", name) is not None


def looks_like_reference(model: object) -> bool:
    """Whether ``model`` is a path to a reference archive (a zip holding a manifest).

    Told from a ``.pt2`` or a ``torch.save`` file, which are zips too, by the manifest
    at the archive's root; what it holds is checked when it is loaded.
    """
    if not isinstance(model, (str, Path)) or not Path(model).is_file():
        return False
    try:
        with zipfile.ZipFile(model) as archive:
            return MANIFEST in archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
