"""A reference archive opened for a check: :class:`Reference`.

Opening reads the zip's directory, the manifest and every member's ``.npy`` header,
and checks them (format and version first, names, sizes against the memory budget, no
pickle, every array the manifest names present as it says) before any array's data is
read; arrays are read when asked for.
"""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Collection
from pathlib import Path

import numpy as np

from bisect_onnx.errors import InputError
from bisect_onnx.reference.archive import (
    MODEL,
    NOT_AN_ARCHIVE,
    Member,
    read_array,
    read_bytes,
    read_manifest,
    read_members,
)
from bisect_onnx.reference.manifest import ArrayEntry, Manifest
from bisect_onnx.sources.file_kinds import looks_like_onnx, read_head
from bisect_onnx.sources.input_sizes import Budget, input_budget

__all__ = ["Reference"]

_EXPECTED = "a reference archive that bisect-onnx MODEL ... --record REF wrote"


class Reference:
    """A recorded reference: its manifest, and its arrays read on demand.

    Made by :meth:`load`, which checks the archive header first.
    """

    def __init__(self, path: Path, manifest: Manifest, members: dict[str, Member],
                 budget: Budget) -> None:
        self.path = path
        self.manifest = manifest
        self._members = members
        self._budget = budget
        self._entries = {entry.name: entry for entry in manifest.values}

    @classmethod
    def load(cls, path: str | Path, *, max_memory: int | str | None = None) -> Reference:
        """Open the archive at ``path``, checking everything but the arrays' data.

        ``max_memory``: what its arrays may take once read (``"2GiB"``; default 80% of
        the memory available).

        Raises:
            InputError: Not a reference archive (truncated, corrupt, another format or
                version), a member it should not hold or that would not fit the budget.
        """
        path = Path(path)
        head = read_head(path, 16, label="reference", expected=_EXPECTED)
        if looks_like_onnx(head):  # (the advice to --record it would write over the model)
            raise InputError(f"{path} is an ONNX model, not a reference archive; pass the "
                             "archive --record wrote as REF, and this file with --onnx")
        budget = input_budget(max_memory)
        try:
            with zipfile.ZipFile(path) as archive:
                manifest = Manifest.from_json(read_manifest(archive, path), path)
                members = read_members(archive, path, budget)
        except (zipfile.BadZipFile, zlib.error, EOFError) as error:
            raise InputError(NOT_AN_ARCHIVE.format(path=path, why=f"{error}; truncated or "
                                                   "corrupt")) from None
        for entry in (*manifest.inputs, *manifest.values):
            member = members.get(entry.member)
            if member is None:
                raise InputError(f"{path}: its manifest names member {entry.member!r} "
                                 f"({entry.name!r}), which it does not hold; the archive is "
                                 "truncated or corrupt: record it again")
            if (list(member.shape) != list(entry.shape)
                    or member.dtype != np.dtype(entry.dtype)):
                raise InputError(f"{path}: member {entry.member!r} is {member.dtype} "
                                 f"{list(member.shape)}, its manifest says {entry.dtype} "
                                 f"{list(entry.shape)}; record the reference again")
        return cls(path, manifest, members, budget)

    @property
    def value_names(self) -> list[str]:
        """The ONNX value names PyTorch's values were recorded at."""
        return [entry.name for entry in self.manifest.values]

    def inputs(self) -> list[np.ndarray]:
        """The recorded inputs, in the graph's input order."""
        return self._read(self.manifest.inputs)

    def values(self, names: Collection[str] | None = None) -> dict[str, np.ndarray]:
        """PyTorch's recorded values by ONNX value name (graph outputs included).

        ``names``: only those (the final outputs, say); ``None``: every one.
        """
        entries = tuple(entry for entry in self.manifest.values
                        if names is None or entry.name in names)
        return dict(zip((entry.name for entry in entries), self._read(entries), strict=True))

    def value(self, name: str) -> np.ndarray:
        """PyTorch's recorded value at ONNX value ``name``, read now (and not kept)."""
        return self._read((self._entries[name],))[0]

    def value_entry(self, name: str) -> ArrayEntry | None:
        """What the value recorded at ``name`` is (dtype, shape), from the header alone."""
        return self._entries.get(name)

    @property
    def recorded_onnx(self) -> Path | None:
        """The ONNX file outside the archive it was recorded on, where that file is here.

        A check without ``--onnx`` reads it: no output may be written over it.
        """
        path = self.manifest.onnx.get("path")
        if self.manifest.onnx.get("member") is not None or path is None:
            return None
        return Path(path) if Path(path).is_file() else None

    def model_bytes(self) -> bytes | None:
        """The ONNX file recorded inside the archive, if it was."""
        if self.manifest.onnx.get("member") != MODEL:
            return None
        with zipfile.ZipFile(self.path) as archive:
            if MODEL not in archive.namelist():
                raise InputError(f"{self.path}: its manifest names the ONNX file {MODEL!r} "
                                 "inside it, which it does not hold; pass the file with --onnx")
            return read_bytes(archive, self.path, MODEL, self._budget.size)

    def _read(self, entries: tuple[ArrayEntry, ...]) -> list[np.ndarray]:
        try:
            with zipfile.ZipFile(self.path) as archive:
                return [read_array(archive, self.path, self._members[entry.member])
                        for entry in entries]
        except (zipfile.BadZipFile, zlib.error, EOFError) as error:
            raise InputError(NOT_AN_ARCHIVE.format(path=self.path, why=f"{error}; truncated "
                                                   "or corrupt")) from None
