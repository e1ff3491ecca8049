"""The ``bisect-onnx`` command: parse arguments, call the API, print the report.

Exit status: 0 parity, 1 diverged, 2 usage or input error, 3 the model could not be
exported or run, 4 a bug in bisect-onnx. Errors bisect-onnx raises on purpose print
as one line; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from types import FrameType

from bisect_onnx.chatter import warnings_logged
from bisect_onnx.cli.check import check_from_args, recording_command
from bisect_onnx.cli.decode import (
    decode_from_args,
    refuse_decode_only_options,
    refuse_ignored_options,
)
from bisect_onnx.cli.parser import EXIT_BUG, build_check_parser, build_parser
from bisect_onnx.cli.printing import print_report, show_progress
from bisect_onnx.errors import BisectOnnxError, ModelError

__all__ = ["main", "build_parser"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit status (``check REF``: against a recorded reference)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check"]:
        args = build_check_parser().parse_args(argv[1:])
        args.checks_reference = True
    else:
        args = build_parser().parse_args(argv)
        args.checks_reference = False
        args.recording_command = recording_command(argv)
    # The libraries' warnings (numpy's overflows, torch's deprecations, the model's
    # own) are for the log (-v): stderr holds the command's own lines only.
    with _logging_to_stderr(args.verbose), warnings_logged():
        return _outcome(args)


def _outcome(args: argparse.Namespace) -> int:
    """The run's exit status: errors bisect-onnx raises on purpose are one line."""
    termination = _Termination()
    try:
        with termination.unwinds():
            return _run(args)
    except BaseException as error:
        # Whatever the run ended with once SIGTERM came (a library that caught the
        # signal's exception mid-import raises another), it was terminated.
        if termination.received and not isinstance(error, KeyboardInterrupt):
            return _fail("terminated", _EXIT_TERMINATED)
        return _failed(error)


def _failed(error: BaseException) -> int:
    """The exit status of a run that raised ``error``, its line printed."""
    if isinstance(error, BisectOnnxError):
        sweep = getattr(error, "sweep", None)  # a refusal the sweep found: what led to it
        if sweep is not None:
            from bisect_onnx.report.sweep_text import sweep_text

            print(f"{sweep_text(sweep)}\n")
        return _fail(str(error), error.exit_code)
    if isinstance(error, KeyboardInterrupt):
        return _fail("interrupted", 130)
    if isinstance(error, SystemExit):  # from the user's code: exiting 0 would read as parity
        return _fail(f"the model's code called sys.exit({error.code!r}) during the run, so "
                     "there is no verdict; remove the exit", ModelError.exit_code)
    if not isinstance(error, Exception):  # GeneratorExit and the like: not ours to judge
        raise error
    # A bug: keep the traceback, but never exit as "diverged".
    traceback.print_exception(error)
    return _fail("this is a bug in bisect-onnx; please report it with the traceback above",
                 EXIT_BUG)


# What a shell reports for a process SIGTERM ended: 128 + the signal's number.
_EXIT_TERMINATED = 128 + signal.SIGTERM


class _Terminated(BaseException):
    """SIGTERM arrived: unwinds the run like Ctrl-C's KeyboardInterrupt.

    A BaseException, as KeyboardInterrupt is, so that no ``except Exception`` on the way
    (the exporter's, the model's) takes it for a failure of the step it interrupts.
    """


class _Termination:
    """SIGTERM during one run: whether it came, and the handler that unwinds the run."""

    def __init__(self) -> None:
        self.received = False

    @contextlib.contextmanager
    def unwinds(self) -> Iterator[None]:
        """Make SIGTERM unwind the run, for the run: every ``finally`` and ``with`` runs.

        SIGTERM (``timeout``, a CI runner's cancel) would otherwise end the process at
        once and leave the run's temporary folders behind. A second SIGTERM while the
        run unwinds is ignored, so that the cleanup itself is not cut short. Only the
        main thread can set a handler (``main`` called from another is left as it
        was); the previous handler is back after the run (``main`` called in-process).
        """
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def unwind(signum: int, frame: FrameType | None) -> None:
            if not self.received:
                self.received = True
                raise _Terminated

        previous = signal.signal(signal.SIGTERM, unwind)
        try:
            yield
        finally:  # (None: one set outside Python, which cannot be put back: the default)
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


@contextlib.contextmanager
def _logging_to_stderr(verbosity: int) -> Iterator[None]:
    """Show bisect-onnx's log records at -v and -vv, for the run.

    Its steps, and what the libraries printed and warned during its calls into them
    (:mod:`bisect_onnx.chatter`); the libraries' own loggers are not shown. Taken off
    after the run: ``main`` called again in one process (tests) logs once, to the
    stderr of its own call.
    """
    logger = logging.getLogger("bisect_onnx")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("bisect-onnx: %(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _run(args: argparse.Namespace) -> int:
    import bisect_onnx
    from bisect_onnx.cli.against import against_requested, bisect_from_args
    from bisect_onnx.fixes.stage import check_write_fixed
    from bisect_onnx.pipeline.options import (
        ExportOptions,
        FixOptions,
        OutputOptions,
        RandomInputs,
        RuntimeOptions,
        SearchOptions,
        Tolerance,
    )
    from bisect_onnx.pytorch.installed import require_torch
    from bisect_onnx.pytorch.parking import models_released_at_end
    from bisect_onnx.reference.recording import record_with_report
    from bisect_onnx.sources.input_samples import load_input_samples
    from bisect_onnx.sources.loading import load_model

    if getattr(args, "checks_reference", False):  # the runtime against a recorded reference
        _runtime_logs_off()
        return print_report(args, check_from_args(args))
    if getattr(args, "steps", None) is not None:  # a decoder stepped with its cache
        refuse_ignored_options(args)
        _check_files(args, against=False)  # --json, --html, --save-onnx onto an input
        _runtime_logs_off()
        return decode_from_args(args)
    refuse_decode_only_options(args)  # what a run without --steps would ignore
    against = against_requested(args)
    if against:  # two ONNX models, MODEL the reference: their own driver
        _check_files(args, against=True)  # before anything runs or is written
        _runtime_logs_off()
        return print_report(args, bisect_from_args(args))
    # Each options object checks its own values, before the slow steps.
    options = {"tolerance": Tolerance.from_args(args), "export": ExportOptions.from_args(args),
               "runtime": RuntimeOptions.from_args(args),
               "search": SearchOptions.from_args(args), "output": OutputOptions.from_args(args)}
    random_inputs = RandomInputs.from_args(args)
    _check_files(args, against=False)  # before anything runs or is written
    require_torch()
    _runtime_logs_off()
    options["suggest_fix"] = FixOptions.from_args(args)
    check_write_fixed(args.write_fixed, (args.model, args.onnx, *args.input, args.tolerances))
    inputs = (load_input_samples(args.input, max_memory=args.max_memory, onnx_model=args.onnx)
              if args.input else random_inputs)
    model = load_model(args.model, trust_pickle=args.trust_pickle)
    progress = (bisect_onnx.events.listening(show_progress)
                if sys.stderr.isatty() and not args.quiet else contextlib.nullcontext())
    # The model is this command's own: its parked weights need not be read back.
    with progress, models_released_at_end():
        if args.record is not None:  # the comparison, and its reference for a check elsewhere
            report, _ = record_with_report(
                model, inputs, path=args.record, command=getattr(args, "recording_command", None),
                onnx_model=args.onnx, **options)
        else:
            report = bisect_onnx.bisect(model, inputs, onnx_model=args.onnx, **options)
    return print_report(args, report)


def _runtime_logs_off() -> None:
    """Keep ONNX Runtime's C++ log off stderr for the sessions of the whole process.

    Every session bisect-onnx makes sets its own severity; this covers those that
    take the default (the command's process is bisect-onnx's, so the default is ours
    to set), and what ONNX Runtime logs outside any session. Errors reach bisect-onnx
    as exceptions.
    """
    with contextlib.suppress(ImportError):  # a run on another runtime only
        import onnxruntime

        onnxruntime.set_default_logger_severity(4)


def _check_files(args: argparse.Namespace, *, against: bool) -> None:
    """Refuse what the command line alone shows cannot work, before anything runs.

    Output paths that would overwrite an input or each other, and unreadable inputs.
    """
    from bisect_onnx.sources.file_kinds import read_head
    from bisect_onnx.sources.output_paths import check_outputs, model_files, onnx_files

    if not against:
        _check_factory_source(args.model)
    for label, path in (("--onnx", args.onnx), ("candidate", args.against)):
        if path is not None:  # what it holds is for the step that reads it
            read_head(path, 1, label=f"{label} file", expected="an .onnx file")
    if args.tolerances is not None:
        read_head(args.tolerances, 1, label="tolerance file",
                  expected="a text file of lines 'PATTERN RTOL ATOL' to --tolerances")
    outputs = {"--json": args.json, "--html": args.html,
               "--model-explorer": args.model_explorer, "--save-onnx": args.save_onnx,
               "--repro-dir": args.repro_dir, "--record": args.record}
    model = (onnx_files(args.model, "MODEL", outputs=outputs) if against
             else model_files(args.model))
    inputs = [*model, *(("--input", path) for path in args.input),
              *onnx_files(args.onnx, "--onnx", outputs=outputs),
              *onnx_files(args.against, "--against", outputs=outputs),
              ("--tolerances", args.tolerances)]
    check_outputs(outputs, inputs=inputs, folders={"--repro-dir"},
                  makes_parents={"--save-onnx"})


def _check_factory_source(spec: str) -> None:
    """Refuse a factory's missing or empty source file in one line, before torch is imported.

    (Importing torch takes seconds; a mistyped path deserves its answer at once.)
    """
    from bisect_onnx.sources.file_kinds import read_head
    from bisect_onnx.sources.loading import MODEL_FORMS
    from bisect_onnx.sources.output_paths import source_file

    location, colon, factory = spec.rpartition(":")
    source = source_file(location) if colon and location and factory.isidentifier() else None
    if source is not None:  # a package.module not found here: its import says why
        read_head(source, 1, label="model file",
                  expected=f"the file defining {factory}; MODEL is {MODEL_FORMS}")


def _fail(message: str, status: int) -> int:
    print(f"bisect-onnx: error: {message}", file=sys.stderr)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
