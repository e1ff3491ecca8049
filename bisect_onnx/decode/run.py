"""``bisect_decode``: a decoder's prompt and N steps, compared, and the first failing step named."""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.decode.checks import (
    check_before_export,
    check_fixed_axes,
    check_memory,
    prompt_tokens,
    stacking_fits,
)
from bisect_onnx.decode.file_graph import FileGraph, static_dim
from bisect_onnx.decode.layout import CacheLayout
from bisect_onnx.decode.options import DecodeOptions
from bisect_onnx.decode.step_report import INTRODUCED, DecodeFinding, DecodeReport, find_failure
from bisect_onnx.errors import BisectOnnxError, InputError, UsageError, issue_warnings, one_line
from bisect_onnx.pipeline.options import ExportOptions, RuntimeOptions, Tolerance

if TYPE_CHECKING:
    import onnx
    import torch

    from bisect_onnx.decode.flat_cache import DecoderStep
    from bisect_onnx.decode.steps import RuntimeStepper, StepLoop
    from bisect_onnx.judge.tolerance_judge import ToleranceJudge
    from bisect_onnx.pytorch.parking import WeightParking

__all__ = ["bisect_decode"]

logger = logging.getLogger(__name__)

def bisect_decode(
    model: torch.nn.Module,
    prompt: object = None,
    *,
    steps: int = 16,
    onnx_model: str | Path | None = None,
    tolerance: Tolerance | tuple[float, float] | None = None,
    export: ExportOptions | None = None,
    runtime: RuntimeOptions | None = None,
    decode: DecodeOptions | None = None,
) -> DecodeReport:
    """Compare a decoder with a key/value cache over a prompt and ``steps`` greedy steps.

    Args:
        model: A ``transformers`` causal LM (its cache is flattened here), or an
            ``nn.Module`` whose ``forward(input_ids, attention_mask, [position_ids],
            *past)`` returns ``(logits, *present)``, each layer's key then value.
        prompt: Token ids, ``[sequence]`` or ``[batch, sequence]``; ``None`` draws
            ``decode.prompt_length`` random ones.
        steps: Decode steps after the prompt (step 0, the prefill).
        onnx_model: An export of the step, its inputs ``input_ids``,
            ``attention_mask``, (``position_ids``), ``past_key_values.{i}.key/.value``
            and outputs ``logits``, ``present.{i}.key/.value`` (or as
            ``decode.cache_names`` maps them). Without it the step is exported here.
        tolerance: As :func:`bisect_onnx.bisect`'s.
        export: Exporter and opset of the export made here; ``save_to`` keeps it.
        runtime: ONNX Runtime's provider and optimization level.
        decode: Prompt, cache names and shape, whether to bisect an introduced step.

    Returns:
        A :class:`~bisect_onnx.decode.step_report.DecodeReport`: ``verdict``, the rows
        per step, ``finding`` (the first failing step and its kind) and, for an error
        introduced at a step, that step's ``bisection`` (a :class:`~bisect_onnx.Report`).
    """
    from bisect_onnx.decode.file_graph import empty_cache, file_layout, read_file_graph
    from bisect_onnx.decode.flat_cache import decoder_step
    from bisect_onnx.pytorch.module_side import model_untouched
    from bisect_onnx.pytorch.parking import parking_for

    started = time.perf_counter()
    decode = decode or DecodeOptions()
    runtime = runtime or RuntimeOptions()
    _refuse_options(steps, tolerance, runtime, decode, given_file=onnx_model is not None)
    cautions = _cautions(model)
    issue_warnings(cautions)
    with (model_untouched(model),  # its buffers and modes as they came, on leaving
          tempfile.TemporaryDirectory(prefix="bisect-onnx-decode-") as folder,
          parking_for(model, Path(folder)) as parking):  # read back (or let go) on leaving
        step = decoder_step(model, decode.cache_shape)
        check_before_export(step, prompt, decode, steps, runtime)
        seconds: dict[str, float] = {}
        path, exporter = _onnx_file(step, onnx_model, export, Path(folder), seconds)
        graph = read_file_graph(path)  # its names and shapes, not its weights
        judged = _judge(tolerance, graph.skeleton)
        layout = step.layout if onnx_model is None else file_layout(step, graph, decode)
        step = _step_for_file(step, layout, model)
        prompt_array = prompt_tokens(prompt, decode, step, graph.shapes, layout)
        check_fixed_axes(graph.shapes, layout, prompt_array.shape, steps)
        empty = empty_cache(step, graph.shapes, layout, batch=prompt_array.shape[0])
        if step.cache_tails is None:  # the cache's shape came from the file
            check_memory(empty, prompt_array.shape, steps, runtime,
                         step.vocab_size or static_dim(graph.shapes, layout.logits, -1))
        loop = _run_steps(_Stepping(step, layout, path, graph, runtime, judged.base.rtol,
                                    judged.base.atol, stacking_fits(
                                        empty, prompt_array.shape, steps, runtime)),
                          parking, prompt_array, empty, steps)
        seconds.update(torch=loop.torch_seconds, runtime=loop.runtime_seconds)
        finding = find_failure(loop.rows)
        bisection = None
        if finding is not None and finding.kind == INTRODUCED and decode.bisect_step:
            parking.restore()  # PyTorch runs again (the session is gone)
            bisection, finding = _bisect_step(step, loop, finding, path, tolerance, runtime,
                                              seconds, reordered=_reordered(layout, graph,
                                                                            decode))
    seconds["total"] = time.perf_counter() - started
    return DecodeReport(model=step.name, onnx=str(onnx_model) if onnx_model else "(exported)",
                        exporter=exporter, rtol=judged.base.rtol, atol=judged.base.atol,
                        prompt=tuple(tuple(int(t) for t in row) for row in prompt_array),
                        rows=loop.rows, finding=finding, bisection=bisection, seconds=seconds,
                        warnings=cautions)


@dataclass(frozen=True)
class _Stepping:
    """What both sides' steps run on: the step, the file and how it is judged."""

    step: DecoderStep
    layout: CacheLayout
    path: Path
    graph: FileGraph
    runtime: RuntimeOptions
    rtol: float
    atol: float
    stack: bool
    """Whether a step's two runtime runs may go as one (the memory budget allows it)."""


def _run_steps(stepping: _Stepping, parking: WeightParking, prompt: np.ndarray,
               empty: tuple[np.ndarray, ...], steps: int) -> StepLoop:
    """PyTorch's steps, its weights parked, then the runtime's: the rows.

    PyTorch's weights are parked once its steps are kept (on the file's own data where
    it holds them), so that the session's copy is the only one in memory. Where one
    cache cannot keep every step's (:func:`~bisect_onnx.decode.steps.run_reference`),
    the sides step in turn with both copies held, as before.
    """
    from bisect_onnx.decode.steps import (
        TorchStepper,
        replay_steps,
        run_reference,
        run_steps,
    )
    from bisect_onnx.runtime.heap import kept_in_heap

    reference = run_reference(TorchStepper(stepping.step), prompt, empty, steps)
    if reference is None:
        runner = _runtime_stepper(stepping)
        return run_steps(TorchStepper(stepping.step), runner, prompt, empty, steps,
                         rtol=stepping.rtol, atol=stepping.atol)
    parking.park(stepping.graph.skeleton, stepping.path.parent)
    # The session's pages are kept when it is let go, for the weights read back.
    with kept_in_heap(parking.parked):
        return replay_steps(reference, _runtime_stepper(stepping), rtol=stepping.rtol,
                            atol=stepping.atol)


def _runtime_stepper(stepping: _Stepping) -> RuntimeStepper:
    """The session on the file, and its stepper (let go with it once the loop is done)."""
    from bisect_onnx.decode.steps import RuntimeStepper, open_session

    session = open_session(stepping.path, provider=stepping.runtime.provider,
                           opt_level=stepping.runtime.opt_level)
    return RuntimeStepper(session, stepping.layout, stepping.path.name, stack=stepping.stack)


def _refuse_options(steps: int, tolerance: Tolerance | tuple[float, float] | None,
                    runtime: RuntimeOptions, decode: DecodeOptions, *, given_file: bool) -> None:
    """One line for an option a decode run cannot take, before anything runs."""
    if runtime.runtime != "onnxruntime":
        raise UsageError("decode steps run in ONNX Runtime only; drop --runtime")
    if steps < 0:
        raise UsageError(f"steps must be 0 or more, got {steps}")
    if Tolerance.of(tolerance).rules is not None:
        raise UsageError("a decode run compares each step's logits and cache whole: drop the "
                         "per-value tolerance rules (--tolerances), or pass rtol and atol")
    if decode.cache_names and not given_file:  # the export made here has the standard ones
        raise UsageError("cache names (--cache-name) map an ONNX file's own names; give the "
                         "file (--onnx), or drop them")


def _judge(tolerance: Tolerance | tuple[float, float] | None,
           skeleton: onnx.ModelProto) -> ToleranceJudge:
    """The run's tolerance: an rtol or atol left out follows what the file computes in.

    As :func:`bisect_onnx.bisect`'s: a float16 decoder gets float16's defaults. Read
    off the file's graph without its weights (0.8 s of a 0.2B decoder's run otherwise).
    """
    from bisect_onnx.judge.tolerances import precision_of

    return Tolerance.of(tolerance).judge(precision_of(skeleton))


def _cautions(model: torch.nn.Module) -> tuple[str, ...]:
    """What may make the comparison mean less than it says (a model left training)."""
    if getattr(model, "training", False):
        return ("the model is in training mode: dropout and batch statistics, where it has "
                "them, make PyTorch's steps differ from inference; call model.eval() before "
                "stepping it",)
    return ()


def _onnx_file(step: DecoderStep, onnx_model: str | Path | None, export: ExportOptions | None,
               folder: Path, seconds: dict[str, float]) -> tuple[Path, str | None]:
    """The step's ONNX file (given, or exported here) and the exporter used here."""
    if onnx_model is None:
        from bisect_onnx.decode.export import export_decoder

        export = export or ExportOptions()
        exporter = export.exporter or "dynamo"
        started = time.perf_counter()
        path = export_decoder(step, folder, exporter=exporter, opset=export.opset)
        seconds["export"] = time.perf_counter() - started
        if export.save_to is not None:
            shutil.copyfile(path, export.save_to)
        return path, exporter
    path = Path(onnx_model)
    if not path.is_file():
        raise InputError(f"--onnx {path}: no such file; pass the decoder's ONNX export")
    return path, None


def _step_for_file(step: DecoderStep, layout: CacheLayout,
                   model: torch.nn.Module) -> DecoderStep:
    """A ``transformers`` model's step without ``position_ids`` where the file takes none.

    So that the step's inputs are the file's, in its order, for the step's bisection.
    """
    from bisect_onnx.decode.flat_cache import decoder_step, is_hf_decoder

    if layout.positions is None and step.layout.positions is not None and is_hf_decoder(model):
        return decoder_step(model, positions=False)
    return step


def _bisect_step(step: DecoderStep, loop: StepLoop, finding: DecodeFinding, path: Path,
                 tolerance: Tolerance | tuple[float, float] | None, runtime: RuntimeOptions,
                 seconds: dict[str, float], *, reordered: str | None,
                 ) -> tuple[object, DecodeFinding]:
    """Bisect the step the error is introduced at, on PyTorch's cache and token there.

    ``reordered``: why the steps fed the file's inputs in another order than its own
    (:func:`_reordered`), which the bisection feeds them in; where the step then agrees,
    that order is the likelier fault.
    """
    from dataclasses import replace

    from bisect_onnx.decode.export import translated_program
    from bisect_onnx.pipeline.pytorch_vs_onnx import PyTorchCall, compare_pytorch
    from bisect_onnx.pytorch.reference import exit_is_a_model_error

    started = time.perf_counter()
    assert loop.first_introduced is not None  # the finding is that step's
    inputs = _in_float16_where_the_model_is(loop.first_introduced.arrays(step.layout),
                                            step.module)
    bisect = exit_is_a_model_error(lambda module: compare_pytorch(PyTorchCall(
        module, inputs, path, tolerance, runtime=runtime,
        program=translated_program(step, path))))  # op level for a dynamo file
    try:
        report = bisect(step.module)
    except BisectOnnxError as error:
        logger.info("could not bisect step %d: %s", finding.step, one_line(error))
        return None, replace(finding, culprit=f"not bisected: {one_line(error)}")
    finally:
        seconds["bisection"] = time.perf_counter() - started
    culprit = report.summary().splitlines()[0]
    if not report.diverged:  # the step's outputs agree at bisect's own tolerance
        culprit = (f"the step's bisection finds its outputs within rtol={report.rtol:g}, "
                   f"atol={report.atol:g}: no failing value to name at that tolerance")
        if reordered is not None:
            culprit += f"; fed in the file's own input order the step agrees: {reordered}"
    return report, replace(finding, culprit=culprit)


def _reordered(layout: CacheLayout, graph: FileGraph, decode: DecodeOptions) -> str | None:
    """Why the steps feed the file's inputs in another order than the file's; None if not."""
    fed = [name for name in layout.input_names() if name in graph.inputs]
    if fed == list(graph.inputs):
        return None
    if decode.cache_names:
        return ("the --cache-name mapping may pair the wrong inputs (a key with a value, or "
                "two layers): check it")
    return ("the file takes its inputs in another order than the step's (tokens, mask, "
            "positions, each layer's key and value), and its bisection pairs them by position")


def _in_float16_where_the_model_is(arrays: list[np.ndarray],
                                   module: torch.nn.Module) -> list[np.ndarray]:
    """The step's inputs, its float ones as float16 for a float16 model (as its file takes).

    The cache is kept as float32; a float16 model returned it, so nothing is rounded.
    (A bfloat16 model's stay float32: numpy has no bfloat16, nor ONNX Runtime's CPU
    provider kernels for it.)
    """
    import torch

    from bisect_onnx.decode.flat_cache import float_type

    if float_type(module) != torch.float16:
        return arrays
    return [array.astype(np.float16) if array.dtype.kind == "f" else array for array in arrays]
