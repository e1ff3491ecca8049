"""The ``bisect-onnx`` command: parse arguments, call the API, print the report.

Exit status: 0 parity, 1 diverged, 2 usage or input error, 3 the model could not be
exported or run, 4 a bug in bisect-onnx. Errors bisect-onnx raises on purpose print
as one line; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from bisect_onnx.errors import BisectOnnxError, UsageError
from bisect_onnx.judge.compare import DEFAULT_ATOL, DEFAULT_RTOL
from bisect_onnx.version import __version__

if TYPE_CHECKING:
    from bisect_onnx.judge.records import Report
    from bisect_onnx.pipeline.pytorch_vs_onnx import RandomInputs

__all__ = ["main", "build_parser"]

EXIT_PARITY = 0
EXIT_DIVERGED = 1
EXIT_USAGE = 2
EXIT_BUG = 4


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in one line with our exit status."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"bisect-onnx: error: {message} (see bisect-onnx --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    from bisect_onnx.align.op_level import GRANULARITIES
    from bisect_onnx.pytorch.exporting import EXPORTERS
    from bisect_onnx.report.text import SHOW_CHOICES
    from bisect_onnx.runtime.capture_plan import PROMOTE_CHOICES
    from bisect_onnx.runtime.sessions import CPU_PROVIDER, DEFAULT_OPT_LEVEL, OPT_LEVELS

    parser = _Parser(
        prog="bisect-onnx",
        description="Find the first ONNX node whose output diverges from the PyTorch model, "
        "and the module and source line it came from.",
        epilog="exit status: 0 parity, 1 diverged, 2 usage or input error, "
        "3 the model could not be exported or run, 4 a bug in bisect-onnx",
    )
    parser.add_argument("model", metavar="MODEL",
                        help="FILE.py:FACTORY or package.module:FACTORY (a callable that "
                        "returns the nn.Module; the current folder is importable), a .pt2 "
                        "from torch.export.save, a torch.jit.save archive, or a "
                        "torch.save(model) file with --trust-pickle")
    parser.add_argument("--trust-pickle", action="store_true",
                        help="allow MODEL to be a whole pickled module: loading it runs any "
                        "code the file names, so only for files you trust")
    parser.add_argument("-i", "--input", action="append", default=[], metavar="FILE",
                        type=Path, help=".npy (or .pt holding a tensor) per forward argument, "
                        "in order (repeat), or one .npz (or .pt holding a tuple or dict) "
                        "keyed by parameter or ONNX input names; without it, random inputs "
                        "are drawn from the ONNX graph's input specification")
    parser.add_argument("--seed", type=int, default=0, help="seed of random inputs")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                        help="value of a named free dimension, for random inputs (repeat)")
    parser.add_argument("--samples", type=int, default=1, metavar="N",
                        help="try N random inputs and report the worst (default 1)")
    parser.add_argument("--onnx", type=Path, metavar="FILE",
                        help="compare this existing export instead of exporting the model")
    parser.add_argument("--exporter", choices=EXPORTERS,
                        help="exporter for the export made here: dynamo (the default, as in "
                        "torch.onnx.export) or torchscript (dynamo=False; the default for a "
                        "TorchScript MODEL)")
    parser.add_argument("--opset", type=int, metavar="N", help="opset for the export")
    parser.add_argument("--dynamic", action="store_true",
                        help="export dimension 0 (the batch) of every input as dynamic")
    parser.add_argument("--save-onnx", type=Path, metavar="PATH",
                        help="keep a copy of the export made by bisect-onnx")
    parser.add_argument("--rtol", type=float, default=None,
                        help=f"relative tolerance (default {DEFAULT_RTOL:g}; with --against*, "
                        "by the models' precision)")
    parser.add_argument("--atol", type=float, default=None,
                        help=f"absolute tolerance (default {DEFAULT_ATOL:g}; with --against*, "
                        "by the models' precision)")
    parser.add_argument("--provider", default=CPU_PROVIDER, metavar="NAME",
                        help=f"ONNX Runtime execution provider (default {CPU_PROVIDER})")
    parser.add_argument("--opt-level", choices=tuple(OPT_LEVELS), default=DEFAULT_OPT_LEVEL,
                        help="ONNX Runtime graph optimization level (default all, as "
                        "ONNX Runtime's own default)")
    parser.add_argument("--promote", choices=PROMOTE_CHOICES, default="fused",
                        help="fused (default): capture only the values that survive ONNX "
                        "Runtime's optimizations, so the production kernels run; all: every "
                        "node output, which changes what ONNX Runtime fuses")
    parser.add_argument("--max-memory", metavar="SIZE",
                        help="memory the captured values of both sides may take (512MB, "
                        "2GiB); over it, ONNX Runtime's values are probed a few at a time "
                        "by bisection (default: 80%% of the memory available)")
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
    against.add_argument("--against-reference-evaluator", action="store_true",
                         help="run the reference in ONNX's reference evaluator (onnx.reference: "
                         "standard ops only) and the candidate in ONNX Runtime")
    against.add_argument("--tolerances", type=Path, metavar="FILE",
                         help="per-value tolerances: lines of 'PATTERN RTOL ATOL' (fnmatch "
                         "patterns on value names; the first match wins)")
    parser.add_argument("--granularity", choices=GRANULARITIES, default=None,
                        help="table rows: one per ATen op (the default where a dynamo export's "
                        "program names the ONNX values) or one per module call")
    parser.add_argument("--all-culprits", action="store_true",
                        help="check every failing value on PyTorch's inputs and list each one "
                        "that introduces error, not only the first")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the report as JSON")
    parser.add_argument("--show", choices=SHOW_CHOICES, default="window",
                        help="table rows: a window around the first divergence on long "
                        "models (default), or all")
    parser.add_argument("--html", type=Path, metavar="PATH",
                        help="write a self-contained HTML report")
    parser.add_argument("--model-explorer", type=Path, metavar="PATH",
                        help="write per-node errors as node data for Google's Model Explorer")
    parser.add_argument("--repro-dir", type=Path, metavar="DIR",
                        help="on divergence, write a minimal standalone repro of the first "
                        "divergence (ONNX segment, inputs, expected outputs, repro.py)")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="print only the verdict line (and warnings and errors)")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log bisect-onnx's steps to stderr (-vv for debug detail)")
    parser.add_argument("--version", action="version", version=f"bisect-onnx {__version__}")
    return parser


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
    from bisect_onnx.judge.compare import check_tolerances
    from bisect_onnx.pipeline.onnx_vs_onnx import against_requested, bisect_from_args
    from bisect_onnx.pipeline.pytorch_vs_onnx import RandomInputs
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
        return _print(args, bisect_from_args(args))
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
    progress = (bisect_onnx.events.listening(_show_progress)
                if sys.stderr.isatty() and not args.quiet else contextlib.nullcontext())
    with progress:
        report = _bisect(args, model, inputs, random_inputs)
    return _print(args, report)


def _bisect(args: argparse.Namespace, model: object, inputs: object,
            random_inputs: RandomInputs) -> Report:
    import bisect_onnx
    from bisect_onnx.pipeline.pytorch_vs_onnx import ExportOptions, RuntimeOptions

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


def _print(args: argparse.Namespace, report: Report) -> int:
    from bisect_onnx.report.json import write_json

    for warning in report.warnings:
        print(f"WARNING: {warning}", file=sys.stderr)
    colour = _colour_wanted(sys.stdout)
    if not args.quiet:
        print(_paint_table(report.table(show=args.show), colour))
        print()
    print(_paint(report.summary(), _RED if report.diverged else _GREEN, colour))
    if args.json is not None:
        write_json(report, args.json)
    if args.html is not None:
        from bisect_onnx.report.html import write_html

        write_html(report, args.html)
    if args.model_explorer is not None:
        from bisect_onnx.report.overlay import write_model_explorer

        write_model_explorer(report, args.model_explorer)
    return EXIT_DIVERGED if report.diverged else EXIT_PARITY


_RED, _GREEN = "31", "32"
_PROGRESS = {
    "export_started": "exporting the model ({detail} exporter)…",
    "capture_started": "running {detail} and recording every value…",
    "session_started": "creating an ONNX Runtime session…",
}


def _colour_wanted(stream: TextIO) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set non-empty (no-color.org)."""
    return stream.isatty() and not os.environ.get("NO_COLOR")


def _paint(text: str, code: str, colour: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if colour else text


def _paint_table(table: str, colour: bool) -> str:
    return "\n".join(_paint(line, _RED, colour) if line.startswith(">>") else line
                     for line in table.splitlines())


def _show_progress(event: object) -> None:
    """Print the library's long steps on stderr (a terminal only, and not with -q)."""
    template = _PROGRESS.get(getattr(event, "kind", ""))
    if template:
        print(f"bisect-onnx: {template.format(detail=event.detail)}", file=sys.stderr)


def _fail(message: str, status: int) -> int:
    print(f"bisect-onnx: error: {message}", file=sys.stderr)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
