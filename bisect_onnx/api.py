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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx import __version__
from bisect_onnx.align import align_modules
from bisect_onnx.compare import DEFAULT_ATOL, DEFAULT_RTOL, check_tolerances, compare_arrays
from bisect_onnx.engine import decide
from bisect_onnx.errors import InputError
from bisect_onnx.exporting import export_dynamo
from bisect_onnx.loading import (
    arrange_inputs,
    check_against_onnx,
    check_forward_count,
    forward_parameters,
)
from bisect_onnx.onnx_side import OnnxRuntimeSide
from bisect_onnx.records import Coverage, Record, Report, make_record
from bisect_onnx.torch_side import TorchModuleSide, training_mode_warning

if TYPE_CHECKING:
    import torch

__all__ = ["bisect"]

logger = logging.getLogger(__name__)

Inputs = Any | Sequence[Any] | Mapping[str, Any]
#: A path, an ``onnx.ModelProto`` or a ``torch.onnx.ONNXProgram``.
OnnxModel = Any


def bisect(
    model: torch.nn.Module,
    inputs: Inputs,
    *,
    onnx_model: OnnxModel | None = None,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    opset: int | None = None,
    save_onnx: str | Path | None = None,
    model_label: str | None = None,
) -> Report:
    """Compare ``model`` in PyTorch with its ONNX export in ONNX Runtime, layer by layer.

    Args:
        model: The PyTorch model; its train/eval mode is used as given.
        inputs: One array or tensor, a sequence in ``forward``'s order, or a mapping
            from ``forward``'s parameter names (or the ONNX input names) to arrays.
        onnx_model: An existing export to compare against: a path, an
            ``onnx.ModelProto`` or a ``torch.onnx.ONNXProgram``.
            Without it the model is exported with the dynamo exporter.
        rtol: Relative tolerance; an element fails when
            ``|onnx - torch| > atol + rtol * |torch|``.
        atol: Absolute tolerance.
        opset: Opset for the export (ignored with ``onnx_model``).
        save_onnx: Where to keep a copy of the export made here.
        model_label: How the model is named in the report (default: its class).

    Returns:
        The :class:`~bisect_onnx.records.Report`; ``report.verdict`` is ``parity``
        or ``diverged``, ``report.first_divergence`` the first failing record.
    """
    check_tolerances(rtol, atol)
    forward_names, _, _ = forward_parameters(model)
    with tempfile.TemporaryDirectory(prefix="bisect-onnx-") as workdir:
        folder = Path(workdir)
        call_index = None
        reference = TorchModuleSide(model, label=model_label)
        torch_capture = None
        if onnx_model is None:
            arrays = arrange_inputs(_as_arrays(inputs), forward_names=forward_names)
            check_forward_count(arrays, model)
            # The reference runs first: a forward that fails says so more plainly than
            # the exporter, which wraps the same failure in pages of advice.
            logger.info("running the PyTorch reference")
            torch_capture = reference.run(arrays)
            exported = export_dynamo(model, arrays, folder, opset=opset)
            onnx_path, call_index, exporter = exported.path, exported.call_index, "dynamo"
            if save_onnx is not None:
                _keep_copy(onnx_path, Path(save_onnx))
        else:
            onnx_path, exporter = _onnx_path(onnx_model, folder), "given"
        candidate = OnnxRuntimeSide(onnx_path)
        if onnx_model is not None:
            arrays = arrange_inputs(
                _as_arrays(inputs),
                forward_names=forward_names,
                onnx_names=[spec.name for spec in candidate.inputs],
            )
        check_against_onnx(arrays, candidate.inputs)

        warnings = [text for text in [training_mode_warning(model)] if text]
        if torch_capture is None:
            logger.info("running the PyTorch reference")
            torch_capture = reference.run(arrays)
        logger.info("running ONNX Runtime with every value promoted")
        onnx_capture = candidate.run(arrays)

        alignment = align_modules(
            torch_capture, candidate.nodes, onnx_capture.values, call_index=call_index
        )
        pairs = sorted(alignment.pairs, key=lambda pair: (
            pair.candidate.provenance.position, pair.reference.provenance.position))
        comparisons = [
            make_record(index, pair, compare_arrays(
                pair.reference.array, pair.candidate.array, rtol=rtol, atol=atol))
            for index, pair in enumerate(pairs)
        ]
        final_outputs = _compare_outputs(torch_capture.outputs, onnx_capture.outputs,
                                         rtol=rtol, atol=atol, warnings=warnings)
        decision = decide(comparisons, final_outputs)

        if not candidate.has_torch_metadata:
            warnings.append(
                "the ONNX graph carries no torch exporter metadata, so no layer could be "
                "aligned: only the final outputs were compared (export with "
                "torch.onnx.export(..., dynamo=True), or let bisect-onnx export)"
            )
        elif not pairs:
            warnings.append("no intermediate value could be aligned: only the final outputs "
                            "were compared, which says nothing about where a divergence starts")

        environment = _environment(candidate, exporter)
        return Report(
            verdict=decision.verdict,
            rtol=rtol,
            atol=atol,
            environment=environment,
            reference=reference.describe(),
            candidate={**candidate.describe(),
                       "model": str(onnx_model) if exporter == "given" else "(exported)"},
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


def _compare_outputs(torch_outputs, onnx_outputs, *, rtol: float, atol: float,
                     warnings: list[str]) -> list[Record]:
    """The final outputs, always compared, aligned or not (pairs by position)."""
    from bisect_onnx.align import Pair

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
    return np.asarray(value)


def _onnx_path(onnx_model: OnnxModel, folder: Path) -> Path:
    """A path ORT can read; an in-memory model is saved into our temporary folder."""
    if isinstance(onnx_model, (str, Path)):
        return Path(onnx_model)
    import onnx

    path = folder / "given.onnx"
    if isinstance(onnx_model, onnx.ModelProto):
        onnx.save(onnx_model, str(path))
    elif hasattr(onnx_model, "model_proto") and hasattr(onnx_model, "save"):
        onnx_model.save(str(path))  # a torch.onnx.ONNXProgram, external data included
    else:
        raise InputError(f"onnx_model must be a path, an onnx.ModelProto or a "
                         f"torch.onnx.ONNXProgram, got {type(onnx_model).__name__}")
    return path


def _keep_copy(exported: Path, target: Path) -> None:
    """Copy the export (and its external data, if any) to where the user asked."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(exported, target)
        for extra in exported.parent.iterdir():
            if extra != exported and extra.name.startswith(exported.name):
                shutil.copyfile(extra, target.parent / extra.name)
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
