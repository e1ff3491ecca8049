"""The command line's decode form: ``--steps N`` steps a decoder with its cache."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from bisect_onnx.cli.parser import EXIT_DIVERGED, EXIT_PARITY
from bisect_onnx.errors import InputError, UsageError

if TYPE_CHECKING:
    from bisect_onnx.decode.step_report import DecodeReport

__all__ = ["decode_from_args", "refuse_ignored_options", "refuse_decode_only_options"]

# Options of the one-forward comparison that a decode run does not take.
_NOT_FOR_DECODE = {"record": "--record", "model_explorer": "--model-explorer",
                   "suggest_fix": "--suggest-fix", "write_fixed": "--write-fixed",
                   "against": "--against", "against_opt_level": "--against-opt-level",
                   "against_provider": "--against-provider",
                   "against_runtime": "--against-runtime",
                   "against_reference_evaluator": "--against-reference-evaluator",
                   "dynamic": "--dynamic", "tolerances": "--tolerances",
                   "repro_dir": "--repro-dir", "sweep": "--sweep", "dim": "--dim",
                   "all_culprits": "--all-culprits", "granularity": "--granularity"}


def decode_from_args(args: argparse.Namespace) -> int:
    """Run ``bisect_decode`` from parsed arguments, print its report; the exit status.

    The caller has refused the options a decode run ignores
    (:func:`refuse_ignored_options`) and output paths onto the run's inputs.
    """
    from bisect_onnx.decode.options import DecodeOptions
    from bisect_onnx.decode.run import bisect_decode
    from bisect_onnx.pipeline.options import ExportOptions, RuntimeOptions, Tolerance
    from bisect_onnx.pytorch.installed import require_torch
    from bisect_onnx.pytorch.parking import models_released_at_end
    from bisect_onnx.sources.loading import load_model

    decode = DecodeOptions.from_args(args)
    tolerance = Tolerance.from_args(args)
    export = ExportOptions.from_args(args)
    runtime = RuntimeOptions.from_args(args)
    prompt = _prompt(args.input)
    require_torch()
    model = load_model(args.model, trust_pickle=args.trust_pickle)
    # The model is this command's own: its parked weights need not be read back.
    with models_released_at_end():
        report = bisect_decode(model, prompt, steps=args.steps, onnx_model=args.onnx,
                               tolerance=tolerance, export=export, runtime=runtime,
                               decode=decode)
    from bisect_onnx.decode.text import decode_verdict

    for warning in report.warnings:
        print(f"WARNING: {warning}", file=sys.stderr)
    print(decode_verdict(report) if args.quiet else str(report))
    for path, suffix in ((args.json, ".json"), (args.html, ".html")):
        if path is not None:  # in the format its option names, whatever its suffix
            _write(report, Path(path), suffix)
    sys.stdout.flush()
    return EXIT_DIVERGED if report.diverged else EXIT_PARITY


def refuse_ignored_options(args: argparse.Namespace) -> None:
    """Refuse what a decode run would ignore, and a negative ``--steps``.

    The one-forward options, and the random prompt's beside the prompt ``--input`` gives.
    """
    given = [flag for name, flag in _NOT_FOR_DECODE.items()
             if getattr(args, name, None) not in (None, False, [])]
    if getattr(args, "samples", None) is not None:  # one forward's random inputs; the prompt
        given.append("--samples")  # is drawn with --prompt-length and --seed
    if given:
        raise UsageError(f"{_listed(given)} not apply to a decode run (--steps); drop "
                         f"{_pronoun(given)}, or drop --steps to compare one forward")
    if args.steps < 0:
        raise UsageError(f"--steps takes 0 or more, got {args.steps}")
    drawing = _random_prompt_options(args)
    if args.input and drawing:
        raise UsageError(f"{_listed(drawing, verb='apply')} to the random prompt drawn without "
                         f"--input; drop {_pronoun(drawing)} (the prompt is the --input "
                         "file's), or drop --input to draw one")


def refuse_decode_only_options(args: argparse.Namespace) -> None:
    """Refuse, in a run without ``--steps``, the options only a decode run reads.

    (``--seed`` is not one: it seeds the one-forward form's random inputs too.)
    """
    given = [flag for flag, is_given in (
        ("--prompt-length", "--prompt-length" in _random_prompt_options(args)),
        ("--cache-name", bool(args.cache_name)),
        ("--cache-shape", args.cache_shape is not None)) if is_given]
    if given:
        raise UsageError(f"{_listed(given, verb='apply')} to a decode run; add --steps N, or "
                         f"drop {_pronoun(given)} to compare one forward")


def _random_prompt_options(args: argparse.Namespace) -> list[str]:
    """The options given that set the random prompt drawn where ``--input`` gives none.

    Neither has a default on the command line, so giving one is seen (``--seed 0`` too).
    """
    return [flag for flag, is_given in (("--prompt-length", args.prompt_length is not None),
                                        ("--seed", args.seed is not None))
            if is_given]


def _listed(flags: list[str], *, verb: str = "do") -> str:
    """``--a does`` or ``--a, --b do`` (``verb``: the plural form, ``do`` or ``apply``)."""
    singular = {"do": "does", "apply": "applies"}[verb]
    return f"{', '.join(flags)} {singular if len(flags) == 1 else verb}"


def _pronoun(flags: list[str]) -> str:
    return "it" if len(flags) == 1 else "them"


def _write(report: DecodeReport, path: Path, suffix: str) -> None:
    from bisect_onnx.decode.html import decode_html

    text = (decode_html(report) if suffix == ".html"
            else json.dumps(report.to_dict(), indent=1) + "\n")
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        raise InputError(f"--{suffix[1:]} {path}: cannot write it ({error.strerror}); pass "
                         "a path in a folder you can write") from error


def _prompt(inputs: list[Path]) -> object:
    """The prompt's token ids from the one ``.npy`` given, or ``None`` (a random prompt)."""
    from bisect_onnx.sources.file_kinds import NPY_MAGIC, read_head
    from bisect_onnx.sources.loading import load_input_files

    if not inputs:
        return None
    if len(inputs) > 1 or inputs[0].suffix != ".npy":
        raise UsageError("with --steps, --input takes one .npy of token ids ([sequence] or "
                         "[batch, sequence] integers)")
    path = inputs[0]
    # As the one-forward form does: missing, a folder, a FIFO (whose read would block)
    # or empty is refused in one line before numpy reads it.
    head = read_head(path, len(NPY_MAGIC), label="input file",
                     expected="token ids saved with numpy.save")
    if head != NPY_MAGIC:  # numpy.load would open an .npz whatever its name, as no array
        raise InputError(f"input file {path} is not .npy data; pass token ids saved with "
                         "numpy.save")
    # Read as the one-forward form reads an input: its header against the file's size
    # and the memory budget first, an object array refused.
    [array] = load_input_files([path])
    from bisect_onnx.decode.checks import token_ids

    token_ids(array)  # refused now, before the model is built, where it is not token ids
    return array
