"""The first bytes of the file formats bisect-onnx is handed, in one place.

Files are recognised by content, never by extension: a ``model.pt`` may be a
TorchScript archive, a ``torch.save`` pickle or a renamed ``.pt2``.
"""

from __future__ import annotations

__all__ = ["ZIP_MAGIC", "NPY_MAGIC", "PICKLE_PROTO"]

#: Every zip archive: ``.npz``, ``torch.save``, ``torch.jit.save`` and ``.pt2`` files.
ZIP_MAGIC = b"PK\x03\x04"
#: A ``.npy`` array written by ``numpy.save``.
NPY_MAGIC = b"\x93NUMPY"
#: Pickle protocols 2 and later open with the PROTO opcode; torch.save's legacy
#: (non-zip) format is such a pickle.
PICKLE_PROTO = 0x80
