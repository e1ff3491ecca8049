"""The command line's arguments in --help order; each options object adds its own."""

from __future__ import annotations

import argparse
from pathlib import Path

from bisect_onnx.cli.against import add_against_options
from bisect_onnx.version import __version__

__all__ = ["build_parser", "build_check_parser", "EXIT_PARITY", "EXIT_DIVERGED",
           "EXIT_USAGE", "EXIT_BUG"]

EXIT_PARITY = 0
EXIT_DIVERGED = 1
EXIT_USAGE = 2
EXIT_BUG = 4


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in one line with our exit status."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"bisect-onnx: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface, each options object adding its own arguments."""
    from bisect_onnx.pipeline.options import (
        ExportOptions,
        FixOptions,
        OutputOptions,
        RandomInputs,
        RuntimeOptions,
        SearchOptions,
        Tolerance,
    )

    parser = _Parser(
        prog="bisect-onnx",
        description="Find the first ONNX node whose output diverges from the PyTorch model, "
        "and the module and source line it came from.",
        epilog="exit status: 0 parity, 1 diverged, 2 usage or input error, "
        "3 the model could not be exported or run, 4 a bug in bisect-onnx",
    )
    _add_model_and_inputs(parser)
    RandomInputs.add_arguments(parser)
    parser.add_argument("--onnx", type=Path, metavar="FILE",
                        help="compare this existing export instead of exporting the model")
    ExportOptions.add_arguments(parser)
    Tolerance.add_arguments(parser)
    RuntimeOptions.add_arguments(parser)
    add_against_options(parser)
    SearchOptions.add_arguments(parser)
    FixOptions.add_arguments(parser)
    _add_report_options(parser)
    OutputOptions.add_arguments(parser)
    parser.add_argument("--record", type=Path, metavar="REF",
                        help="also write a reference archive of PyTorch's values (with "
                        "--against, MODEL.onnx's) at every ONNX value compared, to check "
                        "the runtime where the reference is not run (bisect-onnx check REF)")
    from bisect_onnx.decode.options import DecodeOptions

    DecodeOptions.add_arguments(parser)
    _add_verbosity(parser)
    return parser


def build_check_parser() -> argparse.ArgumentParser:
    """``bisect-onnx check REF``: the runtime against a recorded reference."""
    from bisect_onnx.pipeline.options import (
        FixOptions,
        OutputOptions,
        RuntimeOptions,
        SearchOptions,
        Tolerance,
    )

    parser = _Parser(
        prog="bisect-onnx check",
        description="Check the runtime against a reference recorded where PyTorch runs "
        "(bisect-onnx MODEL ... --record REF): only the runtime runs here.",
        epilog="exit status: 0 parity, 1 diverged, 2 usage or input error, "
        "3 the model could not be run, 4 a bug in bisect-onnx")
    parser.add_argument("reference", metavar="REF", type=Path,
                        help="the reference archive (.npz) --record wrote")
    parser.add_argument("--onnx", type=Path, metavar="FILE",
                        help="the ONNX file to run (default: the one recorded); its graph "
                        "must be the recorded one")
    parser.add_argument("--allow-other-file", action="store_true",
                        help="run an ONNX file whose graph is not the recorded one, values "
                        "compared by name")
    parser.add_argument("-i", "--input", action="append", default=[], metavar="FILE",
                        type=Path, help="the recorded inputs, to confirm them (default: "
                        "the recorded inputs; others are refused)")
    Tolerance.add_arguments(parser)
    RuntimeOptions.add_arguments(parser)
    SearchOptions.add_arguments(parser)
    FixOptions.add_arguments(parser)
    _add_report_options(parser)
    OutputOptions.add_arguments(parser)
    _add_verbosity(parser)
    return parser


def _add_model_and_inputs(parser: argparse.ArgumentParser) -> None:
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
                        "keyed by parameter or ONNX input names; several .npz/.pt files, or a "
                        "folder of them, are several samples (the worst is reported); "
                        "without it, random inputs are drawn from the ONNX graph's input "
                        "specification")


def _add_report_options(parser: argparse.ArgumentParser) -> None:
    from bisect_onnx.report.text import SHOW_CHOICES

    parser.add_argument("--json", type=Path, metavar="PATH", help="write the report as JSON")
    parser.add_argument("--show", choices=SHOW_CHOICES, default="window",
                        help="table rows: a window around the first divergence on long "
                        "models (default), or all")
    parser.add_argument("--html", type=Path, metavar="PATH",
                        help="write a self-contained HTML report")
    parser.add_argument("--model-explorer", type=Path, metavar="PATH",
                        help="write per-node errors as node data for Google's Model Explorer")


def _add_verbosity(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="print only the verdict line (and warnings and errors)")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log bisect-onnx's steps to stderr, and the warnings and output of "
                        "the libraries it calls, which are never printed otherwise (-vv for "
                        "debug detail and that output in full)")
    parser.add_argument("--version", action="version", version=f"bisect-onnx {__version__}")
