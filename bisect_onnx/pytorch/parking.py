"""Weights parked on disk while ONNX Runtime holds its own copy of them.

PyTorch's parameters and ONNX Runtime's initializers are the same numbers, but they
cannot share memory: the dynamo exporter stores a Linear's weight transposed, and
ONNX Runtime repacks every MatMul and Conv weight into its kernels' layout at session
making (with repacking off its results change in the last bits, so production must
repack). Holding both is twice the weights: 24 GB for a 3-billion-parameter model.

So once PyTorch's values are recorded, a large model's parameters and buffers are
written to one file in the run's temporary folder and each tensor is pointed at a
memory map of it (the very bytes: PyTorch computes the same numbers from them). Its
own memory is freed; pages of the map are clean file pages the system can drop and
read again, and are read only if PyTorch runs again. Before PyTorch's next run, and
when the run ends, every tensor gets its own memory back, read from the file, so the
caller's model is as it was (the same tensor objects, the same bytes).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import mmap
import os
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_onnx.runtime.memory import format_size

__all__ = ["PARK_MIN_BYTES", "WeightParking", "models_released_at_end", "parking_for"]

logger = logging.getLogger(__name__)

# Below this the second copy costs less than writing the weights out (about 2.5 s a
# GiB to the page cache on a 2-core machine) and reading them back.
PARK_MIN_BYTES = 1 << 30
# Each tensor starts on a page, as a freshly allocated one would be aligned.
_ALIGN = mmap.PAGESIZE
# Disk the file may not take: what the capture and the system still need.
_DISK_MARGIN = 1 << 30
# Reads in flight when the weights come back, and how much each one reads.
_READERS = 4
_READ_CHUNK = 64 << 20
# Set while the caller is done with its model once the run ends (the CLI).
_RELEASE_AT_END: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "bisect_onnx_release_parked_weights", default=False)


@dataclass
class _Slot:
    tensor: Any
    offset: int
    nbytes: int


@dataclass
class WeightParking:
    """Parks ``model``'s tensors in ``folder`` and gives them back; one object a run.

    ``park`` and ``restore`` may be called any number of times: each does its work
    only when the model is not already in that state.
    """

    model: Any
    folder: Path
    min_bytes: int | None = None
    """Park only a model holding this much; ``None``: :data:`PARK_MIN_BYTES`."""
    _slots: list[_Slot] = field(default_factory=list)
    _map: mmap.mmap | None = None

    @property
    def parked(self) -> bool:
        """Whether the tensors point into the file now."""
        return self._map is not None

    def park(self) -> None:
        """Write the tensors out and point them at the file, if the model is large."""
        if self.parked:
            return
        tensors = _parkable(self.model)
        total = sum(_padded(t) for t in tensors)
        least = PARK_MIN_BYTES if self.min_bytes is None else self.min_bytes
        if not tensors or total < least:
            return
        free = shutil.disk_usage(self.folder).free
        if free < total + _DISK_MARGIN:
            logger.info("weights (%s) not parked: %s of disk free in %s", format_size(total),
                        format_size(free), self.folder)
            return
        started = time.perf_counter()
        path = self.folder / "parked-weights.bin"
        try:
            slots = _write(tensors, path)
            with open(path, "r+b") as file:
                self._map = mmap.mmap(file.fileno(), total)
        except OSError as error:  # the disk filled up meanwhile, say: the model is untouched
            logger.info("weights not parked: %s", error)
            path.unlink(missing_ok=True)
            return
        self._slots = slots
        _point_at(self._slots, self._map)
        logger.info("parked %s of weights in %s while ONNX Runtime holds its copy (%.1f s)",
                    format_size(total), path, time.perf_counter() - started)

    def restore(self) -> None:
        """Give every parked tensor its own memory again, with the file's bytes."""
        if not self.parked:
            return
        import torch

        started = time.perf_counter()
        path = self.folder / "parked-weights.bin"
        if hasattr(mmap, "MADV_DONTNEED"):
            # Pages PyTorch read through the map since (an op trace) leave this process's
            # resident memory; the file keeps them, so the copy below does not count twice.
            self._map.madvise(mmap.MADV_DONTNEED)
        owns = [torch.empty(slot.tensor.shape, dtype=slot.tensor.dtype) for slot in self._slots]
        # Read, not copied from the map, so that the map's pages never join this
        # process's resident memory; in parallel, since a virtual disk reads many
        # requests at once about 8 times faster than one after another.
        _read_into(path, [(slot.offset, _bytes_of(own))
                          for slot, own in zip(self._slots, owns, strict=True)])
        for slot, own in zip(self._slots, owns, strict=True):
            slot.tensor.data = own
        self._slots, self._map = [], None  # the map closes with its last view
        path.unlink(missing_ok=True)
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
        self._slots, self._map = [], None
        (self.folder / "parked-weights.bin").unlink(missing_ok=True)


def _parkable(model: Any) -> list[Any]:
    """The model's CPU tensors that own their storage alone, each once."""
    import torch

    # A TorchScript module's tensors are its C++ module's; a program's are in its state.
    if not isinstance(model, torch.nn.Module) or isinstance(model, torch.jit.ScriptModule):
        return []
    by_storage: dict[int, list[Any]] = {}
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


def _owns_its_storage(tensor: Any) -> bool:
    return (not tensor.is_quantized and tensor.is_contiguous() and tensor.numel() > 0
            and not tensor.storage_offset()
            and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size())


def _padded(tensor: Any) -> int:
    nbytes = tensor.numel() * tensor.element_size()
    return -(-nbytes // _ALIGN) * _ALIGN


def _bytes_of(tensor: Any) -> memoryview:
    """A writable byte view of a contiguous tensor's memory (any dtype)."""
    import torch

    return memoryview(tensor.detach().reshape(-1).view(torch.uint8).numpy())


def _write(tensors: list[Any], path: Path) -> list[_Slot]:
    """Write each tensor's bytes at a page-aligned offset; where each one lies."""
    slots, offset = [], 0
    with open(path, "wb") as file:
        for tensor in tensors:
            nbytes = tensor.numel() * tensor.element_size()
            file.seek(offset)
            file.write(_bytes_of(tensor))
            slots.append(_Slot(tensor, offset, nbytes))
            offset += _padded(tensor)
        file.truncate(offset)
    return slots


def _read_into(path: Path, targets: list[tuple[int, memoryview]]) -> None:
    """Fill each target with the file's bytes at its offset, several reads at a time."""
    chunks = [(offset + start, view[start:start + _READ_CHUNK])
              for offset, view in targets for start in range(0, len(view), _READ_CHUNK)]
    with open(path, "rb") as file:
        if not hasattr(os, "preadv"):  # Windows: one read after another
            for offset, view in chunks:
                file.seek(offset)
                file.readinto(view)
            return
        with ThreadPoolExecutor(_READERS) as readers:
            done = readers.map(lambda chunk: os.preadv(file.fileno(), [chunk[1]], chunk[0]),
                               chunks)
            if sum(done) != sum(len(view) for _, view in chunks):
                raise OSError(f"{path} is shorter than the weights parked in it")


def _point_at(slots: list[_Slot], mapped: mmap.mmap) -> None:
    """Swap each tensor's memory for its bytes in the map; its own memory is freed."""
    import torch

    for slot in slots:
        view = torch.frombuffer(mapped, dtype=torch.uint8, count=slot.nbytes,
                                offset=slot.offset)
        slot.tensor.data = view.view(slot.tensor.dtype).reshape(slot.tensor.shape)


@contextlib.contextmanager
def parking_for(model: Any, folder: Path) -> Iterator[WeightParking]:
    """A run's parking for ``model`` in ``folder``: every tensor given back at the end."""
    parking = WeightParking(model, folder)
    try:
        yield parking
    finally:
        if _RELEASE_AT_END.get():
            parking.release()  # reading 12 GB back for a process about to end is waste
        else:
            parking.restore()


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
