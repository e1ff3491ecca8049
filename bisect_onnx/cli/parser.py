"""The command line's arguments: what each option means, in the order --help shows them."""

from __future__ import annotations

import argparse
from pathlib import Path

from bisect_onnx.cli.against import add_against_options
from bisect_onnx.judge.compare import DEFAULT_ATOL, DEFAULT_RTOL
from bisect_onnx.version import __version__

__all__ = ["build_parser", "EXIT_PARITY", "EXIT_DIVERGED", "EXIT_USAGE", "EXIT_BUG"]

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
    parser = _Parser(
        prog="bisect-onnx",
        description="Find the first ONNX node whose output diverges from the PyTorch model, "
        "and the module and source line it came from.",
        epilog="exit status: 0 parity, 1 diverged, 2 usage or input error, "
        "3 the model could not be exported or run, 4 a bug in bisect-onnx",
    )
    _add_model_and_inputs(parser)
    _add_export_options(parser)
    _add_runtime_options(parser)
    add_against_options(parser)
    _add_report_options(parser)
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
    parser.add_argument("--seed", type=int, default=0, help="seed of random inputs")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE",
                        help="value of a named free dimension, for random inputs (repeat)")
    parser.add_argument("--samples", type=int, default=1, metavar="N",
                        help="try N random inputs and report the worst (default 1)")


def _add_export_options(parser: argparse.ArgumentParser) -> None:
    from bisect_onnx.pytorch.exporting import EXPORTERS

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


def _add_runtime_options(parser: argparse.ArgumentParser) -> None:
    from bisect_onnx.runtime.capture_plan import PROMOTE_CHOICES
    from bisect_onnx.runtime.sessions import CPU_PROVIDER, DEFAULT_OPT_LEVEL, OPT_LEVELS

    parser.add_argument("--rtol", type=float, default=None,
                        help=f"relative tolerance (default {DEFAULT_RTOL:g}; with --against*, "
                        "by the models' precision)")
    parser.add_argument("--atol", type=float, default=None,
                        help=f"absolute tolerance (default {DEFAULT_ATOL:g}; with --against*, "
                        "by the models' precision)")
    parser.add_argument("--tolerances", type=Path, metavar="FILE",
                        help="per-value tolerances: lines of 'PATTERN RTOL ATOL' (fnmatch "
                        "patterns on ONNX value names, and on op and module names with a "
                        "PyTorch MODEL; the first match wins)")
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


def _add_report_options(parser: argparse.ArgumentParser) -> None:
    from bisect_onnx.align.op_level import GRANULARITIES
    from bisect_onnx.report.text import SHOW_CHOICES

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
