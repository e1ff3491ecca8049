"""Protobuf's varints, as reading an ONNX file by its tags and lengths needs them.

The graph's skeleton (:mod:`bisect_onnx.graph.skeleton`) and the weights read in place
(:mod:`bisect_onnx.runtime.weights_in_place`) walk a file's fields without parsing the
weights they hold, and write some anew: each field starts with a varint tag, and a
length-delimited one's length is a varint too.
"""

from __future__ import annotations

import mmap

__all__ = ["WireFormatError", "read_varint", "encode_varint"]


class WireFormatError(ValueError):
    """Bytes this reading of the wire format does not expect."""


def read_varint(data: mmap.mmap | bytes, position: int) -> tuple[int, int]:
    """The varint at ``position`` and where the bytes after it start."""
    value = shift = 0
    while True:
        if position >= len(data) or shift > 63:
            raise WireFormatError(f"a varint at byte {position} does not end")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7


def encode_varint(value: int) -> bytes:
    """``value`` (not negative) as a varint."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
