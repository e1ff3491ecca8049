"""A standalone repro folder for the first divergence (``--repro-dir``).

The folder holds the smallest ONNX segment that computes the failing value from values
known to be right (PyTorch's, the user's inputs, the weights; cut by
:mod:`bisect_onnx.graph.segments`), those values, what PyTorch and ONNX Runtime computed,
and a ``repro.py`` needing only numpy and onnxruntime that exits 1 while ONNX Runtime
still disagrees (its text in :mod:`bisect_onnx.report.repro_script`). ``backend_test/``
holds the same segment in the ONNX backend-test layout, for an issue upstream
(:mod:`bisect_onnx.report.backend_test`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.errors import BisectOnnxError, InputError, ModelError, UsageError
from bisect_onnx.graph.segments import (
    embed_external_data,
    find_segment,
    segment_feeds,
    segment_model,
    segment_node_names,
)
from bisect_onnx.graph.walk import graph_tensors
from bisect_onnx.graph.weights import external_location, weight_bytes, write_external_data
from bisect_onnx.judge.compare import check_tolerances, compare_arrays
from bisect_onnx.report.advice import cause_outside_the_graph
from bisect_onnx.report.backend_test import DATA_SET, write_backend_test
from bisect_onnx.report.repro_script import readme_text, repro_script
from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner
from bisect_onnx.runtime.onnxruntime.sessions import CPU_PROVIDER, DEFAULT_OPT_LEVEL, OPT_LEVELS

if TYPE_CHECKING:
    import onnx

    from bisect_onnx.judge.records import Report
    from bisect_onnx.judge.tolerances import Tolerance
    from bisect_onnx.runtime.sides import SampleArrays

__all__ = ["Repro", "attach_repro", "check_repro_dir", "write_repro"]

logger = logging.getLogger(__name__)

# protobuf cannot serialize a message past 2 GiB; a bigger segment keeps its weights
# in one file beside model.onnx, inside the repro folder.
_PROTOBUF_LIMIT = 2**31 - 1
_DATA_FILE = "model.onnx.data"
# What a repro writes in its folder. A folder holding one of them that no earlier repro
# wrote is the user's: writing there would overwrite their files.
_WRITTEN = ("model.onnx", _DATA_FILE, "inputs.npz", "expected.npz", "candidate.npz",
            "environment.json", "repro.py", "README.txt", "backend_test")
# Written first, so that a repro cut short (Ctrl-C, a full disk) is still known as one.
_MARKER = ".bisect-onnx-repro"


@dataclass(frozen=True)
class Repro:
    """What :func:`write_repro` wrote and whether the written segment reproduces."""

    folder: Path
    nodes: list[str]
    """The segment's ONNX nodes, in graph order."""
    inputs: dict[str, str]
    """Segment input name -> :class:`~bisect_onnx.graph.segments.InputSource` value."""
    reproduces: bool
    """Whether ONNX Runtime on the segment alone still mismatches PyTorch's value."""


def attach_repro(report: Report, repro_dir: str | Path | None, *, sample: int | None,
                 write: Callable[[Path], dict[str, Any]]) -> Report:
    """Write the first divergence's repro with ``write``; the report that describes it.

    Into ``repro_dir`` itself for given inputs, ``<repro_dir>/sample-<k>`` for random
    sample ``k``; a repro that cannot be written leaves the verdict as it is, with a
    warning saying why.
    """
    from bisect_onnx.judge.assembly import amended

    if repro_dir is None or report.first_divergence is None:
        return report
    elsewhere = cause_outside_the_graph(report)
    if elsewhere is not None:  # a repro of a node is for an issue upstream: none to file
        return amended(report, repro_warnings=(f"no repro written: {elsewhere}",))
    folder = Path(repro_dir) if sample is None else Path(repro_dir) / f"sample-{sample}"
    try:
        return amended(report, repro=write(folder))
    except BisectOnnxError as error:
        return amended(report, repro_warnings=(f"no repro written: {error}",))


def check_repro_dir(repro_dir: str | Path | None, *, per_sample: bool) -> None:
    """Before a run: refuse a ``--repro-dir`` whose repro would overwrite the user's files.

    ``per_sample``: each sample's repro goes in ``<repro_dir>/sample-<k>``; those that
    exist are checked, not the folder itself.
    """
    if repro_dir is None:
        return
    folder = Path(repro_dir)
    for each in sorted(folder.glob("sample-*")) if per_sample else [folder]:
        if per_sample and not each.is_dir():  # (a sample's repro could not go there)
            raise UsageError(f"--repro-dir {folder} holds {each.name}, which is not a "
                             "folder, where a sample's repro goes; pass a new or empty "
                             "folder to --repro-dir")
        _check_repro_folder(each)


def _check_repro_folder(folder: Path) -> None:
    """Refuse ``folder`` where it holds what a repro writes and no earlier repro wrote it.

    An earlier repro's folder (its marker, or its ``environment.json``, names the
    repro) is written over, as running again means to; a link among those names never
    is, since writing through it would change the file it points to.
    """
    if not folder.is_dir():
        return
    there = [name for name in (*_WRITTEN, _MARKER)
             if (folder / name).exists() or (folder / name).is_symlink()]
    links = [name for name in there if (folder / name).is_symlink()]
    if there and (links or not _earlier_repro(folder)):
        raise UsageError(
            f"--repro-dir {folder} holds {', '.join(links or there)}, which the repro "
            "would overwrite" + (" through a link" if links else "")
            + ", and no earlier repro wrote it; pass a new or empty folder to --repro-dir")


def _earlier_repro(folder: Path) -> bool:
    """Whether ``folder`` holds a repro this package wrote (or began to write).

    Its marker, written first, says so; or, for one written before the marker was,
    its ``environment.json``.
    """
    if (folder / _MARKER).is_file() and not (folder / _MARKER).is_symlink():
        return True
    try:
        record = json.loads((folder / "environment.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and isinstance(record.get("repro"), dict) \
        and "failing_value" in record["repro"]


def write_repro(
    folder: Path,
    *,
    model: onnx.ModelProto,
    model_dir: Path,
    failing_value: str,
    values: SampleArrays,
    tolerance: Tolerance,
    environment: Mapping[str, Any],
    reference_label: str = "PyTorch",
) -> Repro:
    """Extract the segment computing ``failing_value``, write the repro folder, run it.

    ``model`` is the graph read without its external data; the weights the segment
    needs are read from ``model_dir`` and embedded, so ``folder`` stands alone.
    ``values.reference`` are PyTorch's values under ONNX value names (the failing
    value's is the expected output), ``values.candidate`` ONNX Runtime's from the full
    run. The segment runs on the CPU at ``environment["opt_level"]`` (ONNX Runtime's
    default level when absent) and is judged with the rule of
    :func:`~bisect_onnx.judge.compare.compare_arrays`. ``reference_label`` names the side
    the expected values come from in the README and the script (another ONNX model).
    """
    reference_values, candidate_values = values.reference, values.candidate
    graph_inputs, rtol, atol = values.graph_inputs, tolerance.rtol, tolerance.atol
    check_tolerances(rtol, atol)
    folder, model_dir = Path(folder), Path(model_dir)
    _check_repro_folder(folder)
    opt_level = _opt_level(environment)
    _check_failing_value(failing_value, reference_values, candidate_values, reference_label)
    expected = np.asarray(reference_values[failing_value])
    candidate = np.asarray(candidate_values[failing_value])

    segment = find_segment(model.graph, failing_value, reference_values=reference_values,
                           candidate_values=candidate_values, graph_inputs=graph_inputs)
    feeds = segment_feeds(segment, reference_values=reference_values,
                          candidate_values=candidate_values, graph_inputs=graph_inputs)
    repro_model = segment_model(model, segment, feeds, failing_value, candidate)
    inline = _embed_if_it_fits(repro_model, model_dir)
    names = segment_node_names(model.graph, segment)
    logger.info("repro segment for %s: %d node(s), inputs %s", failing_value, len(names),
                segment.inputs)

    checker = _write_case(folder, repro_model, None if inline else model_dir, feeds,
                          failing_value, expected=expected, candidate=candidate)
    reproduces = _reproduces(folder, feeds, expected, rtol=rtol, atol=atol,
                             opt_level=opt_level)
    if not reproduces:
        logger.warning("the repro segment for %s matches %s when run alone: the "
                       "divergence needs more of the model than the segment holds",
                       failing_value, reference_label)
    record = {
        **environment,
        "repro": {
            "failing_value": failing_value, "nodes": names, "inputs": segment.inputs,
            "rtol": rtol, "atol": atol, "provider": CPU_PROVIDER, "opt_level": opt_level,
            "onnx_checker": checker, "reproduces": reproduces,
        },
    }
    _write_instructions(folder, record, reference_label)
    return Repro(folder=folder, nodes=names, inputs=dict(segment.inputs),
                 reproduces=reproduces)


def _opt_level(environment: Mapping[str, Any]) -> str:
    """The level the segment runs at: the run's, or ONNX Runtime's default when absent."""
    opt_level = environment.get("opt_level") or DEFAULT_OPT_LEVEL
    if opt_level not in OPT_LEVELS:
        raise UsageError(f"opt_level {opt_level!r} in the environment is not one of "
                         f"{', '.join(OPT_LEVELS)}")
    return opt_level


def _check_failing_value(failing_value: str, reference_values: Mapping[str, np.ndarray],
                         candidate_values: Mapping[str, np.ndarray],
                         reference_label: str) -> None:
    """Both sides' values of the failing value are needed: the expected and the wrong one."""
    for side, values in (("reference", reference_values), ("candidate", candidate_values)):
        if failing_value not in values:
            raise InputError(f"no {side} value for the failing value {failing_value!r}; "
                             f"a repro needs both {reference_label}'s and ONNX Runtime's "
                             "value of it")


def _embed_if_it_fits(repro_model: onnx.ModelProto, model_dir: Path) -> bool:
    """Embed the segment's external weights unless that passes protobuf's limit; whether it did.

    Past the limit the weights stay external (:func:`_save_segment` gathers them),
    never all in memory.
    """
    inline = repro_model.ByteSize() + weight_bytes(
        tensor for tensor in graph_tensors(repro_model.graph)
        if external_location(tensor) is not None) <= _PROTOBUF_LIMIT
    if inline:
        for tensor in graph_tensors(repro_model.graph):
            embed_external_data(tensor, model_dir)
    return inline


@contextlib.contextmanager
def _writing_to(folder: Path) -> Iterator[None]:
    """A failed write is the user's to fix: the folder given is not writable."""
    try:
        yield
    except OSError as error:
        raise InputError(f"cannot write the repro to {folder}: {error.strerror or error}; "
                         "choose a writable folder for --repro-dir") from error


def _write_case(folder: Path, repro_model: onnx.ModelProto, weights_dir: Path | None,
                feeds: Mapping[str, np.ndarray], failing_value: str, *, expected: np.ndarray,
                candidate: np.ndarray) -> str:
    """The model, its data and the backend-test copy; the ONNX checker's verdict on the model.

    ``weights_dir``: where the external weights are, when they were too big to embed.
    """
    with _writing_to(folder):
        # A repro written over an older one must not keep its extra input_<k>.pb files.
        folder.mkdir(parents=True, exist_ok=True)
        (folder / _MARKER).write_text("a repro bisect-onnx writes; a run with this folder "
                                      "as --repro-dir writes over it\n", encoding="utf-8")
        shutil.rmtree(folder / "backend_test", ignore_errors=True)
        (folder / "backend_test" / DATA_SET).mkdir(parents=True, exist_ok=True)
        _save_segment(repro_model, folder, weights_dir)
        checker = _check(folder / "model.onnx")
        _write_npz(folder / "inputs.npz", feeds)
        _write_npz(folder / "expected.npz", {failing_value: expected})
        _write_npz(folder / "candidate.npz", {failing_value: candidate})
        write_backend_test(folder / "backend_test", feeds, failing_value, expected)
    return checker


def _write_instructions(folder: Path, record: Mapping[str, Any], reference_label: str) -> None:
    """``environment.json``, ``repro.py`` and ``README.txt``, from the record of the repro."""
    repro = record["repro"]
    with _writing_to(folder):
        (folder / "environment.json").write_text(
            json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
        (folder / "repro.py").write_text(repro_script(
            output=repro["failing_value"], rtol=repro["rtol"], atol=repro["atol"],
            opt_level=OPT_LEVELS[repro["opt_level"]], reference=reference_label),
            encoding="utf-8")
        (folder / "README.txt").write_text(readme_text(
            value=repro["failing_value"], nodes=len(repro["nodes"]), reference=reference_label,
            reproduces=repro["reproduces"]), encoding="utf-8")


def _reproduces(folder: Path, feeds: Mapping[str, np.ndarray], expected: np.ndarray, *,
                rtol: float, atol: float, opt_level: str) -> bool:
    """Whether the written segment, run alone on the CPU, still mismatches ``expected``."""
    try:
        actual = OnnxRuntimeRunner(folder / "model.onnx", provider=CPU_PROVIDER,
                                   opt_level=opt_level).run_outputs(list(feeds.values()))[0].array
    except ModelError as error:
        raise ModelError(f"the repro segment written to {folder} does not run on its own "
                         f"({error}); the full model ran, so the cut is at fault: please "
                         "report it to bisect-onnx") from error
    return not compare_arrays(expected, actual, rtol=rtol, atol=atol).passed


def _save_segment(model: onnx.ModelProto, folder: Path, model_dir: Path | None) -> None:
    """``model.onnx`` in ``folder`` and in ``folder/backend_test``.

    ``model_dir``: where the external weights are, when they are too big to embed;
    they are then gathered, tensor by tensor, into ``model.onnx.data`` beside the
    first, and copied beside the second: ONNX Runtime reads a model's data only from
    its own folder, and onnx refuses a data file with two hard links.
    """
    import onnx

    data = folder / _DATA_FILE
    data.unlink(missing_ok=True)  # left by an older, bigger repro
    if model_dir is not None:
        write_external_data(graph_tensors(model.graph), model_dir, data)
        shutil.copyfile(data, folder / "backend_test" / _DATA_FILE)
    for path in (folder / "model.onnx", folder / "backend_test" / "model.onnx"):
        onnx.save_model(model, str(path))


def _check(path: Path) -> str:
    """``passed``, or the ONNX checker's reason for rejecting the model at ``path``.

    Not fatal: a model ONNX Runtime runs may still break a rule of the standard, and
    the repro is worth having all the same.
    """
    import onnx

    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else "invalid"
        logger.warning("the repro model %s fails the ONNX checker: %s", path, reason)
        return reason
    return "passed"


def _write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """``np.savez`` without its keyword arguments: an ONNX value may be named ``file``."""
    with zipfile.ZipFile(path, "w") as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asarray(array), allow_pickle=False)
