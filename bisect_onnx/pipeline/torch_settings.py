"""What every sample of one PyTorch-form run shares: :class:`Settings`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bisect_onnx.judge.compare import DEFAULT_ATOL, DEFAULT_RTOL
from bisect_onnx.judge.tolerance_judge import ToleranceJudge
from bisect_onnx.judge.tolerances import precision_of
from bisect_onnx.pipeline.options import ExportOptions, FixOptions
from bisect_onnx.pipeline.prepare import PreparedCandidate
from bisect_onnx.pytorch.parking import WeightParking
from bisect_onnx.pytorch.reference import TorchReference
from bisect_onnx.runtime.registry import display_name
from bisect_onnx.runtime.runner import Runner
from bisect_onnx.sources.input_sizes import Budget

__all__ = ["Settings", "computed_precision"]

#: A compiling runtime's inference precision, by the name of its tolerance defaults.
_RUNTIME_PRECISION = {"bf16": "bfloat16", "f16": "float16"}


@dataclass
class Settings:
    """What every sample of one PyTorch-form run shares."""

    reference: TorchReference
    prepared: PreparedCandidate
    export: ExportOptions
    workdir: Path
    """The run's temporary folder (a template export for a foreign file goes there)."""
    judge: ToleranceJudge = field(
        default_factory=lambda: ToleranceJudge.from_floats(DEFAULT_RTOL, DEFAULT_ATOL))
    """Every value's tolerance: the base, and the user's per-value rules."""
    granularity: str | None = None
    all_culprits: bool = False
    budget: int | None = None
    """Memory the captured values of both sides may take; ``None``: unknown."""
    input_budget: Budget | None = None
    """What one sample's inputs may take (``--max-memory``, else most of the memory)."""
    parking: WeightParking = field(default_factory=lambda: WeightParking(None, Path()))
    """Where a large model's weights wait while ONNX Runtime holds its copy."""
    fixes: FixOptions = field(default_factory=FixOptions)
    tolerance_basis: str | None = None
    """Why the tolerance is not float32's, where the candidate computes in less."""
    sweep: bool = False
    """Sweep shapes and input scales from the sample before bisecting (``--sweep``)."""

    @property
    def rtol(self) -> float:
        """The base relative tolerance (a value without a rule of its own)."""
        return self.judge.base.rtol

    @property
    def atol(self) -> float:
        """The base absolute tolerance."""
        return self.judge.base.atol


def computed_precision(candidate: Runner) -> tuple[str, str | None]:
    """The precision the candidate computes in (its tolerance defaults), and why.

    The file's, where it is float16 or bfloat16; else the runtime's, where it computes
    a float32 file in less (OpenVINO's default on a CPU with bfloat16: ``bf16``).
    """
    file = precision_of(candidate.model)
    if file in ("float16", "bfloat16"):
        return file, f"{file} defaults: the ONNX file computes in {file}"
    runtime = _RUNTIME_PRECISION.get(candidate.precision or "")
    if runtime is None:
        return "float32", None
    return runtime, (f"{runtime} defaults: {display_name(candidate.runtime)} computes in "
                     f"{candidate.precision} here (its inference precision; "
                     "--ov-precision f32 to compute and compare in float32)")
