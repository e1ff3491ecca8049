"""A standalone repro folder for the first divergence (``--repro-dir``).

The folder holds the smallest ONNX segment that computes the failing value from values
known to be right (PyTorch's, the user's inputs, the weights), those values, what
PyTorch and ONNX Runtime computed, and a ``repro.py`` needing only numpy and
onnxruntime that exits 1 while ONNX Runtime still disagrees. ``backend_test/`` holds
the same segment in the ONNX backend-test layout, for an issue upstream.
"""

from __future__ import annotations

import json
import logging
import shutil
import string
import zipfile
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.errors import BisectOnnxError, InputError, ModelError, UsageError
from bisect_onnx.graph.weights import external_location, weight_bytes, write_external_data
from bisect_onnx.judge.compare import check_tolerances, compare_arrays
from bisect_onnx.runtime.onnx_side import (
    CPU_PROVIDER,
    DEFAULT_OPT_LEVEL,
    OPT_LEVELS,
    OnnxRuntimeSide,
    graph_tensors,
    subgraphs,
)

if TYPE_CHECKING:
    import onnx

__all__ = ["MAX_SEGMENT_NODES", "InputSource", "Repro", "Segment", "attach_repro",
           "find_segment", "segment_model", "write_repro"]

logger = logging.getLogger(__name__)

#: Past this many nodes a repro stops being one a maintainer reads; the walk back
#: stops there and ONNX Runtime's own values feed the cut (Constant nodes not counted).
MAX_SEGMENT_NODES = 200

# protobuf cannot serialize a message past 2 GiB; a bigger segment keeps its weights
# in one file beside model.onnx, inside the repro folder.
_PROTOBUF_LIMIT = 2**31 - 1
_DATA_FILE = "model.onnx.data"


class InputSource:
    """Where a segment input's value comes from (the values of :attr:`Repro.inputs`)."""

    REFERENCE = "reference"
    """PyTorch's value for that tensor, known to agree with ONNX Runtime's."""
    GRAPH_INPUT = "graph_input"
    """The user's input to the whole model."""
    CANDIDATE = "candidate"
    """ONNX Runtime's own value from the full run, where the segment was cut short."""


@dataclass(frozen=True)
class Repro:
    """What :func:`write_repro` wrote and whether the written segment reproduces."""

    folder: Path
    nodes: list[str]
    """The segment's ONNX nodes, in graph order."""
    inputs: dict[str, str]
    """Segment input name -> :class:`InputSource` value."""
    reproduces: bool
    """Whether ONNX Runtime on the segment alone still mismatches PyTorch's value."""


def attach_repro(report: Any, repro_dir: str | Path | None, *, sample: int | None,
                 write: Callable[[Path], dict[str, Any]]) -> None:
    """Write the first divergence's repro with ``write`` and describe it in the report.

    Into ``repro_dir`` itself for given inputs, ``<repro_dir>/sample-<k>`` for random
    sample ``k``; a repro that cannot be written leaves the verdict as it is, with a
    warning saying why.
    """
    if repro_dir is None or report.first_divergence is None:
        return
    folder = Path(repro_dir) if sample is None else Path(repro_dir) / f"sample-{sample}"
    try:
        report.repro = write(folder)
    except BisectOnnxError as error:
        report.warnings.append(f"no repro written: {error}")


def write_repro(
    folder: Path,
    *,
    model: onnx.ModelProto,
    model_dir: Path,
    failing_value: str,
    reference_values: Mapping[str, np.ndarray],
    candidate_values: Mapping[str, np.ndarray],
    graph_inputs: Mapping[str, np.ndarray],
    rtol: float,
    atol: float,
    environment: Mapping[str, Any],
    reference_label: str = "PyTorch",
) -> Repro:
    """Extract the segment computing ``failing_value``, write the repro folder, run it.

    ``model`` is the graph read without its external data; the weights the segment
    needs are read from ``model_dir`` and embedded, so ``folder`` stands alone.
    ``reference_values`` are PyTorch's values under ONNX value names (the failing
    value's is the expected output), ``candidate_values`` ONNX Runtime's from the full
    run. The segment runs on the CPU at ``environment["opt_level"]`` (ONNX Runtime's
    default level when absent) and is judged with the rule of
    :func:`~bisect_onnx.judge.compare.compare_arrays`. ``reference_label`` names the side
    the expected values come from in the README and the script (another ONNX model).
    """
    check_tolerances(rtol, atol)
    folder, model_dir = Path(folder), Path(model_dir)
    opt_level = environment.get("opt_level") or DEFAULT_OPT_LEVEL
    if opt_level not in OPT_LEVELS:
        raise UsageError(f"opt_level {opt_level!r} in the environment is not one of "
                         f"{', '.join(OPT_LEVELS)}")
    for side, values in (("reference", reference_values), ("candidate", candidate_values)):
        if failing_value not in values:
            raise InputError(f"no {side} value for the failing value {failing_value!r}; "
                             f"a repro needs both {reference_label}'s and ONNX Runtime's "
                             "value of it")
    expected = np.asarray(reference_values[failing_value])
    candidate = np.asarray(candidate_values[failing_value])

    segment = find_segment(model.graph, failing_value, reference_values=reference_values,
                            candidate_values=candidate_values, graph_inputs=graph_inputs)
    pools = {InputSource.REFERENCE: reference_values, InputSource.CANDIDATE: candidate_values,
             InputSource.GRAPH_INPUT: graph_inputs}
    feeds = {name: np.asarray(pools[source][name]) for name, source in segment.inputs.items()}
    repro_model = segment_model(model, segment, feeds, failing_value, candidate)
    # Past protobuf's limit the weights stay external (_save_segment), never all in memory.
    inline = repro_model.ByteSize() + weight_bytes(
        tensor for tensor in graph_tensors(repro_model.graph)
        if external_location(tensor) is not None) <= _PROTOBUF_LIMIT
    if inline:
        for tensor in graph_tensors(repro_model.graph):
            _embed_external_data(tensor, model_dir)
    names = [model.graph.node[index].name or f"{model.graph.node[index].op_type}_{index}"
             for index in segment.nodes]
    logger.info("repro segment for %s: %d node(s), inputs %s", failing_value, len(names),
                segment.inputs)

    try:
        # A repro written over an older one must not keep its extra input_<k>.pb files.
        shutil.rmtree(folder / "backend_test", ignore_errors=True)
        (folder / "backend_test" / "test_data_set_0").mkdir(parents=True, exist_ok=True)
        _save_segment(repro_model, folder, None if inline else model_dir)
        checker = _check(folder / "model.onnx")
        _write_npz(folder / "inputs.npz", feeds)
        _write_npz(folder / "expected.npz", {failing_value: expected})
        _write_npz(folder / "candidate.npz", {failing_value: candidate})
        _write_backend_test(folder / "backend_test", feeds, failing_value, expected)
    except OSError as error:
        raise InputError(f"cannot write the repro to {folder}: {error.strerror or error}; "
                         "choose a writable folder for --repro-dir") from error

    try:
        actual = OnnxRuntimeSide(folder / "model.onnx", provider=CPU_PROVIDER,
                                 opt_level=opt_level).run_outputs(list(feeds.values()))[0].array
    except ModelError as error:
        raise ModelError(f"the repro segment written to {folder} does not run on its own "
                         f"({error}); the full model ran, so the cut is at fault: please "
                         "report it to bisect-onnx") from error
    reproduces = not compare_arrays(expected, actual, rtol=rtol, atol=atol).passed
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
    try:
        (folder / "environment.json").write_text(
            json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
        (folder / "repro.py").write_text(_SCRIPT.substitute(
            output=repr(failing_value), rtol=repr(float(rtol)), atol=repr(float(atol)),
            opt_level=repr(OPT_LEVELS[opt_level]), reference=reference_label),
            encoding="utf-8")
        (folder / "README.txt").write_text(_README.format(
            value=failing_value, nodes=len(names), reference=reference_label,
            verdict="reproduces" if reproduces else "does NOT reproduce"), encoding="utf-8")
    except OSError as error:
        raise InputError(f"cannot write the repro to {folder}: {error.strerror or error}; "
                         "choose a writable folder for --repro-dir") from error
    return Repro(folder=folder, nodes=names, inputs=dict(segment.inputs),
                 reproduces=reproduces)


@dataclass(frozen=True)
class Segment:
    """The top-level nodes that compute a value from values known to be right."""

    nodes: list[int]
    """Indices of the top-level nodes, in graph order."""
    initializers: set[str]
    inputs: dict[str, str]
    """Frontier value -> source, in order of first use."""


def find_segment(
    graph: onnx.GraphProto,
    failing_value: str,
    *,
    reference_values: Mapping[str, np.ndarray],
    candidate_values: Mapping[str, np.ndarray],
    graph_inputs: Mapping[str, np.ndarray],
) -> Segment:
    """Walk back from ``failing_value``, nearest producers first, to values known to be right.

    A value stops the walk when it is a graph input, a weight, or has a PyTorch value of
    ONNX Runtime's dtype and shape (Constant nodes are taken in instead: they are part of
    the graph, not an input).
    Past :data:`MAX_SEGMENT_NODES` nodes, what is still open is fed ONNX Runtime's value.
    """
    producers = {name: index for index, node in enumerate(graph.node)
                 for name in node.output if name}
    weights = _defined_weights(graph)
    if failing_value not in producers:
        raise InputError(f"{failing_value!r} is not the output of any top-level node of the "
                         "ONNX graph; a repro starts from a value a node computes")
    included: set[int] = set()
    initializers: set[str] = set()
    frontier: dict[str, str] = {}
    counted = 0
    queue, seen = deque([failing_value]), {failing_value}
    while queue:
        name = queue.popleft()
        index = producers.get(name)
        if index in included:
            continue
        if name != failing_value:
            is_constant = index is not None and graph.node[index].op_type == "Constant"
            if name in graph_inputs:
                frontier[name] = InputSource.GRAPH_INPUT
                continue
            if name in weights:
                initializers.add(name)
                continue
            if name in reference_values and not is_constant and _fits(
                    reference_values[name], candidate_values.get(name)):
                frontier[name] = InputSource.REFERENCE
                continue
        if index is None:
            raise InputError(f"the ONNX value {name!r} needed to recompute {failing_value!r} "
                             "has no producer node, weight or given graph input")
        node = graph.node[index]
        if node.op_type != "Constant":
            if counted == MAX_SEGMENT_NODES:
                if name not in candidate_values:
                    raise InputError(f"the repro segment is cut at {name!r} after "
                                     f"{MAX_SEGMENT_NODES} nodes, but ONNX Runtime's value "
                                     "of it was not given")
                frontier[name] = InputSource.CANDIDATE
                continue
            counted += 1
        included.add(index)
        for used in _used_names(node):
            if used and used not in seen:
                seen.add(used)
                queue.append(used)
    nodes = sorted(included)
    # A frontier value may turn out to come from a node taken in later for another of
    # its outputs; then the segment computes it. The rest go in order of first use.
    order = [name for index in nodes for name in _used_names(graph.node[index])]
    inputs = {name: frontier[name] for name in dict.fromkeys(order)
              if name in frontier and producers.get(name) not in included}
    return Segment(nodes=nodes, initializers=initializers, inputs=inputs)


def _fits(reference: np.ndarray, candidate: np.ndarray | None) -> bool:
    """Whether PyTorch's value can stand in for ONNX Runtime's (same dtype and shape)."""
    if candidate is None:
        return True
    reference, candidate = np.asarray(reference), np.asarray(candidate)
    return reference.dtype == candidate.dtype and reference.shape == candidate.shape


def _defined_weights(graph: onnx.GraphProto) -> set[str]:
    return ({tensor.name for tensor in graph.initializer}
            | {sparse.values.name for sparse in graph.sparse_initializer})


def _used_names(node: onnx.NodeProto) -> list[str]:
    """A node's inputs, including the outer values its subgraphs (If, Loop, Scan) read."""
    names = list(node.input)
    for attribute in node.attribute:
        for subgraph in subgraphs(attribute):
            names.extend(_outer_names(subgraph))
    return names


def _outer_names(graph: onnx.GraphProto) -> list[str]:
    defined = {value.name for value in graph.input} | _defined_weights(graph)
    outer = []
    for node in graph.node:
        outer.extend(name for name in _used_names(node) if name and name not in defined)
        defined.update(node.output)
    outer.extend(value.name for value in graph.output if value.name not in defined)
    return outer


def segment_model(model: onnx.ModelProto, segment: Segment, feeds: Mapping[str, np.ndarray],
                   output: str, output_value: np.ndarray) -> onnx.ModelProto:
    """The segment as a model of its own, typed from the arrays that feed and leave it."""
    import onnx

    graph = model.graph

    def typed(name: str, array: np.ndarray) -> onnx.ValueInfoProto:
        return onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)

    initializers = [tensor for tensor in graph.initializer if tensor.name in segment.initializers]
    inputs = [typed(name, array) for name, array in feeds.items()]
    if model.ir_version < 4:  # before IR 4 every initializer is also a graph input
        inputs += [onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims)
                   for tensor in initializers]
    repro_graph = onnx.helper.make_graph(
        [graph.node[index] for index in segment.nodes],
        "bisect_onnx_repro",
        inputs,
        # Typed from ONNX Runtime's value: that is what the nodes produce, even where
        # PyTorch's dtype or shape differs.
        [typed(output, output_value)],
        initializer=initializers,
        sparse_initializer=[sparse for sparse in graph.sparse_initializer
                            if sparse.values.name in segment.initializers],
        doc_string=f"bisect-onnx repro: the nodes of {model.graph.name or 'the model'} "
                   f"that compute {output!r} from values known to be right",
    )
    # make_graph and make_model copy what they are given: the caller's model is untouched.
    return onnx.helper.make_model(
        repro_graph,
        opset_imports=list(model.opset_import),
        functions=list(model.functions),
        ir_version=model.ir_version,
        producer_name=model.producer_name,
        producer_version=model.producer_version,
    )


def _embed_external_data(tensor: onnx.TensorProto, model_dir: Path) -> None:
    """Read an external tensor's bytes from ``model_dir`` into the tensor itself."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    if not uses_external_data(tensor):
        return
    location = next((entry.value for entry in tensor.external_data if entry.key == "location"),
                    "")
    root = model_dir.resolve()
    if not location or not (root / location).resolve().is_relative_to(root):
        raise InputError(f"the weight {tensor.name!r} keeps its data at {location!r}, outside "
                         f"the model's folder {model_dir}; bisect-onnx reads external data "
                         "only from beside the .onnx file: move it there and fix the location")
    try:
        load_external_data_for_tensor(tensor, str(root))
    except (OSError, ValueError, onnx.checker.ValidationError) as error:
        raise InputError(f"cannot read the external data of weight {tensor.name!r} from "
                         f"{root / location}: {error}; is the weights file beside the "
                         ".onnx file complete?") from error
    # Older onnx releases leave the tensor marked external after loading its bytes.
    tensor.data_location = onnx.TensorProto.DEFAULT
    del tensor.external_data[:]


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


def _write_backend_test(folder: Path, feeds: Mapping[str, np.ndarray], output: str,
                        expected: np.ndarray) -> None:
    """ONNX's backend-test data set: TensorProto files (the model is already there)."""
    from onnx import numpy_helper

    data = folder / "test_data_set_0"
    for position, (name, array) in enumerate(feeds.items()):
        (data / f"input_{position}.pb").write_bytes(
            numpy_helper.from_array(array, name).SerializeToString())
    (data / "output_0.pb").write_bytes(
        numpy_helper.from_array(expected, output).SerializeToString())


_README = """\
A repro made by bisect-onnx: ONNX Runtime disagrees with {reference} on the value {value!r}.
model.onnx holds only the {nodes} node(s) that compute it, fed the values in inputs.npz
({reference}'s values, the model's inputs, or ONNX Runtime's where the segment was cut;
see environment.json). expected.npz is {reference}'s value, candidate.npz ONNX Runtime's in
the full model. When it was written, the segment alone {verdict} the mismatch.
Run:  python repro.py   (needs numpy and onnxruntime; exits 1 while the mismatch
reproduces, 0 once fixed). backend_test/ is the same case in the ONNX backend-test
layout, ready to attach to an issue upstream.
"""

# The comparison rule is bisect_onnx.judge.compare.compare_arrays's, restated so that the
# script needs nothing but numpy and onnxruntime; tests/test_repro.py holds them equal.
_SCRIPT = string.Template('''\
"""Re-run the ONNX Runtime divergence bisect-onnx found, on the smallest failing segment.

Exits 1 while ONNX Runtime's value differs from $reference's (expected.npz), 0 once it
agrees, 2 when the model cannot run. Needs only numpy and onnxruntime.
"""

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

HERE = Path(__file__).resolve().parent
OUTPUT = $output
RTOL = $rtol
ATOL = $atol
OPT_LEVEL = $opt_level  # the graph optimization level the divergence was found at
SHOWN = 5  # worst elements printed


def out_of_tolerance(expected, actual):
    """Where |actual - expected| > ATOL + RTOL * |expected|; equal NaN/Inf agree."""
    if not np.issubdtype(expected.dtype, np.inexact):
        return expected != actual  # integers and booleans: exact
    kind = np.complex128 if np.iscomplexobj(expected) else np.float64
    ref, got = expected.astype(kind), actual.astype(kind)
    with np.errstate(all="ignore"):
        within = np.abs(got - ref) <= ATOL + RTOL * np.abs(ref)
    within &= np.isfinite(ref) & np.isfinite(got)
    same_nonfinite = (np.isnan(ref) & np.isnan(got)) | (~np.isfinite(ref) & (ref == got))
    return ~(within | same_nonfinite)


def main():
    try:
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPT_LEVEL)
        session = ort.InferenceSession(str(HERE / "model.onnx"), options,
                                       providers=["CPUExecutionProvider"])
        with np.load(HERE / "inputs.npz") as archive:
            feeds = {name: archive[name] for name in archive.files}
        actual = np.asarray(session.run([OUTPUT], feeds)[0])
    except Exception as error:
        print(f"model.onnx does not run in ONNX Runtime {ort.__version__}: {error}")
        return 2
    with np.load(HERE / "expected.npz") as archive:
        expected = archive[OUTPUT]
    print(f"ONNX Runtime {ort.__version__} (CPU, {OPT_LEVEL}), value {OUTPUT!r}, "
          f"rtol={RTOL}, atol={ATOL}")
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        print(f"MISMATCH: got {actual.dtype}{list(actual.shape)}, "
              f"expected {expected.dtype}{list(expected.shape)}")
        return 1
    bad = out_of_tolerance(expected, actual)
    kind = np.complex128 if np.iscomplexobj(expected) else np.float64
    ref, got = expected.astype(kind), actual.astype(kind)
    finite = np.isfinite(ref) & np.isfinite(got)
    with np.errstate(all="ignore"):
        diff = np.where(finite, np.abs(got - ref), 0.0)
        rel = np.where(finite & (ref != 0), diff / np.abs(np.where(ref != 0, ref, 1)), 0.0)
    print(f"max abs error {diff.max(initial=0.0):.6g}, max rel error {rel.max(initial=0.0):.6g}, "
          f"{np.count_nonzero(bad)} of {bad.size} elements out of tolerance "
          f"({np.count_nonzero(bad) / max(bad.size, 1):.2%})")
    if not bad.any():
        print("OK: ONNX Runtime agrees with $reference")
        return 0
    worst = np.argsort(np.where(bad, np.where(finite, diff, np.inf), -1.0), axis=None)[::-1]
    for flat in worst[:min(SHOWN, np.count_nonzero(bad))]:
        index = np.unravel_index(flat, bad.shape)
        print(f"  at {list(map(int, index))}: expected {expected[index]}, got {actual[index]}")
    print("MISMATCH: ONNX Runtime still disagrees with $reference")
    return 1


if __name__ == "__main__":
    sys.exit(main())
''')
