"""The driver: load, export, capture both sides, align, compare, decide.

Data flows one way; each step lives in its own module and this one only wires
them together and owns the temporary folder.
"""

from __future__ import annotations

import logging
import platform
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx import __version__
from bisect_onnx.align import Pair, align_modules
from bisect_onnx.compare import DEFAULT_ATOL, DEFAULT_RTOL, check_tolerances, compare_arrays
from bisect_onnx.engine import decide
from bisect_onnx.errors import InputError, UsageError
from bisect_onnx.exporting import EXPORTERS, call_index_from_program, export_model
from bisect_onnx.loading import (
    arrange_inputs,
    check_against_onnx,
    check_forward_count,
    forward_parameters,
)
from bisect_onnx.onnx_side import OnnxRuntimeSide
from bisect_onnx.records import Coverage, Record, Report, make_record
from bisect_onnx.scopes import detect_exporter
from bisect_onnx.sides import Capture, CapturedValue
from bisect_onnx.torch_side import TorchModuleSide, training_mode_warning

if TYPE_CHECKING:
    import onnx
    import torch

__all__ = ["bisect"]

logger = logging.getLogger(__name__)

#: One array or tensor, a sequence of them in ``forward``'s order, or a mapping from
#: ``forward``'s parameter names (or the ONNX input names) to them.
Inputs = Any


def bisect(
    model: torch.nn.Module,
    inputs: Inputs,
    *,
    onnx_model: str | Path | onnx.ModelProto | torch.onnx.ONNXProgram | None = None,
    exporter: str = "dynamo",
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    opset: int | None = None,
    save_onnx: str | Path | None = None,
    export_options: Mapping[str, Any] | None = None,
    model_label: str | None = None,
) -> Report:
    """Compare ``model`` in PyTorch with its ONNX export in ONNX Runtime, layer by layer.

    Args:
        model: The PyTorch model; its train/eval mode is used as given.
        inputs: One array or tensor, a sequence in ``forward``'s order, or a mapping
            from ``forward``'s parameter names (or the ONNX input names) to arrays.
        onnx_model: An existing export to compare against: a path, an
            ``onnx.ModelProto`` or a ``torch.onnx.ONNXProgram``. Without it the
            model is exported here with ``exporter``.
        exporter: ``dynamo`` (torch's default) or ``torchscript`` (``dynamo=False``).
        rtol: Relative tolerance; an element fails when
            ``|onnx - torch| > atol + rtol * |torch|``.
        atol: Absolute tolerance.
        opset: Opset for the export made here.
        save_onnx: Where to keep a copy of the export made here.
        export_options: More keywords for ``torch.onnx.export`` (``dynamic_shapes``...).
        model_label: How the model is named in the report (default: its class).

    Returns:
        The :class:`~bisect_onnx.records.Report`; ``report.verdict`` is ``parity``
        or ``diverged``, ``report.first_divergence`` the first failing record.
    """
    check_tolerances(rtol, atol)
    _check_options(model, onnx_model, exporter, opset, save_onnx, export_options)
    given = _as_arrays(inputs)
    reference = TorchModuleSide(model, label=model_label)
    with tempfile.TemporaryDirectory(prefix="bisect-onnx-") as workdir:
        if onnx_model is None:
            prepared = _export_here(model, given, reference, Path(workdir), exporter=exporter,
                                    opset=opset, options=export_options)
            if save_onnx is not None:
                _keep_copy(prepared.candidate.path, Path(save_onnx))
        else:
            prepared = _use_given(model, given, onnx_model, Path(workdir))
        candidate = prepared.candidate
        warnings = [text for text in [training_mode_warning(model)] if text]
        torch_capture = prepared.reference_capture or reference.run(prepared.inputs)
        logger.info("running ONNX Runtime with every value promoted")
        onnx_capture = candidate.run(prepared.inputs)
        return _compare(
            torch_capture, onnx_capture, candidate, prepared, rtol=rtol, atol=atol,
            warnings=warnings, reference_description=reference.describe(),
        )


@dataclass
class _Prepared:
    """What the comparison starts from, however the ONNX model was obtained."""

    candidate: OnnxRuntimeSide
    inputs: list[np.ndarray]
    exporter: str
    source: str
    """``exported here`` or what the user passed (a path, ``ModelProto``, ``ONNXProgram``)."""
    call_index: dict[str, dict[str, int]] = field(default_factory=dict)
    reference_capture: Capture | None = None
    warnings: list[str] = field(default_factory=list)


def _export_here(model, given, reference, folder, *, exporter, opset, options) -> _Prepared:
    names, _, _ = forward_parameters(model)
    arrays = arrange_inputs(given, forward_names=names)
    check_forward_count(arrays, model)
    # The reference runs first: a forward that fails says so more plainly than the
    # exporter, which wraps the same failure in pages of advice.
    logger.info("running the PyTorch reference")
    capture = reference.run(arrays)
    if not capture.outputs:
        raise InputError(f"{type(model).__name__}.forward returned no tensor, so there is "
                         "nothing to compare; return the tensors to check")
    exported = export_model(model, arrays, folder, exporter=exporter, opset=opset,
                            options=options)
    candidate = OnnxRuntimeSide(exported.path)
    check_against_onnx(arrays, candidate.inputs)
    prepared = _Prepared(candidate, arrays, exporter, "exported here", exported.call_index,
                         capture)
    if opset is not None and candidate.opset != opset:
        prepared.warnings.append(f"asked for opset {opset}, but the {exporter} exporter "
                                 f"produced opset {candidate.opset}")
    return prepared


def _use_given(model, given, onnx_model, folder) -> _Prepared:
    path, source = _onnx_path(onnx_model, folder)
    candidate = OnnxRuntimeSide(path)
    names, _, _ = forward_parameters(model)
    arrays = arrange_inputs(given, forward_names=names,
                            onnx_names=[spec.name for spec in candidate.inputs])
    check_against_onnx(arrays, candidate.inputs)
    # An ONNXProgram still knows its ExportedProgram, and so which call of a reused
    # module each node ran in.
    call_index = call_index_from_program(getattr(onnx_model, "exported_program", None))
    return _Prepared(candidate, arrays, detect_exporter(candidate.nodes), source, call_index)


def _compare(
    torch_capture: Capture,
    onnx_capture: Capture,
    candidate: OnnxRuntimeSide,
    prepared: _Prepared,
    *,
    rtol: float,
    atol: float,
    warnings: list[str],
    reference_description: dict[str, Any],
) -> Report:
    alignment = align_modules(torch_capture, candidate.nodes, onnx_capture.values,
                              call_index=prepared.call_index)
    pairs = sorted(alignment.pairs, key=lambda pair: (
        pair.candidate.provenance.position, pair.reference.provenance.position))
    comparisons = [
        make_record(index, pair, compare_arrays(
            pair.reference.array, pair.candidate.array, rtol=rtol, atol=atol))
        for index, pair in enumerate(pairs)
    ]
    warnings = warnings + prepared.warnings
    final_outputs = _compare_outputs(torch_capture.outputs, onnx_capture.outputs,
                                     rtol=rtol, atol=atol, warnings=warnings)
    decision = decide(comparisons, final_outputs)
    if prepared.exporter == "unknown":
        warnings.append(
            "the ONNX graph carries neither torch exporter metadata nor TorchScript-style "
            "node names, so no layer could be aligned: only the final outputs were "
            "compared (let bisect-onnx export the model, or pass the exporter's own file)"
        )
    elif not pairs:
        warnings.append("no intermediate value could be aligned: only the final outputs "
                        "were compared, which says nothing about where a divergence starts")
    return Report(
        verdict=decision.verdict,
        rtol=rtol,
        atol=atol,
        environment=_environment(candidate, prepared.exporter),
        reference=reference_description,
        candidate={**candidate.describe(), "model": prepared.source},
        first_divergence=decision.first_divergence,
        final_outputs=final_outputs,
        comparisons=comparisons,
        hidden_divergences=decision.hidden_divergences,
        coverage=Coverage(
            onnx_values=len(onnx_capture.values),
            aligned_values=len({pair.candidate.name for pair in pairs}),
            torch_modules=alignment.module_calls,
            aligned_modules=alignment.aligned_calls,
        ),
        unaligned=alignment.unaligned,
        warnings=warnings,
        note=decision.note,
    )


def _compare_outputs(
    torch_outputs: Sequence[CapturedValue],
    onnx_outputs: Sequence[CapturedValue],
    *,
    rtol: float,
    atol: float,
    warnings: list[str],
) -> list[Record]:
    """The final outputs, always compared, aligned or not (pairs by position)."""
    if len(torch_outputs) != len(onnx_outputs):
        warnings.append(
            f"PyTorch returned {len(torch_outputs)} tensor output(s) and the ONNX graph has "
            f"{len(onnx_outputs)}: only the first {min(len(torch_outputs), len(onnx_outputs))} "
            "were compared"
        )
    return [
        make_record(index, Pair(ref, cand),
                    compare_arrays(ref.array, cand.array, rtol=rtol, atol=atol), final=True)
        for index, (ref, cand) in enumerate(zip(torch_outputs, onnx_outputs, strict=False))
    ]


def _check_options(model, onnx_model, exporter, opset, save_onnx, export_options) -> None:
    """Refuse option combinations that cannot mean anything, before any slow step."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise InputError(f"model must be a torch.nn.Module, got {type(model).__name__}; "
                         "wrap a function in an nn.Module whose forward calls it")
    if exporter not in EXPORTERS:
        raise UsageError(f"unknown exporter {exporter!r}; choose one of {', '.join(EXPORTERS)}")
    if onnx_model is not None:
        ignored = [name for name, value in (("opset", opset), ("save_onnx", save_onnx),
                                            ("export_options", export_options))
                   if value is not None]
        if ignored:
            raise UsageError(f"{' and '.join(ignored)} apply to an export made here; "
                             "drop them when comparing an existing ONNX model")


def _as_arrays(inputs: Inputs) -> list[np.ndarray] | dict[str, np.ndarray]:
    """Accept arrays, tensors, sequences and mappings of them; always numpy out."""
    if isinstance(inputs, Mapping):
        return {str(key): _to_array(value) for key, value in inputs.items()}
    if isinstance(inputs, (list, tuple)):
        return [_to_array(value) for value in inputs]
    return [_to_array(inputs)]


def _to_array(value: Any) -> np.ndarray:
    # A torch.Tensor, recognised without importing torch.
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        return value.detach().cpu().numpy()
    array = np.asarray(value)
    # Big-endian data (saved on another machine) is fine for numpy, not for torch or ORT.
    return array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))


def _onnx_path(onnx_model: Any, folder: Path) -> tuple[Path, str]:
    """A path ORT can read, and how to name the model in the report."""
    if isinstance(onnx_model, (str, Path)):
        return Path(onnx_model), str(onnx_model)
    import onnx

    path = folder / "given.onnx"
    if isinstance(onnx_model, onnx.ModelProto):
        onnx.save(onnx_model, str(path))
        return path, "(onnx.ModelProto)"
    if hasattr(onnx_model, "model_proto") and hasattr(onnx_model, "save"):
        onnx_model.save(str(path))  # a torch.onnx.ONNXProgram, external data included
        return path, "(torch.onnx.ONNXProgram)"
    raise InputError(f"onnx_model must be a path, an onnx.ModelProto or a "
                     f"torch.onnx.ONNXProgram, got {type(onnx_model).__name__}")


def _keep_copy(exported: Path, target: Path) -> None:
    """Copy the export to where the user asked, its weights inline or beside it."""
    import onnx

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if [path.name for path in exported.parent.iterdir()] == [exported.name]:
            shutil.copyfile(exported, target)
            return
        # External data: name the data file after the target, so nothing else is overwritten.
        model = onnx.load(str(exported))
        onnx.save(model, str(target), save_as_external_data=True,
                  location=f"{target.name}.data")
    except OSError as error:
        raise InputError(f"cannot save the ONNX export to {target}: {error.strerror}; "
                         "choose a writable path for --save-onnx") from error


def _environment(candidate: OnnxRuntimeSide, exporter: str) -> dict[str, Any]:
    import onnx
    import onnxruntime
    import torch

    return {
        "bisect_onnx": __version__,
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "provider": candidate.provider,
        "opt_level": candidate.opt_level,
        "exporter": exporter,
        "opset": candidate.opset,
    }
