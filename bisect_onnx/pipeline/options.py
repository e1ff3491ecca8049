"""The options of a run, each object checking itself once for every caller.

The CLI, the Python API and the pytest plugin build the same objects, so a bad value
gets the same one-line error whichever way it came in. Each object also owns its
command-line options: ``add_arguments`` adds them to the parser (with the help text
``--help`` shows), ``from_args`` builds the object from the parsed namespace, so the
mapping from flags to fields lives in one place.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bisect_onnx.errors import UsageError
from bisect_onnx.judge.compare import DEFAULT_ATOL, DEFAULT_RTOL, check_tolerances
from bisect_onnx.runtime.memory import default_budget, parse_size
from bisect_onnx.runtime.onnxruntime.sessions import CPU_PROVIDER, DEFAULT_OPT_LEVEL, OPT_LEVELS
from bisect_onnx.runtime.registry import (
    ONNXRUNTIME,
    OV_PRECISIONS,
    check_settings,
    make_runner,
    runtime_names,
)
from bisect_onnx.runtime.runner import PROMOTE_CHOICES, Runner, RunnerSettings
from bisect_onnx.sources.input_sizes import check_sample_count

if TYPE_CHECKING:
    # What add_arguments takes: the parser itself (its main group) or one of its groups.
    from argparse import _ActionsContainer as Arguments

    from bisect_onnx.judge.tolerance_judge import ToleranceJudge
    from bisect_onnx.judge.tolerances import ToleranceRule

__all__ = ["Tolerance", "ExportOptions", "RuntimeOptions", "RandomInputs", "SearchOptions",
           "OutputOptions", "FixOptions"]


@dataclass(frozen=True)
class Tolerance:
    """When a value fails: ``|candidate - reference| > atol + rtol * |reference|``.

    ``None`` for ``rtol`` or ``atol`` is the default: ``DEFAULT_RTOL`` and
    ``DEFAULT_ATOL`` against PyTorch; against another ONNX model, by the narrower
    precision of the two (float16 and bfloat16 looser than float32).
    """

    rtol: float | None = None
    atol: float | None = None
    rules: str | Path | Mapping[str, tuple[float, float]] | None = None
    """Per-value tolerances: a file of ``PATTERN RTOL ATOL`` lines or a mapping
    ``{pattern: (rtol, atol)}`` (fnmatch patterns on ONNX value names, and against
    PyTorch on op and module names); the first match wins, the rest get rtol/atol."""

    def __post_init__(self) -> None:
        for name in ("rtol", "atol"):
            if getattr(self, name) is not None:
                check_tolerances(**{"rtol": 0.0, "atol": 0.0, name: getattr(self, name)})
        if isinstance(self.rules, Mapping):  # a file is read when the run needs it
            self.per_value()

    @classmethod
    def of(cls, tolerance: Tolerance | tuple[float, float] | None) -> Tolerance:
        """What the API's ``tolerance`` takes: a ``Tolerance``, an ``(rtol, atol)`` pair, None."""
        if tolerance is None:
            return cls()
        if isinstance(tolerance, Tolerance):
            return tolerance
        if isinstance(tolerance, tuple | list) and len(tolerance) == 2:
            return cls(*tolerance)
        raise UsageError(f"tolerance must be a Tolerance, an (rtol, atol) pair or None, got "
                         f"{tolerance!r}; for example tolerance=(1e-3, 1e-5)")

    def per_value(self) -> list[ToleranceRule]:
        """The per-value rules (a tolerance file is read here)."""
        from bisect_onnx.judge.tolerances import tolerance_rules

        return tolerance_rules(self.rules)

    def judge(self, precision: str = "float32") -> ToleranceJudge:
        """The judge of a run against PyTorch: the defaults filled in, the rules read.

        ``precision``: what the candidate computes in (``float16``, ``bfloat16``: see
        :data:`~bisect_onnx.judge.tolerances.PRECISION_DEFAULTS`); an rtol or atol left
        ``None`` takes that precision's default.
        """
        from bisect_onnx.judge.tolerance_judge import ToleranceJudge
        from bisect_onnx.judge.tolerances import PRECISION_DEFAULTS

        defaults = PRECISION_DEFAULTS.get(precision, PRECISION_DEFAULTS["float32"])
        return ToleranceJudge.from_floats(
            defaults.rtol if self.rtol is None else self.rtol,
            defaults.atol if self.atol is None else self.atol, self.per_value())

    def follows_precision(self) -> bool:
        """Whether an rtol or atol is left to the candidate's precision."""
        return self.rtol is None or self.atol is None

    @staticmethod
    def add_arguments(parser: Arguments) -> None:
        """``--rtol``, ``--atol``, ``--tolerances``."""
        parser.add_argument("--rtol", type=float, default=None,
                            help=f"relative tolerance (default {DEFAULT_RTOL:g}; by the "
                            "candidate's precision where it computes in float16 or "
                            "bfloat16, and with --against* by the models')")
        parser.add_argument("--atol", type=float, default=None,
                            help=f"absolute tolerance (default {DEFAULT_ATOL:g}; by the "
                            "candidate's precision where it computes in float16 or "
                            "bfloat16, and with --against* by the models')")
        parser.add_argument("--tolerances", type=Path, metavar="FILE",
                            help="per-value tolerances: lines of 'PATTERN RTOL ATOL' (fnmatch "
                            "patterns on ONNX value names, and on op and module names with a "
                            "PyTorch MODEL; the first match wins)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Tolerance:
        """The tolerance the command line gives."""
        return cls(rtol=args.rtol, atol=args.atol, rules=args.tolerances)


@dataclass(frozen=True)
class ExportOptions:
    """How bisect-onnx exports the model when no ONNX model is given."""

    exporter: str | None = None
    """``dynamo`` (torch's default) or ``torchscript`` (``dynamo=False``); ``None``
    picks dynamo, or torchscript for a TorchScript model, which dynamo cannot take."""
    opset: int | None = None
    dynamic_batch: bool = False
    """Export dimension 0 of every input as dynamic."""
    save_to: str | Path | None = None
    """Keep a copy of the export there."""
    torch_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """More keywords for ``torch.onnx.export`` (``custom_translation_table``, ...)."""

    @staticmethod
    def add_arguments(parser: Arguments) -> None:
        """``--exporter``, ``--opset``, ``--dynamic``, ``--save-onnx``."""
        from bisect_onnx.pytorch.exporting import EXPORTERS

        parser.add_argument("--exporter", choices=EXPORTERS,
                            help="exporter for the export made here: dynamo (the default, as "
                            "in torch.onnx.export) or torchscript (dynamo=False; the default "
                            "for a TorchScript MODEL)")
        parser.add_argument("--opset", type=int, metavar="N", help="opset for the export")
        parser.add_argument("--dynamic", action="store_true",
                            help="export dimension 0 (the batch) of every input as dynamic")
        parser.add_argument("--save-onnx", type=Path, metavar="PATH",
                            help="keep a copy of the export made by bisect-onnx")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ExportOptions | None:
        """The export the command line asks for; ``None`` with ``--onnx`` (nothing to export).

        Export options beside ``--onnx`` are refused, naming them as they were given.
        """
        given = {"--exporter": args.exporter, "--opset": args.opset,
                 "--save-onnx": args.save_onnx, "--dynamic": args.dynamic or None}
        if args.onnx is None:
            return cls(exporter=args.exporter, opset=args.opset, dynamic_batch=args.dynamic,
                       save_to=args.save_onnx)
        used = [option for option, value in given.items() if value is not None]
        if used:
            them, apply = ("them", "apply") if len(used) > 1 else ("it", "applies")
            raise UsageError(f"{', '.join(used)} {apply} to an export made here; drop {them} "
                             "with --onnx")
        return None


@dataclass(frozen=True)
class RuntimeOptions:
    """Which runtime runs the ONNX model under test, and how."""

    provider: str = CPU_PROVIDER
    opt_level: str = DEFAULT_OPT_LEVEL
    """``disabled``, ``basic``, ``extended`` or ``all`` (ONNX Runtime's default)."""
    promote: str = "fused"
    """``fused``: capture only the values production's optimized graph (ONNX Runtime)
    or compiled model (OpenVINO) keeps, so the capture runs the production kernels
    (checked); ``all``: every node output."""
    max_memory: int | str | None = None
    """Memory the captured values of both sides may take (bytes, or ``"2GB"``); over
    it, values are probed a few at a time. ``None``: most of the memory available."""
    runtime: str = ONNXRUNTIME
    """``onnxruntime`` or ``openvino`` (CPU; ``pip install bisect-onnx[openvino]``)."""
    precision: str | None = None
    """OpenVINO's ``INFERENCE_PRECISION_HINT``: ``f32``, ``f16`` or ``bf16``; ``None``
    keeps OpenVINO's default for the CPU (bf16 where the CPU has it)."""

    def __post_init__(self) -> None:
        # One-line errors for settings that cannot work, before anything is exported.
        check_settings(self.runtime, self.settings())
        if self.max_memory is not None:
            parse_size(self.max_memory)

    def budget(self) -> int | None:
        """The memory budget in bytes; ask once the model is loaded (it takes memory)."""
        if self.max_memory is None:
            return default_budget()
        return parse_size(self.max_memory)

    def runs_like(self, other: RuntimeOptions) -> bool:
        """Whether a model runs the same way under ``other`` (the same runtime, settings)."""
        return all(getattr(self, name) == getattr(other, name)
                   for name in ("runtime", "provider", "opt_level", "precision"))

    def settings(self, *, promote: str | None = None) -> RunnerSettings:
        """What the runtime is asked to run with (``promote`` overriding the options')."""
        return RunnerSettings(provider=self.provider, opt_level=self.opt_level,
                              promote=promote or self.promote, precision=self.precision)

    def runner(self, path: Path, *, promote: str | None = None) -> Runner:
        """The runner of the ONNX file at ``path`` in this runtime, as these options say.

        ``promote`` overrides the options' own (a reference promotes every value).
        """
        return make_runner(self.runtime, path, self.settings(promote=promote))

    @staticmethod
    def add_arguments(parser: Arguments) -> None:
        """The runtime's options: ``--runtime`` ... ``--max-memory``."""
        parser.add_argument("--runtime", choices=runtime_names(), default=ONNXRUNTIME,
                            help="runtime that runs the ONNX model: onnxruntime (default) or "
                            "openvino (CPU; pip install bisect-onnx[openvino])")
        parser.add_argument("--ov-precision", choices=OV_PRECISIONS, default=None,
                            help="OpenVINO's inference precision (INFERENCE_PRECISION_HINT; "
                            "default: OpenVINO's own for the CPU, bf16 where it has it)")
        parser.add_argument("--provider", default=CPU_PROVIDER, metavar="NAME",
                            help=f"ONNX Runtime execution provider (default {CPU_PROVIDER})")
        parser.add_argument("--opt-level", choices=tuple(OPT_LEVELS),
                            default=DEFAULT_OPT_LEVEL,
                            help="ONNX Runtime graph optimization level (default all, as "
                            "ONNX Runtime's own default)")
        parser.add_argument("--promote", choices=PROMOTE_CHOICES, default="fused",
                            help="fused (default): capture only the values that survive the "
                            "runtime's fusions, so the production kernels run; all: every "
                            "node output, which changes what the runtime fuses")
        parser.add_argument("--max-memory", metavar="SIZE",
                            help="memory the captured values of both sides may take (512MB, "
                            "2GiB); over it, ONNX Runtime's values are probed a few at a time "
                            "by bisection (default: 80%% of the memory available)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RuntimeOptions:
        """The runtime settings the command line gives."""
        return cls(provider=args.provider, opt_level=args.opt_level, promote=args.promote,
                   max_memory=args.max_memory, runtime=args.runtime,
                   precision=args.ov_precision)


@dataclass(frozen=True)
class RandomInputs:
    """Inputs drawn from the ONNX graph's input specification: pass it as ``inputs``."""

    seed: int = 0
    dims: Mapping[str, int] = field(default_factory=dict)
    """Values of the graph's named free dimensions (``{"sequence": 128}``)."""
    samples: int = 1
    """How many inputs to try; the report is the worst one's."""

    def __post_init__(self) -> None:
        samples = self.samples
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise UsageError(f"samples must be a whole number >= 1, got {samples!r}")
        check_sample_count(samples)

    @staticmethod
    def add_arguments(parser: Arguments) -> None:
        """``--seed``, ``--dim``, ``--samples``."""
        # (No defaults here: a value given is told from none, and refused beside --input.)
        parser.add_argument("--seed", type=int, help="seed of random inputs (default 0)")
        parser.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                            help="value of a named free dimension, for random inputs (repeat)")
        parser.add_argument("--samples", type=int, metavar="N",
                            help="try N random inputs and report the worst (default 1)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RandomInputs:
        """The random-input settings the command line gives (refused beside ``--input``)."""
        from bisect_onnx.sources.random_inputs import parse_dim_options

        given = [flag for flag, value in (("--seed", args.seed), ("--dim", args.dim or None),
                                          ("--samples", args.samples)) if value is not None]
        if args.input and given:  # they cannot change the inputs given (their defaults too)
            raise UsageError(f"seed, dims and samples (--seed, --dim, --samples) apply to random "
                             f"inputs: drop {', '.join(given)}, or drop the given inputs")
        return cls(seed=cls.seed if args.seed is None else args.seed, dims=parse_dim_options(
            args.dim), samples=cls.samples if args.samples is None else args.samples)


@dataclass(frozen=True)
class SearchOptions:
    """How the divergence is searched for and how finely the table is cut."""

    granularity: str | None = None
    """``op`` (a row per ATen op) or ``module`` (a row per module call); ``None``: op
    where the dynamo exporter's program is at hand (an export made here, an
    ONNXProgram, a .pt2), else op level only once a value diverges. PyTorch only."""
    all_culprits: bool = False
    """Check every failing value on the reference's inputs and list each one that
    introduces error (``report.culprits``), not only the first."""
    sweep: bool = False
    """From the one sample, try the graph's free dimensions at other sizes and the inputs
    at other scales and signs, comparing final outputs only until one combination
    fails, and bisect that one (``report.sweep`` holds the table)."""

    def __post_init__(self) -> None:
        from bisect_onnx.align.op_level import GRANULARITIES

        if self.granularity is not None and self.granularity not in GRANULARITIES:
            raise UsageError(f"unknown granularity {self.granularity!r}; choose one of "
                             f"{', '.join(GRANULARITIES)}")

    @staticmethod
    def add_arguments(parser: Arguments) -> None:
        """``--granularity``, ``--all-culprits``, ``--sweep``."""
        from bisect_onnx.align.op_level import GRANULARITIES

        parser.add_argument("--granularity", choices=GRANULARITIES, default=None,
                            help="table rows: one per ATen op (the default where a dynamo "
                            "export's program names the ONNX values) or one per module call")
        parser.add_argument("--all-culprits", action="store_true",
                            help="check every failing value on PyTorch's inputs and list each "
                            "one that introduces error, not only the first")
        parser.add_argument("--sweep", action="store_true",
                            help="from the one sample, try the free dimensions at other sizes "
                            "(1, 2, the sample's, a prime, the largest that fits) and the "
                            "inputs at other scales and signs, final outputs only, until one "
                            "fails; print the table and bisect that one")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SearchOptions:
        """The search settings the command line gives."""
        return cls(granularity=args.granularity, all_culprits=args.all_culprits,
                   sweep=args.sweep)


@dataclass(frozen=True)
class OutputOptions:
    """What a diverging run writes, and how it names the model."""

    repro_dir: str | Path | None = None
    """On divergence, write a standalone repro of the first divergence there (see each
    function for its layout)."""
    label: str | None = None
    """How the model is named in the report and messages (and, in ``assert_parity``, its
    files); ``None``: the path given, or the model's class."""

    @staticmethod
    def add_arguments(parser: Arguments) -> None:
        """``--repro-dir`` (the label is MODEL as given)."""
        parser.add_argument("--repro-dir", type=Path, metavar="DIR",
                            help="on divergence, write a minimal standalone repro of the first "
                            "divergence (ONNX segment, inputs, expected outputs, repro.py)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> OutputOptions:
        """Where the command line's repro goes; the model named as it was given."""
        return cls(repro_dir=args.repro_dir, label=args.model)


@dataclass(frozen=True)
class FixOptions:
    """Whether to search for a fix of the culprit, and where the fixed model goes."""

    suggest: bool = False
    """For the culprit's class, try candidate fixes on a copy and rerun the comparison;
    ``report.fixes`` lists each, checked (only those that reach parity are fixes)."""
    write_fixed: str | Path | None = None
    """Write the best fix's fixed ONNX model there (never onto an input file)."""

    @staticmethod
    def add_arguments(parser: Arguments) -> None:
        """``--suggest-fix``, ``--write-fixed``."""
        parser.add_argument("--suggest-fix", action="store_true",
                            help="try fixes for the culprit's class on a copy, rerun the "
                            "comparison and report each fix the rerun checked")
        parser.add_argument("--write-fixed", type=Path, metavar="PATH",
                            help="with --suggest-fix: write the best fix's fixed ONNX model "
                            "to PATH (never onto an input file)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> FixOptions:
        """The fix settings the command line gives (``--write-fixed`` implies a search)."""
        return cls(suggest=bool(args.suggest_fix or args.write_fixed),
                   write_fixed=args.write_fixed)

    @classmethod
    def of(cls, suggest_fix: bool | FixOptions | None) -> FixOptions:
        """The options from ``suggest_fix=True`` or an option object."""
        if isinstance(suggest_fix, FixOptions):
            return suggest_fix
        return cls(suggest=bool(suggest_fix))
