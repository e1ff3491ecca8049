"""The command line's check form: ``bisect-onnx check REF``, and ``--record REF``."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING

from bisect_onnx.errors import UsageError

if TYPE_CHECKING:
    from bisect_onnx.judge.records import Report

__all__ = ["check_from_args", "recording_command"]


def check_from_args(args: argparse.Namespace) -> Report:
    """Check the runtime against the reference ``REF`` from parsed arguments."""
    from bisect_onnx.pipeline.check_reference import check
    from bisect_onnx.pipeline.options import (
        FixOptions,
        OutputOptions,
        RuntimeOptions,
        SearchOptions,
        Tolerance,
    )
    from bisect_onnx.reference.loaded import Reference
    from bisect_onnx.sources.file_kinds import check_onnx_file
    from bisect_onnx.sources.input_samples import Samples, load_input_samples
    from bisect_onnx.sources.output_paths import check_outputs, onnx_files

    # Refused here too, in the command line's own words (the API's name its parameters).
    if args.sweep:
        raise UsageError("--sweep runs the PyTorch model at other inputs, and a recorded "
                         "reference holds only its own: drop --sweep, or sweep where "
                         "PyTorch runs")
    if args.granularity is not None:
        raise UsageError("--granularity is the recording's; drop it")
    if args.onnx is not None:
        check_onnx_file(args.onnx, "--onnx")
    runtime = RuntimeOptions.from_args(args)
    # Its manifest, read once: without --onnx, the file it was recorded on is the run's
    # input too, which no output may be written over.
    reference = Reference.load(args.reference, max_memory=runtime.max_memory)
    onnx, onnx_label = ((args.onnx, "--onnx") if args.onnx is not None
                        else (reference.recorded_onnx, "the recorded ONNX file"))
    outputs = {"--json": args.json, "--html": args.html,
               "--model-explorer": args.model_explorer, "--repro-dir": args.repro_dir,
               "--write-fixed": args.write_fixed}
    check_outputs(outputs, inputs=[("REF", args.reference),
                                   *onnx_files(onnx, onnx_label, outputs=outputs),
                                   *(("--input", path) for path in args.input),
                                   ("--tolerances", args.tolerances)],
                  folders={"--repro-dir"})
    inputs = (load_input_samples(args.input, max_memory=args.max_memory, onnx_model=args.onnx)
              if args.input else None)
    if isinstance(inputs, Samples):
        raise UsageError("a reference holds one input set; give its inputs once, or none")
    args.model = str(args.reference)  # how the report and its progress name the run
    return check(reference, args.onnx, inputs, runtime=runtime,
                 tolerance=Tolerance.from_args(args), search=SearchOptions.from_args(args),
                 output=OutputOptions.from_args(args), suggest_fix=FixOptions.from_args(args),
                 allow_other_file=args.allow_other_file)


def recording_command(argv: Sequence[str]) -> str:
    """The command that compares again where PyTorch runs: ``argv`` without ``--record``."""
    kept, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item == "--record":
            skip = True
        elif not item.startswith("--record="):
            kept.append(item)
    return shlex.join(["bisect-onnx", *kept])

