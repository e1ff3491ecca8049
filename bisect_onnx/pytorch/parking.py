"""Weights parked on disk while ONNX Runtime holds its own copy of them.

PyTorch's parameters and ONNX Runtime's initializers are the same numbers, but they
cannot share memory: the dynamo exporter stores a Linear's weight transposed, and
ONNX Runtime repacks every MatMul and Conv weight into its kernels' layout at session
making (with repacking off its results change in the last bits, so production must
repack). Holding both is twice the weights: 24 GB for a 3-billion-parameter model.

So once PyTorch's values are recorded, a large model's tensors are pointed at their
bytes on disk and their own memory is freed. A parameter the ONNX file's external data
holds byte for byte (as it is, or transposed) is pointed at a copy-on-write map of that
file: nothing is written, and the file never changes. The other tensors are written to
one file in the run's temporary folder and pointed at a map of it. Pages of a map are
clean file pages the system can drop and read again, and are read only if PyTorch runs
again. Before PyTorch's next run, and when the run ends, every tensor gets its own
memory back, with the bytes it points at, so the caller's model is as it was (the same
tensor objects, the same bytes).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import mmap
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bisect_onnx.pytorch.weights_in_file import (
    READERS,
    StoredWeights,
    advise,
    bytes_of,
    read_into,
    view_of,
)
from bisect_onnx.runtime.heap import give_back
from bisect_onnx.runtime.memory import format_size

if TYPE_CHECKING:
    import onnx
    import torch

__all__ = ["PARK_MIN_BYTES", "WeightParking", "models_released_at_end", "parking_for"]

logger = logging.getLogger(__name__)

# Below this the second copy costs less than writing the weights out (about 2.5 s a
# GiB to the page cache on a 2-core machine) and reading them back.
PARK_MIN_BYTES = 1 << 30
# Each tensor starts on a page, as a freshly allocated one would be aligned.
_ALIGN = mmap.PAGESIZE
# Disk the file may not take: what the capture and the system still need.
_DISK_MARGIN = 1 << 30
# Set while the caller is done with its model once the run ends (the CLI).
_RELEASE_AT_END: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "bisect_onnx_release_parked_weights", default=False)


@dataclass
class _Slot:
    tensor: torch.Tensor
    offset: int
    nbytes: int
    file: Path
    """The written file, or the ONNX model's data file where it holds the tensor."""
    transposed: bool = False
    """The file holds the tensor's transpose (a Linear's weight, as exported)."""


@dataclass
class WeightParking:
    """Parks ``model``'s tensors on disk and gives them back; one object a run.

    ``park`` and ``restore`` may be called any number of times: each does its work
    only when the model is not already in that state.
    """

    model: object
    """The model in whatever form it came: only an ``nn.Module``'s tensors are parked."""
    folder: Path
    min_bytes: int | None = None
    """Park only a model holding this much; ``None``: :data:`PARK_MIN_BYTES`."""
    _slots: list[_Slot] = field(default_factory=list)
    _maps: dict[Path, mmap.mmap] = field(default_factory=dict)

    @property
    def parked(self) -> bool:
        """Whether the tensors point into a file now."""
        return bool(self._maps)

    @property
    def _written(self) -> Path:
        return self.folder / "parked-weights.bin"

    def park(self, onnx_model: onnx.ModelProto | None = None,
             model_dir: Path | None = None, *, model_file: Path | None = None) -> None:
        """Point the tensors at bytes on disk, if the model is large.

        A parameter whose bytes ``onnx_model``'s external data (in ``model_dir``) holds
        is pointed at them, read-only for the file (:mod:`~bisect_onnx.pytorch.
        weights_in_file`); the other tensors are written out to the run's folder. The
        ONNX file itself (``model_file``) is not pointed at, though its model read in
        place references its inline weights.
        """
        if self.parked:
            return
        tensors = _parkable(self.model)
        total = sum(_padded(t) for t in tensors)
        least = PARK_MIN_BYTES if self.min_bytes is None else self.min_bytes
        if not tensors or total < least:
            return
        started = time.perf_counter()
        if onnx_model is not None and model_dir is not None:
            tensors = self._point_at_model_file(tensors, onnx_model, model_dir, model_file)
        in_file = total - sum(_padded(t) for t in tensors)
        if tensors:
            self._write_out(tensors)
        if self.parked:
            logger.info("parked %s of weights (%s of them in the ONNX file's own data) while "
                        "ONNX Runtime holds its copy (%.1f s)", format_size(total),
                        format_size(in_file), time.perf_counter() - started)

    def _point_at_model_file(self, tensors: list[torch.Tensor], onnx_model: onnx.ModelProto,
                             model_dir: Path, model_file: Path | None,
                             ) -> list[torch.Tensor]:
        """Point each parameter the file holds at its bytes there; the other tensors."""
        import torch

        try:
            stored = StoredWeights(onnx_model, model_dir, model_file=model_file)
        except OSError as error:  # a data file that cannot be read: write them out
            logger.info("weights not parked on the ONNX file's data: %s", error)
            return tensors
        rest: list[torch.Tensor] = []
        with stored:
            for index, tensor in enumerate(tensors):
                try:  # buffers change under PyTorch (running statistics): written out
                    copy = (stored.find(tensor) if isinstance(tensor, torch.nn.Parameter)
                            else None)
                except OSError as error:  # a file that cannot be mapped: write the rest out
                    logger.info("weights not parked on the ONNX file's data: %s", error)
                    return rest + tensors[index:]
                if copy is None:
                    rest.append(tensor)
                    continue
                self._maps[copy.path] = copy.mapped
                slot = _Slot(tensor, copy.offset, tensor.numel() * tensor.element_size(),
                             copy.path, copy.transposed)
                _point_at([slot], self._maps[copy.path])
                self._slots.append(slot)
        return rest

    def _write_out(self, tensors: list[torch.Tensor]) -> None:
        """Write ``tensors`` to one file in the run's folder and point them at it."""
        total = sum(_padded(t) for t in tensors)
        free = shutil.disk_usage(self.folder).free
        if free < total + _DISK_MARGIN:
            logger.info("weights (%s) not parked: %s of disk free in %s", format_size(total),
                        format_size(free), self.folder)
            return
        path = self._written
        try:
            slots = _write(tensors, path)
            with open(path, "r+b") as file:
                mapped = mmap.mmap(file.fileno(), total)
        except OSError as error:  # the disk filled up meanwhile, say: those are untouched
            logger.info("weights not parked: %s", error)
            path.unlink(missing_ok=True)
            return
        self._maps[path] = mapped
        _point_at(slots, mapped)
        self._slots.extend(slots)

    def restore(self) -> None:
        """Give every parked tensor its own memory again, with the bytes it points at."""
        if not self.parked:
            return
        import torch

        started = time.perf_counter()
        owns = [torch.empty(slot.tensor.shape, dtype=slot.tensor.dtype) for slot in self._slots]
        written = [(slot, own) for slot, own in zip(self._slots, owns, strict=True)
                   if slot.file == self._written]
        if written:
            if hasattr(mmap, "MADV_DONTNEED"):
                # Pages PyTorch read through the map since (an op trace) leave this
                # process's resident memory; the file keeps them, so the copy below does
                # not count twice.
                self._maps[self._written].madvise(mmap.MADV_DONTNEED)
            # Read, not copied from the map, so that the map's pages never join this
            # process's resident memory; in parallel, since a virtual disk reads many
            # requests at once about 8 times faster than one after another.
            read_into(self._written, [(slot.offset, bytes_of(own)) for slot, own in written])
        _copy_from_maps([(slot, own) for slot, own in zip(self._slots, owns, strict=True)
                         if slot.file != self._written], self._maps)
        for slot, own in zip(self._slots, owns, strict=True):
            slot.tensor.data = own
        self._slots, self._maps = [], {}  # each map closes with its last view
        self._written.unlink(missing_ok=True)
        logger.info("weights read back into the model's own memory (%.1f s)",
                    time.perf_counter() - started)

    def release(self) -> None:
        """Let the parked weights go, leaving each parked tensor empty.

        A use of the model after this fails at once rather than computing on nothing.
        """
        if not self.parked:
            return
        import torch

        for slot in self._slots:
            slot.tensor.data = torch.empty(0, dtype=slot.tensor.dtype)
        self._slots, self._maps = [], {}
        self._written.unlink(missing_ok=True)


def _parkable(model: object) -> list[torch.Tensor]:
    """The model's CPU tensors that own their storage alone, each once."""
    import torch

    # A TorchScript module's tensors are its C++ module's; a program's are in its state.
    if not isinstance(model, torch.nn.Module) or isinstance(model, torch.jit.ScriptModule):
        return []
    by_storage: dict[int, list[torch.Tensor]] = {}
    seen: set[int] = set()
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) in seen:  # a tied weight is one Parameter under two names
            continue
        seen.add(id(tensor))
        if tensor.device.type == "cpu" and tensor.layout == torch.strided:
            by_storage.setdefault(tensor.untyped_storage().data_ptr(), []).append(tensor)
    # A tensor that shares its storage (a view of another) stays, and so do the
    # others over that storage: parking one would split them and free nothing.
    return [group[0] for group in by_storage.values()
            if len(group) == 1 and _owns_its_storage(group[0])]


def _owns_its_storage(tensor: torch.Tensor) -> bool:
    return (not tensor.is_quantized and tensor.is_contiguous() and tensor.numel() > 0
            and not tensor.storage_offset()
            and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size())


def _padded(tensor: torch.Tensor) -> int:
    nbytes = tensor.numel() * tensor.element_size()
    return -(-nbytes // _ALIGN) * _ALIGN


def _write(tensors: list[torch.Tensor], path: Path) -> list[_Slot]:
    """Write each tensor's bytes at a page-aligned offset; where each one lies."""
    slots, offset = [], 0
    with open(path, "wb") as file:
        for tensor in tensors:
            nbytes = tensor.numel() * tensor.element_size()
            file.seek(offset)
            file.write(bytes_of(tensor))
            slots.append(_Slot(tensor, offset, nbytes, path))
            offset += _padded(tensor)
        file.truncate(offset)
    return slots


def _point_at(slots: list[_Slot], mapped: mmap.mmap) -> None:
    """Swap each tensor's memory for its bytes in the map; its own memory is freed."""
    for slot in slots:
        # A transposed view holds the same values: PyTorch runs on it only where
        # production is still to be probed (the weights are read back before any other run).
        slot.tensor.data = view_of(mapped, slot.offset, slot.tensor.dtype,
                                   tuple(slot.tensor.shape), slot.transposed)


def _copy_from_maps(pairs: list[tuple[_Slot, torch.Tensor]], maps: dict[Path, mmap.mmap],
                    ) -> None:
    """Copy each slot's bytes from its map into its tensor's own memory, several at once.

    Through the map, not from the file: a page PyTorch wrote while parked is this
    process's copy, which the file never sees. The kernel is told to read ahead first,
    and each slot's pages leave this process's resident memory once copied.
    """
    if not pairs:
        return
    for slot, _ in pairs:
        advise(maps[slot.file], "MADV_WILLNEED", slot.offset, slot.nbytes, outward=True)

    def copy(pair: tuple[_Slot, torch.Tensor]) -> None:
        slot, own = pair
        own.copy_(slot.tensor.detach())
        advise(maps[slot.file], "MADV_DONTNEED", slot.offset, slot.nbytes, outward=False)

    with ThreadPoolExecutor(READERS) as copiers:
        list(copiers.map(copy, pairs))


@contextlib.contextmanager
def parking_for(model: object, folder: Path) -> Iterator[WeightParking]:
    """A run's parking for ``model`` in ``folder``: every tensor given back at the end."""
    parking = WeightParking(model, folder)
    try:
        yield parking
    finally:
        if _RELEASE_AT_END.get():
            parking.release()  # reading 12 GB back for a process about to end is waste
        else:
            parking.restore()
        give_back()  # what ONNX Runtime's sessions freed, kept for the weights read back


@contextlib.contextmanager
def models_released_at_end() -> Iterator[None]:
    """Runs whose weights, once parked, are released at the end, not read back.

    For a caller that is done with its model when the run ends: the CLI, which built it.
    """
    token = _RELEASE_AT_END.set(True)
    try:
        yield
    finally:
        _RELEASE_AT_END.reset(token)
