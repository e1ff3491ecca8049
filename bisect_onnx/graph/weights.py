"""External weights: how much they weigh, and writing them out without holding them all.

A model over 2 GB cannot be one protobuf message: its weights live in data files
beside the ``.onnx`` file, which ONNX Runtime reads only from inside the model's own
folder. It resolves symbolic links before it checks (ONNX Runtime 1.32: "External
data path escapes model directory"), so a data file needed in another folder is
hard-linked there, or copied where no hard link can be made; never symlinked.

onnx (1.23) in turn refuses to read external data from a file with several hard
links ("a potential hardlink attack"): a link suits a file only ONNX Runtime reads,
or one whose other name soon goes away (an export in a temporary folder, kept).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from bisect_onnx.graph.walk import graph_tensors

if TYPE_CHECKING:
    import numpy as np
    import onnx

__all__ = ["copy_model", "external_location", "link_or_copy", "tensor_values",
           "weight_bytes", "write_external_data"]

logger = logging.getLogger(__name__)


def external_location(tensor: onnx.TensorProto) -> str | None:
    """The data file an external tensor names (relative to its model), else ``None``."""
    import onnx

    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return None
    return next((entry.value for entry in tensor.external_data if entry.key == "location"), "")


def tensor_values(tensor: onnx.TensorProto, base_dir: str | Path) -> np.ndarray:
    """A tensor's values, its external data read from ``base_dir``; the tensor untouched.

    Older onnx releases (this package takes onnx 1.16 on) write the bytes they read
    into the tensor they read them for; onnx 1.23 does not. A model read in place
    (:mod:`bisect_onnx.runtime.weights_in_place`) would then hold each weight it was
    asked for (all of them after a digest), and change under a thread reading it: a
    copy of the reference (a few bytes) is read instead.
    """
    from onnx import numpy_helper

    if external_location(tensor) is not None:
        copy = type(tensor)()
        copy.CopyFrom(tensor)
        tensor = copy
    return numpy_helper.to_array(tensor, str(base_dir))


def weight_bytes(tensors: Iterable[onnx.TensorProto]) -> int:
    """Bytes the tensors' data take, external or inline, without reading external data."""
    import numpy as np
    import onnx

    total = 0
    for tensor in tensors:
        if external_location(tensor) is None:
            total += tensor.ByteSize()
            continue
        length = next((entry.value for entry in tensor.external_data if entry.key == "length"),
                      None)
        if length is not None:
            total += int(length)
        elif tensor.data_type != onnx.TensorProto.STRING:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
            total += int(np.prod(tensor.dims, dtype=np.int64)) * np.dtype(dtype).itemsize
    return total


def link_or_copy(source: Path, target: Path) -> str:
    """Make ``target`` hold ``source``'s bytes: a hard link, else a copy; say which.

    An existing ``target`` is replaced, not written through: it may itself be a hard
    link to a file that must not change.
    """
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
        return "link"
    except OSError as error:  # another file system, or one without hard links
        logger.debug("no hard link from %s to %s (%s): copying", source, target, error)
    shutil.copyfile(source, target)
    return "copy"


def write_external_data(tensors: Iterable[onnx.TensorProto], model_dir: Path,
                        data_path: Path) -> int:
    """Move every external tensor's data into ``data_path``, one tensor at a time.

    Each tensor is read from ``model_dir`` (where its model lies), appended to
    ``data_path`` and pointed there by name, so a model saved beside ``data_path``
    finds it; inline tensors stay inline. At most one tensor is in memory at once.
    Returns the bytes written.
    """
    import onnx
    from onnx.external_data_helper import load_external_data_for_tensor, set_external_data

    data_path.unlink(missing_ok=True)  # never write through a link
    written = 0
    with data_path.open("wb") as data:
        for tensor in tensors:
            if external_location(tensor) is None:
                continue
            load_external_data_for_tensor(tensor, str(model_dir))
            raw = tensor.raw_data
            offset = data.tell()
            data.write(raw)
            written += len(raw)
            set_external_data(tensor, location=data_path.name, offset=offset, length=len(raw))
            tensor.data_location = onnx.TensorProto.EXTERNAL
            tensor.ClearField("raw_data")
    return written


def copy_model(source: Path, target: Path, *, link: bool = True) -> None:
    """Save the ONNX model at ``source`` as ``target``, its weights as they are stored.

    Inline weights stay inline (one file); external ones end up in one data file
    named after ``target`` (``<target>.data``), so that nothing else in ``target``'s
    folder is overwritten: hard-linked when the source has exactly one data file,
    else gathered tensor by tensor. The weights are never all in memory.
    ``link=False`` copies the one data file instead: onnx refuses to read a file with
    two links, and the source may still be read while both names exist.
    """
    import onnx

    model = onnx.load(str(source), load_external_data=False)
    tensors = list(graph_tensors(model.graph))
    locations = {external_location(tensor) for tensor in tensors} - {None}
    target.parent.mkdir(parents=True, exist_ok=True)
    if not locations:
        shutil.copyfile(source, target)
        return
    data_path = target.with_name(f"{target.name}.data")
    if len(locations) == 1:
        (location,) = locations
        for tensor in tensors:
            if external_location(tensor) is not None:
                for entry in tensor.external_data:
                    if entry.key == "location":
                        entry.value = data_path.name
        if link:
            link_or_copy(source.parent / location, data_path)
        else:
            data_path.unlink(missing_ok=True)  # never write through a link
            shutil.copyfile(source.parent / location, data_path)
    else:
        write_external_data(tensors, source.parent, data_path)
    onnx.save_model(model, str(target))
