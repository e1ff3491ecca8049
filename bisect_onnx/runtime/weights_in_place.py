"""An ONNX file's bytes with its large inline weights left where they lie in the file.

ONNX Runtime reads a model handed over as bytes whole: for a file holding its weights
inline (BERT-base's 440 MB), making a session on a copy with a few more graph outputs
meant serializing the model (0.65 s), and ONNX Runtime copying and parsing every weight
again (0.75 s). Each large weight's ``raw_data`` is a contiguous run of the file's
bytes; here the file is rewritten, at the level of protobuf's wire format, with each
such field replaced by an external-data reference to where it lies in the file itself
(``location`` the file's name, ``offset``, ``length``), which ONNX Runtime reads from
the file (mapped), as it reads any external weight (0.36 s in all for BERT-base, the
same values bitwise). Nothing is parsed but the tags and lengths around the weights.

ONNX Runtime's side reads its model itself this way (:func:`model_in_place`): the graph
parsed without a weight copied out of the file (BERT-base's read went from 0.23 s to
0.005 s), each large weight's values read from the file where something needs them.
A local check's model (a few of the file's nodes, copied) takes its weights the same
way: each initializer's bytes, referenced where they lie (:func:`initializers_in_place`),
appended to the model's own (:func:`with_initializers`): ResNet-50's parity check's
local reruns went from 0.43 s to 0.19 s.

Only top-level initializers with ``raw_data`` of :data:`IN_PLACE_FROM` bytes or more
are referenced; every other byte is copied as it is. A file that is not what it was
when read, or that this reading of the wire format does not expect, gives ``None``:
the caller serializes its model instead.

A session so made may keep the user's file mapped while it lives (a weight no kernel
packs into memory of its own, an embedding's table): a file rewritten in place during
the run (a re-export over it) may then end the process or change what it computes, as
for any model whose weights lie in an external data file. The file is never written.
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from bisect_onnx.graph.protobuf_wire import WireFormatError, encode_varint, read_varint
from bisect_onnx.runtime.onnx_files import file_key

if TYPE_CHECKING:
    import onnx

__all__ = ["weights_in_place", "model_in_place", "initializers_in_place", "with_initializers",
           "IN_PLACE_FROM"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Weights smaller than this stay inline (ONNX's own external-data threshold).
IN_PLACE_FROM = 1024
# Field numbers (onnx.proto): ModelProto.graph, GraphProto.initializer, and TensorProto's
# name, raw_data, external_data (StringStringEntryProto: key 1, value 2), data_location.
_GRAPH, _INITIALIZER = 7, 5
_NAME, _RAW_DATA, _EXTERNAL_DATA, _DATA_LOCATION = 8, 9, 13, 14
_EXTERNAL = 1  # TensorProto.EXTERNAL
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


def weights_in_place(path: Path, key: tuple[str, int, int] | None) -> bytes | None:
    """The model at ``path`` with its large inline weights referenced where they lie.

    ``key``: the file as its model was read (:func:`~bisect_onnx.runtime.onnx_files.file_key`);
    ``None`` where it changed since, cannot be read, or holds what is not expected.
    ONNX Runtime must be told the file's folder as where external weights lie.
    """
    return _read_mapped(path, key, _rewritten)


def model_in_place(path: Path, key: tuple[str, int, int] | None) -> onnx.ModelProto | None:
    """The file's model with its large inline weights referenced where they lie in it.

    Only the tags and lengths around the weights are parsed: a few milliseconds for
    BERT-base's 440 MB, against 0.2 to 0.4 s for protobuf to copy every weight out. A
    weight's values are read from the file where something needs them, as from any
    external-data file (``numpy_helper.to_array(tensor, folder)``). ``None`` as for
    :func:`weights_in_place`, where the rewritten bytes do not parse, or where the file
    has other hard links.
    """
    import onnx
    from google.protobuf.message import DecodeError

    try:
        if path.stat().st_nlink > 1:
            # onnx refuses to read external data from a file with several hard links
            # (a guard against hard-link attacks): a DVC cache's or ``cp -al``'s file.
            return None
    except OSError:
        return None
    serialized = weights_in_place(path, key)
    if serialized is None:
        return None
    try:
        return onnx.ModelProto.FromString(serialized)
    except DecodeError:
        return None


def initializers_in_place(path: Path, key: tuple[str, int, int] | None,
                          ) -> dict[str, bytes] | None:
    """Each top-level initializer of the file at ``path``, serialized, by name.

    Its large inline weights referenced where they lie, as :func:`weights_in_place`
    writes them: what a model of a few of the file's nodes (a local check's) takes
    its weights from without copying or serializing them (:func:`with_initializers`).
    ``None`` as for :func:`weights_in_place`.
    """
    return _read_mapped(path, key, _initializers)


def _read_mapped(path: Path, key: tuple[str, int, int] | None,
                 read: Callable[[mmap.mmap, str], _T]) -> _T | None:
    """``read(the file mapped, its name)`` where the file is still as ``key`` says."""
    if key is None or file_key(path) != key:
        return None
    try:
        with path.open("rb") as stream, mmap.mmap(stream.fileno(), 0,
                                                  access=mmap.ACCESS_READ) as mapped:
            return read(mapped, path.resolve().name)
    except (OSError, ValueError) as error:  # (an empty file cannot be mapped either)
        logger.debug("weights of %s not referenced in place: %s", path, error)
        return None


def with_initializers(serialized: bytes, tensors: Iterable[bytes]) -> bytes:
    """A serialized model with ``tensors`` (serialized TensorProtos) added to its graph.

    Protobuf merges a message read twice and appends to a repeated field: the model
    read back has its own initializers and these after them.
    """
    return serialized + _field(_GRAPH, b"".join(_field(_INITIALIZER, tensor)
                                                for tensor in tensors))


def _initializers(data: mmap.mmap, location: str) -> dict[str, bytes]:
    """Each initializer of the graph in ``data`` (a ModelProto), by name (see above)."""
    found: dict[str, bytes] = {}
    for number, _, payload, end in _fields(data, 0, len(data)):
        if number != _GRAPH:
            continue
        for inner, _, inner_payload, inner_end in _fields(data, payload, end):
            if inner != _INITIALIZER:
                continue
            name = next((bytes(data[start:stop]).decode() for field_number, _, start, stop
                         in _fields(data, inner_payload, inner_end)
                         if field_number == _NAME), "")
            tensor = _referenced(data, inner_payload, inner_end, location)
            found.setdefault(name, data[inner_payload:inner_end] if tensor is None
                             else tensor)
    return found


def _rewritten(data: mmap.mmap, location: str) -> bytes:
    """``data`` (a ModelProto) with its graph's large ``raw_data`` fields referenced."""
    out = bytearray()
    for number, start, payload, end in _fields(data, 0, len(data)):
        if number != _GRAPH:
            out += data[start:end]
            continue
        graph = bytearray()
        for inner, inner_start, inner_payload, inner_end in _fields(data, payload, end):
            tensor = (_referenced(data, inner_payload, inner_end, location)
                      if inner == _INITIALIZER else None)
            graph += data[inner_start:inner_end] if tensor is None else _field(inner, tensor)
        out += _field(_GRAPH, graph)
    return bytes(out)


def _referenced(data: mmap.mmap, start: int, end: int, location: str) -> bytes | None:
    """A TensorProto's bytes with its ``raw_data`` referenced; ``None``: left as it is."""
    fields = list(_fields(data, start, end))
    raw = next(((payload, field_end) for number, _, payload, field_end in fields
                if number == _RAW_DATA), None)
    if raw is None or raw[1] - raw[0] < IN_PLACE_FROM or any(
            number == _EXTERNAL_DATA or (number == _DATA_LOCATION
                                         and read_varint(data, payload)[0] != 0)
            for number, _, payload, _ in fields):
        return None
    tensor = bytearray()
    for number, field_start, _, field_end in fields:
        # (a data_location said DEFAULT, as onnx writes a weight it read back, goes too)
        if number not in (_RAW_DATA, _DATA_LOCATION):
            tensor += data[field_start:field_end]
    for entry_key, value in (("location", location), ("offset", str(raw[0])),
                             ("length", str(raw[1] - raw[0]))):
        tensor += _field(_EXTERNAL_DATA, _field(1, entry_key.encode())
                         + _field(2, value.encode()))
    tensor += encode_varint(_DATA_LOCATION << 3 | _VARINT) + encode_varint(_EXTERNAL)
    return bytes(tensor)


def _fields(data: mmap.mmap, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """Each field of the message in ``data[start:end]``: number, start, payload, end."""
    position = start
    while position < end:
        tag, payload = read_varint(data, position)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == _VARINT:
            _, field_end = read_varint(data, payload)
        elif wire_type == _LENGTH:
            length, payload = read_varint(data, payload)
            field_end = payload + length
        elif wire_type in (_FIXED64, _FIXED32):
            field_end = payload + (8 if wire_type == _FIXED64 else 4)
        else:  # groups: not in onnx.proto
            raise WireFormatError(f"wire type {wire_type} at byte {position}")
        if field_end > end or number == 0:
            raise WireFormatError(f"field {number} at byte {position} runs past its message")
        yield number, position, payload, field_end
        position = field_end


def _field(number: int, payload: bytes | bytearray) -> bytes:
    """A length-delimited field."""
    return encode_varint(number << 3 | _LENGTH) + encode_varint(len(payload)) + bytes(payload)
