"""The ``bisect-onnx`` command: parse arguments, call the API, print the report.

Exit status: 0 parity, 1 diverged, 2 usage or input error, 3 the model could not be
exported or run, 4 a bug in bisect-onnx. Errors bisect-onnx raises on purpose print
as one line; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bisect_onnx.cli.parser import EXIT_BUG, build_parser
from bisect_onnx.cli.printing import print_report, show_progress
from bisect_onnx.errors import BisectOnnxError, UsageError
from bisect_onnx.judge.compare import DEFAULT_ATOL, DEFAULT_RTOL

if TYPE_CHECKING:
    from bisect_onnx.judge.records import Report
    from bisect_onnx.pipeline.options import RandomInputs

__all__ = ["main", "build_parser"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit status."""
    args = build_parser().parse_args(argv)
    _log_to_stderr(args.verbose)
    try:
        return _run(args)
    except BisectOnnxError as error:
        return _fail(str(error), error.exit_code)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception:  # a bug: keep the traceback, but never exit as "diverged"
        traceback.print_exc()
        return _fail("this is a bug in bisect-onnx; please report it with the traceback "
                     "above", EXIT_BUG)


def _log_to_stderr(verbosity: int) -> None:
    """Show bisect-onnx's own log records (not the libraries' chatter) at -v and -vv."""
    logger = logging.getLogger("bisect_onnx")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("bisect-onnx: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))


def _run(args: argparse.Namespace) -> int:
    import bisect_onnx
    from bisect_onnx.cli.against import against_requested, bisect_from_args
    from bisect_onnx.judge.compare import check_tolerances
    from bisect_onnx.pipeline.options import RandomInputs
    from bisect_onnx.sources.loading import check_writable, load_input_files, load_model
    from bisect_onnx.sources.random_inputs import parse_dim_options

    against = against_requested(args)
    if not against:
        args.rtol = DEFAULT_RTOL if args.rtol is None else args.rtol
        args.atol = DEFAULT_ATOL if args.atol is None else args.atol
        check_tolerances(args.rtol, args.atol)  # before the slow steps
        if args.tolerances is not None:
            raise UsageError("--tolerances applies when two ONNX models are compared "
                             "(--against FILE, --against-opt-level, ...); use --rtol and "
                             "--atol with a PyTorch MODEL")
    for option, path in (("--json", args.json), ("--save-onnx", args.save_onnx),
                         ("--html", args.html), ("--model-explorer", args.model_explorer)):
        if path is not None:
            check_writable(path, option, creates_folder=option == "--save-onnx")
    if args.repro_dir is not None and args.repro_dir.exists() and not args.repro_dir.is_dir():
        raise UsageError(f"--repro-dir {args.repro_dir} is a file; name a folder")
    if against:  # two ONNX models, MODEL the reference: their own driver
        return print_report(args, bisect_from_args(args))
    exporting = {"--exporter": args.exporter, "--opset": args.opset,
                 "--save-onnx": args.save_onnx, "--dynamic": args.dynamic or None}
    if args.onnx is not None and any(value is not None for value in exporting.values()):
        used = [option for option, value in exporting.items() if value is not None]
        raise UsageError(f"{', '.join(used)} apply to an export made here; drop them with "
                         "--onnx")
    random_inputs = RandomInputs(seed=args.seed, dims=parse_dim_options(args.dim),
                                 samples=args.samples)
    inputs = load_input_files(args.input) if args.input else None
    model = load_model(args.model, trust_pickle=args.trust_pickle)
    progress = (bisect_onnx.events.listening(show_progress)
                if sys.stderr.isatty() and not args.quiet else contextlib.nullcontext())
    with progress:
        report = _bisect(args, model, inputs, random_inputs)
    return print_report(args, report)


def _bisect(args: argparse.Namespace, model: object, inputs: object,
            random_inputs: RandomInputs) -> Report:
    import bisect_onnx
    from bisect_onnx.pipeline.options import ExportOptions, RuntimeOptions

    return bisect_onnx.bisect(
        model,
        inputs,
        onnx_model=args.onnx,
        rtol=args.rtol,
        atol=args.atol,
        export=None if args.onnx is not None else ExportOptions(
            exporter=args.exporter, opset=args.opset, dynamic_batch=args.dynamic,
            save_to=args.save_onnx),
        random_inputs=random_inputs,
        repro_dir=args.repro_dir,
        model_label=args.model,
        granularity=args.granularity,
        all_culprits=args.all_culprits,
        runtime=RuntimeOptions(provider=args.provider, opt_level=args.opt_level,
                               promote=args.promote, max_memory=args.max_memory),
    )


def _fail(message: str, status: int) -> int:
    print(f"bisect-onnx: error: {message}", file=sys.stderr)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
