"""Record a reference where PyTorch runs: ``bisect-onnx MODEL ... --record REF``.

The comparison runs as :func:`bisect_onnx.bisect` runs it; its one sample's stages are
kept (:class:`_Recorder`), and what a check elsewhere needs is written into the
archive: PyTorch's value at every ONNX value the comparison aligned (the report's
rows, and the values its local checks were fed), the final outputs, and PyTorch's
values inside the kernels the runtime fused (ops, module calls), which a runtime that
fuses otherwise captures, and which name a culprit inside a kernel; with each row's
provenance, the tolerance, the coverage, the environment and the graph's digest.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.errors import UsageError
from bisect_onnx.reference.archive import MODEL
from bisect_onnx.reference.graph_digest import graph_digest
from bisect_onnx.reference.manifest import RowProvenance
from bisect_onnx.reference.writing import (
    ONE_SAMPLE,
    Kept,
    check_one_recorded_sample,
    embedded_onnx,
    write_reference,
)

if TYPE_CHECKING:
    from bisect_onnx.graph.nodes import NodeInfo
    from bisect_onnx.judge.records import Report
    from bisect_onnx.pipeline.torch_sample import TorchSample
    from bisect_onnx.pipeline.torch_settings import Settings
    from bisect_onnx.runtime.sides import CapturedValue

__all__ = ["record", "record_with_report"]

def record(model: object, inputs: object = None, *, path: str | Path,
           **options: Any) -> Path:
    """Compare as :func:`bisect_onnx.bisect` does, and write a reference archive.

    The archive at ``path`` holds PyTorch's values for ``bisect-onnx check`` elsewhere.

    Args:
        model: As :func:`bisect_onnx.bisect` takes it; or a reference ONNX model (a path
            to an ``.onnx`` file or an ``onnx.ModelProto``): then the comparison is
            :func:`bisect_onnx.bisect_onnx_models`'s, the candidate given as
            ``candidate=``, and the archive holds the reference file's values.
        inputs: One input set (arrays, a mapping, or :class:`~bisect_onnx.RandomInputs`
            with ``samples=1``): the values hold for these inputs only.
        path: Where the archive is written (docs/reference-format.md).
        options: :func:`bisect_onnx.bisect`'s keyword arguments (``onnx_model``,
            ``tolerance``, ``export``, ``runtime``, ``search``, ``output``, ...), or
            for a reference ONNX model :func:`bisect_onnx.bisect_onnx_models`'s
            (``candidate``, ``reference_runtime``, ``candidate_runtime``, ...).

    Returns:
        ``path``.
    """
    from bisect_onnx.reference.onnx_recording import is_onnx_model, record_onnx_with_report

    if is_onnx_model(model):
        candidate = options.pop("candidate", None)
        return record_onnx_with_report(model, candidate, inputs, path=path, **options)[1]
    return record_with_report(model, inputs, path=path, **options)[1]


def record_with_report(model: object, inputs: object = None, *, path: str | Path,
                       command: str | None = None, **options: Any) -> tuple[Report, Path]:
    """:func:`record`, with the comparison's report (the command line prints it).

    ``command``: how to record it again, said by a check that needs PyTorch.
    """
    from bisect_onnx.pipeline.options import Tolerance
    from bisect_onnx.pipeline.pytorch_vs_onnx import PyTorchCall, compare_pytorch
    from bisect_onnx.pytorch.reference import exit_is_a_model_error
    from bisect_onnx.sources.output_paths import check_run_files

    path = Path(path)
    given = Tolerance.of(options.get("tolerance"))
    check_one_recorded_sample(inputs)
    check_run_files({"path": path}, model=model,
                    onnx_models={"onnx_model": options.get("onnx_model")})
    with tempfile.TemporaryDirectory(prefix="bisect-onnx-record-") as folder:
        recorder = _Recorder(Path(folder))
        compare = exit_is_a_model_error(lambda model: compare_pytorch(
            PyTorchCall(model, inputs, **options), run_sample=recorder))
        report = compare(model)
        write_reference(path, report, recorder.kept, command, given)
    return report, path


class _Recorder:
    """Runs the one sample's stages, keeping what the archive needs (a ``SampleRunner``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.kept: Kept | None = None

    def __call__(self, settings: Settings, arrays: list[np.ndarray], description: str):
        """The sample's report and repro writer, as ``run_torch_sample`` gives them."""
        from bisect_onnx.pipeline.stages import run_stages
        from bisect_onnx.pipeline.torch_sample import TORCH_STAGES, TorchSample, repro_writer

        if self.kept is not None:  # refused before: one input set
            raise UsageError(ONE_SAMPLE.format(what="several"))
        sample = run_stages(TORCH_STAGES, TorchSample(settings, arrays, description))
        self.kept = self._keep(sample)
        return sample.report, repro_writer(sample)

    def _keep(self, sample: TorchSample) -> Kept:
        candidate = sample.candidate
        kept = Kept(inputs=[(spec.name, array) for spec, array
                             in zip(candidate.inputs, sample.arrays, strict=True)])
        for name, (value, node) in _inner_values(sample).items():
            kept.values[name] = value.array
            kept.inner[name] = _inner_provenance(name, value, node)
        kept.values.update(sample.values.reference)
        for name, (array, provenance) in _inside_op(sample).items():
            if name not in kept.values:  # what the look inside the culprit's op computed
                kept.values[name], kept.inner[name] = array, provenance
        for name, value in zip(candidate.output_names, sample.torch_capture.outputs,
                               strict=False):
            kept.values[name] = value.array
            kept.outputs.append(name)
        order = {output: index for index, node in enumerate(candidate.nodes)
                 for output in node.outputs}
        kept.values = dict(sorted(kept.values.items(),
                                  key=lambda item: order.get(item[0], len(order))))
        kept.op_segments = {name: tuple(node.index for node in nodes)
                            for name, nodes in sample.segments.items()}
        kept.digest = graph_digest(candidate.model, candidate.path.resolve().parent)
        source = sample.settings.prepared.source
        given = sample.settings.prepared.source != "exported here" and Path(source).is_file()
        if given:
            kept.onnx = {"path": str(Path(source).resolve())}
        else:
            kept.onnx, kept.embedded = {"member": MODEL}, embedded_onnx(candidate.path,
                                                                        self.folder)
        return kept


def _inner_values(sample: TorchSample) -> dict[str, tuple[CapturedValue, NodeInfo]]:
    """PyTorch's values inside the runtime's kernels, by ONNX value name, with their node.

    Module outputs the alignment pairs once every ONNX value is captured (one run with
    every value promoted), and op values: by their FX name where it is an ONNX value's
    (a dynamo export names its values so), a TorchScript trace's by the value its op's
    nodes end in (what the run's local reruns take as the values inside a kernel).
    Over the memory budget, none.
    """
    from bisect_onnx.align.script_inside import references_by_onnx_value
    from bisect_onnx.pytorch.op_values import OpCapture
    from bisect_onnx.pytorch.script_ops import ScriptOpCapture
    from bisect_onnx.search.inner_values import module_references

    if sample.memory_reason:
        return {}
    candidate = sample.candidate
    producers = {output: node for node in candidate.nodes for output in node.outputs}
    found: dict[str, CapturedValue] = {}
    if sample.torch_capture.values:
        every = candidate.with_promotion("all").run(sample.arrays).capture
        found.update(module_references(
            (sample.torch_capture, sample.settings.prepared.call_index), {}, candidate,
            {name: value.array for name, value in every.values.items()}))
        del every
    ops = sample.ops
    if isinstance(ops, ScriptOpCapture):  # by the value each op's nodes end in
        found.update(references_by_onnx_value(sample.segments, ops, candidate.nodes,
                                              candidate.opset))
    elif isinstance(ops, OpCapture):
        found.update({name: value for name, value in ops.values.items()})
    return {name: (value, producers[name]) for name, value in found.items()
            if name in producers}


def _inside_op(sample: TorchSample) -> dict[str, tuple[np.ndarray, RowProvenance]]:
    """PyTorch's values inside the culprit's multi-node op, where the run looked inside.

    The exporter's translation of the op evaluated on PyTorch's values, by the file's
    value names (:func:`~bisect_onnx.pipeline.inside_op.inside_op_values`): a check
    compares them as values inside a kernel, and names the node the look inside named.
    Each shown as the culprit's op.
    """
    from bisect_onnx.align.script_inside import script_inside_values
    from bisect_onnx.judge.reading import Reading
    from bisect_onnx.pipeline.inside_op import inside_op_values
    from bisect_onnx.pipeline.torch_attribution import graph_inputs
    from bisect_onnx.pytorch.script_ops import ScriptOpCapture

    report, candidate = sample.report, sample.candidate
    if report is None or report.inside_op is None or sample.values is None:
        return {}
    culprit = report.culprit
    if isinstance(sample.ops, ScriptOpCapture):  # the traced op exported alone again
        found = script_inside_values(culprit, sample.segments, sample.ops, candidate.model,
                                     opset=candidate.opset) if culprit is not None else {}
    else:
        found = inside_op_values(Reading(sample.findings), candidate,
                                 sample.settings.reference.exportable,
                                 {**sample.values.reference,
                                  **graph_inputs(candidate, sample.arrays)})
    producers = {output: node for node in candidate.nodes for output in node.outputs}
    return {name: (array, RowProvenance(
        name, producers[name].name, producers[name].op_type, culprit.torch_module,
        culprit.torch_op, culprit.source, culprit.fx_node))
        for name, array in found.items() if name in producers}


def _inner_provenance(name: str, value: CapturedValue, node: NodeInfo) -> RowProvenance:
    """What a row of this value would show (as ``make_record`` lays a row out)."""
    from bisect_onnx.graph.nodes import node_provenance

    onnx_side, torch_side = node_provenance(node, 0), value.provenance
    if torch_side.fx_node is not None:  # an op: named by the module call around it
        return RowProvenance(name, node.name, node.op_type,
                             torch_side.scopes[-1] if torch_side.scopes else "",
                             torch_side.torch_op, torch_side.source or onnx_side.source,
                             torch_side.fx_node)
    return RowProvenance(name, node.name, node.op_type, value.name, onnx_side.torch_op,
                         onnx_side.source)


