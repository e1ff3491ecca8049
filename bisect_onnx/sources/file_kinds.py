"""The first bytes of the file formats bisect-onnx is handed, in one place.

Files are recognised by content, never by extension: a ``model.pt`` may be a
TorchScript archive, a ``torch.save`` pickle or a renamed ``.pt2``.
"""

from __future__ import annotations

import stat
from pathlib import Path

from bisect_onnx.errors import InputError

__all__ = ["ZIP_MAGIC", "EMPTY_ZIP_MAGIC", "NPY_MAGIC", "PICKLE_PROTO", "read_head",
           "looks_like_onnx", "check_onnx_file"]

#: Every zip archive: ``.npz``, ``torch.save``, ``torch.jit.save`` and ``.pt2`` files.
ZIP_MAGIC = b"PK\x03\x04"
#: A zip archive with no member at all opens with its end-of-directory record
#: (``numpy.savez(path)`` with no arrays writes one).
EMPTY_ZIP_MAGIC = b"PK\x05\x06"
#: A ``.npy`` array written by ``numpy.save``.
NPY_MAGIC = b"\x93NUMPY"
#: Pickle protocols 2 and later open with the PROTO opcode; torch.save's legacy
#: (non-zip) format is such a pickle.
PICKLE_PROTO = 0x80
# An ONNX ModelProto is protobuf: field 1 (ir_version, a varint) comes first, so the
# file opens with tag 0x08, a small version number, then the tag of a later field:
# producer_name, producer_version, domain, model_version, doc_string, graph,
# opset_import or metadata_props.
_ONNX_FIRST_TAG = 0x08
_ONNX_NEXT_TAGS = frozenset({0x12, 0x1A, 0x22, 0x28, 0x32, 0x3A, 0x42, 0x72})


def looks_like_onnx(head: bytes) -> bool:
    """Whether a file's first bytes (three are enough) open an ONNX model."""
    return (len(head) >= 3 and head[0] == _ONNX_FIRST_TAG and 0 < head[1] < 0x80
            and head[2] in _ONNX_NEXT_TAGS)


def read_head(path: Path, size: int, *, label: str, expected: str) -> bytes:
    """The first ``size`` bytes of a file the user named.

    A missing path, a folder, something that is not a regular file (a FIFO or a
    device, which would block the read or never end) or an empty file is refused with
    a one-line error that names the file (``label`` says which: ``MODEL file``,
    ``input file``) and what to pass instead (``expected``).
    """
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise InputError(f"{label} {path} does not exist; check the path") from None
    except OSError as error:
        raise InputError(f"{label} {path} cannot be read ({error.strerror}); check the "
                         "path") from error
    if stat.S_ISDIR(mode):
        raise InputError(f"{label} {path} is a folder; pass {expected}")
    if not stat.S_ISREG(mode):
        raise InputError(f"{label} {path} is not a regular file ({_file_type(mode)}); "
                         f"pass {expected}")
    with path.open("rb") as handle:
        head = handle.read(size)
    if not head:
        raise InputError(f"{label} {path} is empty (0 bytes); pass {expected}")
    return head


def check_onnx_file(path: Path, label: str) -> None:
    """Refuse, in one line, a path that is not an ONNX file (empty, a folder, a FIFO...)."""
    head = read_head(Path(path), 16, label=f"{label} file", expected="an .onnx file")
    if not looks_like_onnx(head):
        raise InputError(f"{label} file {path} is not an ONNX model; pass an .onnx file")


def _file_type(mode: int) -> str:
    """What a non-regular file is, for a message."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"
