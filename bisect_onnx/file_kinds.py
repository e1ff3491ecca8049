"""The first bytes of the file formats bisect-onnx is handed, in one place.

Files are recognised by content, never by extension: a ``model.pt`` may be a
TorchScript archive, a ``torch.save`` pickle or a renamed ``.pt2``.
"""

from __future__ import annotations

from pathlib import Path

from bisect_onnx.errors import InputError

__all__ = ["ZIP_MAGIC", "NPY_MAGIC", "PICKLE_PROTO", "read_head"]

#: Every zip archive: ``.npz``, ``torch.save``, ``torch.jit.save`` and ``.pt2`` files.
ZIP_MAGIC = b"PK\x03\x04"
#: A ``.npy`` array written by ``numpy.save``.
NPY_MAGIC = b"\x93NUMPY"
#: Pickle protocols 2 and later open with the PROTO opcode; torch.save's legacy
#: (non-zip) format is such a pickle.
PICKLE_PROTO = 0x80


def read_head(path: Path, size: int, *, label: str, expected: str) -> bytes:
    """The first ``size`` bytes of a file the user named.

    A missing path, a folder or an empty file is refused with a one-line error that
    names the file (``label`` says which: ``MODEL file``, ``input file``) and what to
    pass instead (``expected``).
    """
    if not path.exists():
        raise InputError(f"{label} {path} does not exist; check the path")
    if path.is_dir():
        raise InputError(f"{label} {path} is a folder; pass {expected}")
    with path.open("rb") as handle:
        head = handle.read(size)
    if not head:
        raise InputError(f"{label} {path} is empty; pass {expected}")
    return head
