"""Several real input sets in one run: each one a sample, the worst one reported.

Random ``--samples`` only explore what the graph's input specification allows; real
inputs (a batch of images, a few prompts) are what a user actually runs. ``--input``
takes several ``.npz`` (or ``.pt``) files, or a folder of them, and each file is one
sample; a few ``.npy`` files are still one sample, one file per ``forward`` argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bisect_onnx.errors import UsageError
from bisect_onnx.sources.file_kinds import NPY_MAGIC, read_head
from bisect_onnx.sources.loading import load_input_files

if TYPE_CHECKING:
    import numpy as np

    from bisect_onnx.runtime.input_specs import InputSpec

__all__ = ["Samples", "load_input_samples", "SAMPLE_SUFFIXES"]

#: What a folder given to ``--input`` is read for: one sample per file.
SAMPLE_SUFFIXES = (".npz", ".pt")


@dataclass(frozen=True)
class Samples:
    """Several input sets for one model, compared one by one; the report is the worst's.

    Each entry is what ``inputs`` takes alone (an array, a sequence in ``forward``'s
    order, or a mapping by name). ``labels`` name them in the report (file names, say).
    """

    inputs: Sequence[object]
    labels: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.inputs, (str, bytes)) or not len(self.inputs):
            raise UsageError("Samples needs at least one input set; pass a list of them")
        if self.labels is not None and len(self.labels) != len(self.inputs):
            raise UsageError(f"Samples got {len(self.inputs)} input sets and "
                             f"{len(self.labels)} labels; give one label per set, or none")

    def described(self) -> list[tuple[object, str]]:
        """Each input set with how the report names it."""
        count = len(self.inputs)
        labels = self.labels or [f"input set {number}" for number in range(1, count + 1)]
        return [(inputs, f"{label} (sample {number} of {count})")
                for number, (inputs, label) in enumerate(zip(self.inputs, labels,
                                                             strict=True), start=1)]


def load_input_samples(paths: Sequence[Path], *, max_memory: int | str | None = None,
                       onnx_model: Path | None = None,
                       ) -> list[np.ndarray] | dict[str, np.ndarray] | Samples:
    """``--input`` as given: one sample's inputs, or :class:`Samples` of several.

    Several files each holding a whole sample (``.npz``, ``.pt``), or one folder of them,
    are several samples; anything else is one sample (``.npy`` per argument, one file).
    ``onnx_model``: the ``.onnx`` file the inputs are for, when known; each file's
    headers are then checked against its graph's inputs before the data is read.
    """
    graph_inputs = _graph_inputs(Path(onnx_model)) if onnx_model is not None else None
    paths = [Path(path) for path in paths]
    if len(paths) == 1 and paths[0].is_dir():
        files = _sample_files(paths[0])
    elif len(paths) > 1 and not any(_is_npy(path) for path in paths):
        files = paths
    else:
        return load_input_files(paths, max_memory=max_memory, graph_inputs=graph_inputs)
    return Samples([load_input_files([path], max_memory=max_memory, graph_inputs=graph_inputs)
                    for path in files],
                   labels=[str(path) for path in files])


def _graph_inputs(onnx_model: Path) -> list[InputSpec]:
    from bisect_onnx.runtime.input_specs import input_specs
    from bisect_onnx.runtime.onnx_files import hand_over, load_onnx_model

    # The graph alone (no external weights), handed on to the side that runs the file.
    model = load_onnx_model(onnx_model)
    hand_over(onnx_model, model)
    return input_specs(model.graph)


def _sample_files(folder: Path) -> list[Path]:
    files = sorted(path for path in folder.iterdir()
                   if path.suffix.lower() in SAMPLE_SUFFIXES and path.is_file())
    if not files:
        raise UsageError(f"--input folder {folder} holds no {' or '.join(SAMPLE_SUFFIXES)} "
                         "file; put one file per sample there, or pass the files themselves")
    return files


def _is_npy(path: Path) -> bool:
    if path.is_dir():
        raise UsageError(f"--input {path} is a folder: pass it alone (each .npz in it is one "
                         "sample), or pass files")
    return read_head(path, len(NPY_MAGIC), label="input file",
                     expected=".npy or .pt files, or .npz files") == NPY_MAGIC
