"""The command line's ONNX-against-ONNX form: MODEL is the reference ``.onnx``."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from bisect_onnx.errors import UsageError
from bisect_onnx.pipeline.options import (
    FixOptions,
    OutputOptions,
    RandomInputs,
    RuntimeOptions,
    SearchOptions,
    Tolerance,
)
from bisect_onnx.sources.file_kinds import looks_like_onnx, read_head
from bisect_onnx.sources.input_samples import load_input_samples

if TYPE_CHECKING:
    from bisect_onnx.judge.records import Report

__all__ = ["add_against_options", "against_requested", "bisect_from_args"]

# Options of the PyTorch form that mean nothing when two ONNX models are compared.
_TORCH_ONLY_OPTIONS = {"onnx": "--onnx", "exporter": "--exporter", "opset": "--opset",
                       "dynamic": "--dynamic", "save_onnx": "--save-onnx",
                       "granularity": "--granularity", "trust_pickle": "--trust-pickle",
                       "max_memory": "--max-memory"}


def against_requested(args: argparse.Namespace) -> bool:
    """Whether the command line asks for an ONNX-against-ONNX comparison."""
    return bool(args.against is not None or args.against_opt_level is not None
                or args.against_provider is not None or args.against_reference_evaluator
                or args.against_runtime is not None)


def bisect_from_args(args: argparse.Namespace) -> Report:
    """Run the ONNX-against-ONNX form from parsed CLI arguments (MODEL is the reference)."""
    import bisect_onnx

    given = [option for name, option in _TORCH_ONLY_OPTIONS.items()
             if getattr(args, name, None) not in (None, False)]
    if given:
        verb = "applies" if len(given) == 1 else "apply"
        raise UsageError(f"{', '.join(given)} {verb} to a PyTorch MODEL; drop them when "
                         "comparing two ONNX models")
    model = Path(args.model)
    head = b"" if _names_a_factory(args.model) and not model.exists() else read_head(
        model, 16, label="MODEL file", expected="an .onnx file")
    if not looks_like_onnx(head):
        raise UsageError(f"--against, --against-opt-level, --against-provider, "
                         f"--against-runtime and --against-reference-evaluator compare two "
                         f"ONNX models, and MODEL {args.model} is not an ONNX file; pass "
                         "the reference .onnx as MODEL (a PyTorch MODEL is compared with "
                         "--onnx FILE)")
    from bisect_onnx.pipeline.onnx_vs_onnx import REFERENCE_EVALUATOR

    # --runtime, --provider and --opt-level are the reference's, and the candidate's
    # unless its own --against-* say otherwise; --promote is the candidate's (the
    # reference promotes every value).
    reference_runtime, candidate_runtime = _side_runtimes(args)
    random_inputs = RandomInputs.from_args(args)
    from bisect_onnx.fixes.stage import check_write_fixed

    # Before anything runs: the fixed model is never written over a file the run reads.
    check_write_fixed(args.write_fixed, (model, args.against, *args.input, args.tolerances))
    inputs = load_input_samples(args.input, onnx_model=model) if args.input else None
    options = {"reference_runtime": (REFERENCE_EVALUATOR if args.against_reference_evaluator
                                     else reference_runtime),
               "candidate_runtime": candidate_runtime, "tolerance": Tolerance.from_args(args),
               "search": SearchOptions.from_args(args), "output": OutputOptions.from_args(args),
               "suggest_fix": FixOptions.from_args(args)}
    inputs = inputs if inputs is not None else random_inputs
    if args.record is not None:  # the comparison, and the reference's values for a check
        from bisect_onnx.reference.onnx_recording import record_onnx_with_report

        return record_onnx_with_report(model, args.against, inputs, path=args.record,
                                       command=getattr(args, "recording_command", None),
                                       **options)[0]
    return bisect_onnx.bisect_onnx_models(model, args.against, inputs, **options)


def _side_runtimes(args: argparse.Namespace) -> tuple[RuntimeOptions, RuntimeOptions]:
    """The reference's and the candidate's runtime options from the command line.

    ``--ov-precision`` goes to the side (or sides) OpenVINO runs; ``--provider`` and
    ``--opt-level`` to those ONNX Runtime runs.
    """
    from bisect_onnx.runtime.registry import OPENVINO

    names = (args.runtime, args.against_runtime or args.runtime)
    if args.ov_precision is not None and OPENVINO not in names or (
            names == (OPENVINO, OPENVINO)):
        RuntimeOptions.from_args(args)  # its one-line errors (a precision without OpenVINO)
    if names[1] == OPENVINO and (args.against_provider or args.against_opt_level):
        raise UsageError("--against-provider and --against-opt-level are ONNX Runtime's; "
                         "drop them with --against-runtime openvino")
    shared = RuntimeOptions.from_args(_namespace_with(args, runtime="onnxruntime",
                                                        ov_precision=None))
    reference = _on_runtime(replace(shared, promote=RuntimeOptions.promote), names[0],
                            args.ov_precision)
    candidate = _on_runtime(replace(shared, provider=args.against_provider or shared.provider,
                                    opt_level=args.against_opt_level or shared.opt_level),
                            names[1], args.ov_precision)
    return reference, candidate


def _on_runtime(options: RuntimeOptions, runtime: str, precision: str | None,
                ) -> RuntimeOptions:
    """``options`` on ``runtime``: OpenVINO takes the precision, ONNX Runtime the rest."""
    if runtime == "onnxruntime":
        return options
    if (options.provider, options.opt_level) != (RuntimeOptions.provider,
                                                  RuntimeOptions.opt_level):
        # Given for the ONNX Runtime side, when there is one: not an OpenVINO setting.
        options = replace(options, provider=RuntimeOptions.provider,
                          opt_level=RuntimeOptions.opt_level)
    return replace(options, runtime=runtime, precision=precision)


def _namespace_with(args: argparse.Namespace, **changes: object) -> argparse.Namespace:
    """A copy of ``args`` with ``changes``."""
    return argparse.Namespace(**{**vars(args), **changes})


def _names_a_factory(spec: str) -> bool:
    location, colon, factory = spec.rpartition(":")
    return bool(colon and location and factory.isidentifier())


def add_against_options(parser: argparse.ArgumentParser) -> None:
    """The options of the ONNX-against-ONNX form, in their own --help group."""
    from bisect_onnx.runtime.onnxruntime.sessions import OPT_LEVELS
    from bisect_onnx.runtime.registry import runtime_names

    against = parser.add_argument_group(
        "ONNX against ONNX (MODEL is the reference .onnx, run in ONNX Runtime with every "
        "value promoted; --provider and --opt-level are its settings)")
    against.add_argument("--against", type=Path, metavar="FILE",
                         help="the candidate .onnx (a float16 conversion, a QDQ model, a "
                         "simplified graph); default: MODEL itself")
    against.add_argument("--against-opt-level", choices=tuple(OPT_LEVELS),
                         help="the candidate's ONNX Runtime optimization level (default "
                         "--opt-level)")
    against.add_argument("--against-provider", metavar="NAME",
                         help="the candidate's execution provider (default --provider)")
    against.add_argument("--against-runtime", choices=runtime_names(),
                         help="the candidate's runtime (default --runtime): one file in ONNX "
                         "Runtime against the same file in OpenVINO is --against-runtime "
                         "openvino")
    against.add_argument("--against-reference-evaluator", action="store_true",
                         help="run the reference in ONNX's reference evaluator (onnx.reference: "
                         "standard ops only) and the candidate in ONNX Runtime")
