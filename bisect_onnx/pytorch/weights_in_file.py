"""Which of a model's tensors an ONNX file's external data already holds, byte for byte.

An export carries the model's weights in the data file beside the ``.onnx`` file: the
same bytes as PyTorch's parameters, stored as they are or, for a Linear's weight that
the dynamo and TorchScript exporters fold into its MatMul, transposed. Parking
(:mod:`bisect_onnx.pytorch.parking`) points such a parameter at those bytes instead of
writing them out again: on a virtual disk that writes at about 215 MB/s and reads at
about 770 MB/s, a 3-billion-parameter model's 11 GiB took about a minute to write.

Nothing is taken on trust from names or shapes: a planted weight, an edited file or an
export of other weights must not come back as the caller's. A tensor is matched only
after all its bytes are compared with the file's, through a map of it: pages the system
already holds are not copied, and leave this process's resident memory once compared.
"""

from __future__ import annotations

import math
import mmap
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bisect_onnx.graph.weights import external_location

if TYPE_CHECKING:
    import onnx
    import torch

__all__ = ["FileCopy", "StoredWeights", "advise", "bytes_of", "read_into", "view_of"]

# Reads in flight, and how much each one reads: a virtual disk reads many requests at
# once about 8 times faster than one after another.
READERS = 4
READ_CHUNK = 64 << 20
# Elements compared before a whole tensor is: most candidates of one shape (the same
# layer's weight in every block) differ there, and are never read whole.
_HEAD = 16
# What the system is asked to read past a tensor being compared: an export stores the
# parameters in the order they are compared, so the next ones are read while this one
# is (a 3-billion-parameter model's file, cold, was compared at about 290 MB/s).
READ_AHEAD = 256 << 20
# The file's rows compared at once with a transposed tensor's columns.
_ROWS_AT_ONCE = 256
_PAGE = mmap.PAGESIZE


@dataclass(frozen=True)
class FileCopy:
    """Where a tensor's bytes lie in a data file, and the file's copy-on-write map."""

    path: Path
    offset: int
    transposed: bool
    """The file holds the tensor's transpose (a 2-D tensor stored as ``(cols, rows)``)."""
    mapped: mmap.mmap


@dataclass(frozen=True)
class _Stored:
    path: Path
    offset: int
    shape: tuple[int, ...]


class StoredWeights:
    """The external tensors of one ONNX model, looked up by what a PyTorch tensor holds.

    Each data file is mapped copy-on-write (nothing done to a tensor pointed at it
    reaches the file), and compared through that map: pages the system already holds
    are not copied. Each stored tensor serves at most one PyTorch tensor: two
    parameters pointed at the same bytes would see each other's writes.
    """

    def __init__(self, model: onnx.ModelProto, model_dir: Path, *,
                 model_file: Path | None = None) -> None:
        self._by_kind: dict[tuple[torch.dtype | None, tuple[int, ...]], list[_Stored]] = {}
        self._used: set[tuple[Path, int]] = set()
        self._maps: dict[Path, mmap.mmap] = {}
        # The system is asked to read ahead from a thread of its own: the request waits
        # while the disk's queue is full, and would stall the comparison it feeds.
        self._reader = ThreadPoolExecutor(1)
        sizes: dict[Path, int] = {}
        # The ONNX file itself (its inline weights, read in place) is not a data file:
        # the user re-exports over it, where a data file is written once beside it.
        own = model_file.resolve() if model_file is not None else None
        for tensor in model.graph.initializer:
            stored = _stored(tensor, model_dir.resolve(), sizes)
            if stored is not None and stored.path != own:
                self._by_kind.setdefault((_torch_dtype(tensor.data_type), stored.shape),
                                         []).append(stored)

    def find(self, tensor: torch.Tensor) -> FileCopy | None:
        """Where the file holds ``tensor``'s bytes (contiguous, CPU), if it does."""
        shape = tuple(tensor.shape)
        orientations = [(shape, False)]
        if len(shape) == 2:
            orientations.append((shape[::-1], True))
        for stored_shape, transposed in orientations:
            for stored in self._by_kind.get((tensor.dtype, stored_shape), ()):
                key = (stored.path, stored.offset)
                if key in self._used:
                    continue
                mapped = self._map(stored.path)
                same = _same_bytes(tensor, mapped, stored, transposed, self._read_ahead)
                # Its pages leave this process's resident memory (the system keeps them):
                # a parked tensor's count only when PyTorch reads them again.
                advise(mapped, "MADV_DONTNEED", stored.offset,
                       math.prod(stored.shape) * tensor.element_size(), outward=False)
                if same:
                    self._used.add(key)
                    return FileCopy(stored.path, stored.offset, transposed, mapped)
        return None

    def close(self) -> None:
        """Wait for the reads asked for (the maps stay open for the tensors pointed at them)."""
        self._reader.shutdown()

    def __enter__(self) -> StoredWeights:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _read_ahead(self, mapped: mmap.mmap, offset: int, nbytes: int) -> None:
        """Have the system read a tensor's bytes, and the next ones, into its cache."""
        end = min(offset + nbytes + READ_AHEAD, len(mapped))
        self._reader.submit(advise, mapped, "MADV_WILLNEED", offset, end - offset,
                            outward=True)

    def _map(self, path: Path) -> mmap.mmap:
        if path not in self._maps:
            with open(path, "rb") as file:
                self._maps[path] = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
        return self._maps[path]


def view_of(mapped: mmap.mmap, offset: int, dtype: torch.dtype, shape: tuple[int, ...],
            transposed: bool) -> torch.Tensor:
    """A tensor of ``shape`` over the map's bytes at ``offset`` (its transpose's, if so)."""
    import torch

    count = math.prod(shape) * dtype.itemsize
    view = torch.frombuffer(mapped, dtype=torch.uint8, count=count, offset=offset).view(dtype)
    return view.reshape(shape[::-1]).t() if transposed else view.reshape(shape)


def advise(mapped: mmap.mmap, advice: str, offset: int, nbytes: int, *, outward: bool) -> None:
    """``madvise`` the pages of a range: all it touches, or only those it alone covers.

    Inward where pages are dropped: a page shared with a neighbour may hold what
    PyTorch wrote there.
    """
    if not hasattr(mmap, advice):
        return
    start, end = offset, offset + nbytes
    if outward:
        start, end = start // _PAGE * _PAGE, min(-(-end // _PAGE) * _PAGE, len(mapped))
    else:
        start, end = -(-start // _PAGE) * _PAGE, end // _PAGE * _PAGE
    if end > start:
        mapped.madvise(getattr(mmap, advice), start, end - start)


def _stored(tensor: onnx.TensorProto, model_dir: Path, sizes: dict[Path, int]) -> _Stored | None:
    """An external tensor's file and offset, where its bytes can be read as it says."""
    location = external_location(tensor)
    dtype = _torch_dtype(tensor.data_type)
    if not location or dtype is None:
        return None
    entries = {entry.key: entry.value for entry in tensor.external_data}
    path = (model_dir / location).resolve()
    if model_dir not in path.parents:  # never read outside the model's folder
        return None
    offset = int(entries.get("offset") or 0)
    shape = tuple(int(dim) for dim in tensor.dims)
    nbytes = math.prod(shape) * dtype.itemsize
    if path not in sizes:
        sizes[path] = path.stat().st_size if path.is_file() else -1
    if (nbytes == 0 or offset % dtype.itemsize or offset + nbytes > sizes[path]
            or int(entries.get("length") or nbytes) != nbytes):
        return None
    return _Stored(path, offset, shape)


def _same_bytes(tensor: torch.Tensor, mapped: mmap.mmap, stored: _Stored, transposed: bool,
                read_ahead: Callable[[mmap.mmap, int, int], None]) -> bool:
    """Whether every byte of ``tensor`` is the stored tensor's (its transpose's)."""
    import torch

    shape = stored.shape[::-1] if transposed else stored.shape
    ours = _bits(tensor)
    theirs = _bits(view_of(mapped, stored.offset, tensor.dtype, shape, transposed))
    first_row = (0,) * (tensor.dim() - 1)
    if tensor.dim() and not torch.equal(ours[first_row][:_HEAD], theirs[first_row][:_HEAD]):
        return False
    # Read ahead only for a likely match: a wrong candidate is never read whole.
    read_ahead(mapped, stored.offset, ours.numel() * ours.element_size())
    if not transposed:
        return torch.equal(ours, theirs)
    # A few hundred of the file's rows at a time: across a whole transposed tensor, each
    # of the file's rows is read one element per row of ours, and the compare ran at
    # two thirds of the speed (about 1.1 against 1.7 GB/s on this machine's 2 cores).
    return all(torch.equal(ours[:, start:start + _ROWS_AT_ONCE],
                           theirs[:, start:start + _ROWS_AT_ONCE])
               for start in range(0, ours.shape[1], _ROWS_AT_ONCE))


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor as integers of its element's width: compared bit for bit (NaN, -0.0)."""
    import torch

    integer = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return tensor.view(integer[tensor.element_size()])


def _torch_dtype(data_type: int) -> torch.dtype | None:
    """The torch dtype of an ONNX element type whose bytes PyTorch stores alike; else None."""
    import onnx
    import torch

    kinds = onnx.TensorProto
    return {kinds.FLOAT: torch.float32, kinds.DOUBLE: torch.float64,
            kinds.FLOAT16: torch.float16, kinds.BFLOAT16: torch.bfloat16,
            kinds.INT8: torch.int8, kinds.UINT8: torch.uint8, kinds.INT16: torch.int16,
            kinds.INT32: torch.int32, kinds.INT64: torch.int64,
            kinds.BOOL: torch.bool}.get(data_type)


def bytes_of(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous tensor's memory (any dtype)."""
    import torch

    return memoryview(tensor.detach().reshape(-1).view(torch.uint8).numpy())


def read_into(path: Path, targets: list[tuple[int, memoryview]]) -> None:
    """Fill each target with the file's bytes at its offset, several reads at a time."""
    chunks = [(offset + start, view[start:start + READ_CHUNK])
              for offset, view in targets for start in range(0, len(view), READ_CHUNK)]
    with open(path, "rb") as file:
        if not hasattr(os, "preadv"):  # Windows: one read after another
            for offset, view in chunks:
                file.seek(offset)
                file.readinto(view)
            return
        with ThreadPoolExecutor(READERS) as readers:
            done = readers.map(lambda chunk: os.preadv(file.fileno(), [chunk[1]], chunk[0]),
                               chunks)
            if sum(done) != sum(len(view) for _, view in chunks):
                raise OSError(f"{path} is shorter than the tensors read from it")
