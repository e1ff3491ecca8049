"""The step loop: a prompt and N greedy steps in PyTorch and in ONNX Runtime, twice over.

Each step runs PyTorch once and the runtime twice: teacher-forced, on PyTorch's own
tokens and cache (what the runtime computes from the reference's state, so an error
there is introduced at this step), and free-running, on the runtime's own tokens and
cache from the previous step (what generation would do, so an error there that the
teacher-forced run lacks came through the cache).

PyTorch's steps run first, all of them, before the runtime's session exists
(:func:`run_reference`): its weights can then be parked on disk while the session
holds its copy. What the runtime's steps are compared with is kept meanwhile: each
step's logits, and one cache, the last step's, whose first positions are every
earlier step's (each step returns its past with the new positions added), checked
as PyTorch steps. A cache that is not (a window that drops old positions) leaves the
two sides stepping in turn, each step's values compared as they come
(:func:`run_steps`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.decode.step_report import Deviation, StepComparison, StepRow
from bisect_onnx.errors import BisectOnnxError

if TYPE_CHECKING:
    import onnxruntime as ort

    from bisect_onnx.decode.flat_cache import DecoderStep
    from bisect_onnx.decode.layout import CacheLayout

__all__ = ["StepState", "TorchStepper", "RuntimeStepper", "StepLoop", "ReferenceSteps",
           "open_session", "run_steps", "run_reference", "replay_steps"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepState:
    """What one side feeds a step: the tokens to add and the cache so far."""

    tokens: np.ndarray
    """``[batch, sequence]`` int64: the prompt at step 0, then the token chosen last."""
    past: tuple[np.ndarray, ...]
    """Each layer's key then value, ``[batch, heads, past_sequence, head_dim]``."""

    @property
    def past_length(self) -> int:
        """How many positions the cache holds."""
        return int(self.past[0].shape[2]) if self.past else 0

    def arrays(self, layout: CacheLayout) -> list[np.ndarray]:
        """The step's inputs in its positional order (mask and positions made here)."""
        batch, length = self.tokens.shape
        total = self.past_length + length
        head = [self.tokens.astype(np.int64), np.ones((batch, total), dtype=np.int64)]
        if layout.positions:
            positions = np.arange(self.past_length, total, dtype=np.int64)
            head.append(np.tile(positions, (batch, 1)))  # writable: torch shares it
        return head + list(self.past)

    def after(self, outputs: Sequence[np.ndarray]) -> StepState:
        """The next step's state: the greedy token of the last position, the cache returned."""
        chosen = outputs[0][:, -1].argmax(axis=-1).astype(np.int64)[:, None]
        return StepState(chosen, tuple(outputs[1:]))


class TorchStepper:
    """The PyTorch side: the step module on numpy arrays, under ``no_grad``."""

    def __init__(self, step: DecoderStep) -> None:
        from bisect_onnx.decode.flat_cache import float_type

        self.module = step.module
        self.layout = step.layout
        self.seconds = 0.0
        self.float_type = float_type(self.module)
        """The model's own float type: a float16 model's cache goes in as float16."""

    def run(self, state: StepState) -> list[np.ndarray]:
        """The step's outputs (logits, then each layer's key and value) as float32 arrays.

        A cache kept as float32 goes in as the model's float type (float16, bfloat16):
        it came out of the model in that type, so nothing is rounded on the way back.
        """
        import torch

        started = time.perf_counter()
        inputs = [torch.from_numpy(array) for array in state.arrays(self.layout)]
        if self.float_type is not None:
            inputs = [tensor.to(self.float_type) if tensor.is_floating_point() else tensor
                      for tensor in inputs]
        with torch.no_grad():
            outputs = self.module(*inputs)
        self.seconds += time.perf_counter() - started
        return [output.detach().float().numpy() for output in outputs]


def open_session(path: Path, *, provider: str, opt_level: str) -> ort.InferenceSession:
    """The session that runs every step; its inputs and outputs name the cache's layout."""
    from bisect_onnx.runtime.onnxruntime.sessions import SessionSettings, create_session

    # PyTorch computes between the runs: threads left spinning would starve it.
    settings = SessionSettings(provider, opt_level, spinning=False)
    return create_session(path, model_dir=path.parent, label=path.name, settings=settings)


class RuntimeStepper:
    """The runtime side: one ONNX Runtime session run per step and state.

    A step's teacher-forced and free-running runs may go as one run of both states
    stacked along the batch axis (:meth:`run_both`): reading the weights dominates a
    decode step, and two rows cost little more than one. On ONNX Runtime's CPU
    provider the rows came out as the separate runs' bit for bit in every file tried;
    that is checked on the first step that runs both, and where it does not hold (or
    the file's batch axis is fixed, or another provider runs it: a GPU's matrix kernels
    may pick their algorithm by batch size) every step runs the two states apart.
    """

    def __init__(self, session: ort.InferenceSession, layout: CacheLayout, label: str, *,
                 stack: bool = True) -> None:
        """``stack``: whether the two runs of a step may go as one (memory allows it)."""
        self.session = session
        self.layout = layout
        self.label = label
        self.types = {value.name: value.type for value in self.session.get_inputs()}
        self.seconds = 0.0
        on_cpu = session.get_providers()[:1] == ["CPUExecutionProvider"]
        self.stacking: bool | None = (None if stack and on_cpu and _batch_is_free(session)
                                      else False)
        """Whether the two runs of a step go as one: ``None`` until the first step
        that runs both has compared the stacked run with the separate ones."""

    def run(self, state: StepState) -> list[np.ndarray]:
        """The step's outputs in the layout's order, as float32 arrays.

        An input the file does not take is not fed: the TorchScript exporter drops an
        ``attention_mask`` the model never reads.
        """
        return self._run(self._feed(state.arrays(self.layout)))

    def run_both(self, teacher: StepState,
                 free: StepState) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The outputs of the teacher-forced and the free-running run of one step."""
        if self.stacking is False:
            return self.run(teacher), self.run(free)
        stacked = self._run_stacked(teacher, free)
        if self.stacking is None:
            separate = self.run(teacher), self.run(free)
            self.stacking = stacked is not None and all(
                np.array_equal(one, other, equal_nan=True)
                for ours, theirs in zip(stacked, separate, strict=True)
                for one, other in zip(ours, theirs, strict=True))
            logger.info("the teacher-forced and free-running runs of a step go %s",
                        "as one, stacked (its rows are the separate runs' bit for bit)"
                        if self.stacking else "apart (a stacked run differs or fails)")
            return separate
        return stacked if stacked is not None else (self.run(teacher), self.run(free))

    def _run_stacked(self, teacher: StepState, free: StepState,
                     ) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
        """Both states as one batch, the outputs split again; ``None`` if it fails."""
        batch = int(teacher.tokens.shape[0])
        feed = self._feed([np.concatenate(pair) for pair in zip(
            teacher.arrays(self.layout), free.arrays(self.layout), strict=True)])
        try:
            outputs = self._run(feed)
        except BisectOnnxError as error:  # the two runs apart say what fails, if anything
            logger.debug("a stacked run failed: %s", error)
            return None
        # The free-running half is kept as the next step's cache: its own copy, so
        # that it does not hold the teacher-forced half alive with it.
        return ([output[:batch] for output in outputs],
                [output[batch:].copy() for output in outputs])

    def _feed(self, arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
        return {name: _as_type(array, self.types[name])
                for name, array in zip(self.layout.input_names(), arrays, strict=True)
                if name in self.types}

    def _run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        started = time.perf_counter()
        try:
            outputs = self.session.run(self.layout.output_names(), feed)
        except Exception as error:
            from bisect_onnx.runtime.onnxruntime.sessions import refusal

            raise refusal(f"ONNX Runtime failed to run a decode step of {self.label}",
                          error) from error
        finally:
            self.seconds += time.perf_counter() - started
        return [np.asarray(output, dtype=np.float32) for output in outputs]


def _batch_is_free(session: ort.InferenceSession) -> bool:
    """Whether every input and output of ``session`` has a batch axis of any size."""
    values = [*session.get_inputs(), *session.get_outputs()]
    return all(value.shape and not isinstance(value.shape[0], int) for value in values)


def _as_type(array: np.ndarray, onnx_type: str) -> np.ndarray:
    """``array`` in the element type the session's input declares (``tensor(int32)``)."""
    kinds = {"tensor(int32)": np.int32, "tensor(int64)": np.int64, "tensor(float)": np.float32,
             "tensor(float16)": np.float16, "tensor(double)": np.float64, "tensor(bool)": bool}
    kind = kinds.get(onnx_type)
    return array.astype(kind) if kind is not None and array.dtype != kind else array


@dataclass(frozen=True)
class StepLoop:
    """What :func:`run_steps` returns: the rows, and where each side spent its time."""

    rows: tuple[StepRow, ...]
    torch_seconds: float
    runtime_seconds: float
    first_introduced: StepState | None
    """PyTorch's state at the first step the teacher-forced run fails (the inputs of
    its bisection); only that one is kept, so memory holds two caches, not one a step."""


def run_steps(torch_side: TorchStepper, runtime: RuntimeStepper, prompt: np.ndarray,
              empty_past: tuple[np.ndarray, ...], steps: int, *,
              rtol: float, atol: float) -> StepLoop:
    """Step 0 (the prompt, an empty cache) and ``steps`` greedy steps, the sides in turn."""
    reference = free = StepState(prompt.astype(np.int64), empty_past)
    rows: list[StepRow] = []
    introduced: StepState | None = None
    for step in range(steps + 1):
        expected = torch_side.run(reference)
        own = _runtime_step(runtime, step, reference, free, expected, rows, rtol, atol)
        if introduced is None and not rows[-1].teacher.passed:
            introduced = reference
        reference, free = reference.after(expected), free.after(own)
    return StepLoop(tuple(rows), torch_side.seconds, runtime.seconds, introduced)


@dataclass(frozen=True)
class ReferenceSteps:
    """PyTorch's prompt and greedy steps, kept for the runtime's steps run after them.

    One cache, not one a step: each step's past and present are the first positions
    of the last step's cache (:func:`run_reference` checked it, step by step).
    """

    tokens: tuple[np.ndarray, ...]
    """Each step's ``[batch, sequence]`` tokens: the prompt, then the token chosen."""
    logits: tuple[np.ndarray, ...]
    """Each step's logits, as PyTorch returned them."""
    cache: tuple[np.ndarray, ...]
    """The last step's present: each layer's key then value."""
    lengths: tuple[int, ...]
    """How many positions the cache holds after each step; before step 0, none."""
    seconds: float
    """Time inside PyTorch's calls."""

    def state(self, step: int) -> StepState:
        """What PyTorch was fed at ``step``: its tokens and its past, a copy of its own."""
        held = self.lengths[step - 1] if step else 0
        return StepState(self.tokens[step], tuple(np.ascontiguousarray(array[:, :, :held])
                                                  for array in self.cache))

    def outputs(self, step: int) -> list[np.ndarray]:
        """What PyTorch returned at ``step``: its logits and its present (views)."""
        return [self.logits[step], *(array[:, :, :self.lengths[step]] for array in self.cache)]


def run_reference(torch_side: TorchStepper, prompt: np.ndarray,
                  empty_past: tuple[np.ndarray, ...], steps: int) -> ReferenceSteps | None:
    """PyTorch's step 0 and ``steps`` greedy steps, kept; ``None`` where one cache cannot be.

    Each step's present must be its past, bit for bit, with positions added after it:
    then the last step's cache holds every step's. Where a step's does not (a cache
    that drops or reorders positions), nothing is kept and ``None`` says so.
    """
    state = StepState(prompt.astype(np.int64), empty_past)
    tokens: list[np.ndarray] = []
    logits: list[np.ndarray] = []
    lengths: list[int] = []
    for step in range(steps + 1):
        outputs = torch_side.run(state)
        if not _extends(state.past, outputs[1:]):
            logger.info("PyTorch's cache at step %d is not its past with positions added: "
                        "the two sides step in turn", step)
            return None
        tokens.append(state.tokens)
        logits.append(outputs[0])
        lengths.append(int(outputs[1].shape[2]) if len(outputs) > 1 else 0)
        state = state.after(outputs)
    return ReferenceSteps(tuple(tokens), tuple(logits), state.past, tuple(lengths),
                          torch_side.seconds)


def _extends(past: Sequence[np.ndarray], present: Sequence[np.ndarray]) -> bool:
    """Whether each of ``present`` is its entry of ``past`` with positions added (axis 2).

    And every layer's holds as many positions.
    """
    def extends(old: np.ndarray, new: np.ndarray) -> bool:
        if (old.ndim < 3 or new.ndim != old.ndim or new.dtype != old.dtype
                or new.shape[:2] != old.shape[:2] or new.shape[3:] != old.shape[3:]
                or new.shape[2] < old.shape[2]):
            return False
        kept = new[:, :, :old.shape[2]]
        if old.dtype.kind == "f":  # bit for bit: -0.0 is not 0.0, a NaN its own bits
            kept, old = kept.view(f"u{old.itemsize}"), old.view(f"u{old.itemsize}")
        return bool(np.array_equal(kept, old))

    # One length for every layer: each step's cache is the last one's first positions.
    return (len(past) == len(present) and len({array.shape[2:3] for array in present}) <= 1
            and all(map(extends, past, present)))


def replay_steps(reference: ReferenceSteps, runtime: RuntimeStepper, *, rtol: float,
                 atol: float) -> StepLoop:
    """The runtime's steps against PyTorch's kept ones, teacher-forced and free-running.

    The same runs and rows as :func:`run_steps`'s, PyTorch's values read from
    ``reference`` instead of computed in turn.
    """
    free = reference.state(0)
    rows: list[StepRow] = []
    introduced: StepState | None = None
    for step in range(len(reference.logits)):
        teacher = reference.state(step)
        own = _runtime_step(runtime, step, teacher, free, reference.outputs(step), rows,
                            rtol, atol)
        if introduced is None and not rows[-1].teacher.passed:
            introduced = teacher
        free = free.after(own)
    return StepLoop(tuple(rows), reference.seconds, runtime.seconds, introduced)


def _runtime_step(runtime: RuntimeStepper, step: int, reference: StepState, free: StepState,
                  expected: Sequence[np.ndarray], rows: list[StepRow], rtol: float,
                  atol: float) -> list[np.ndarray]:
    """Run a step teacher-forced and free-running, add its row; the free-running outputs."""
    if step:
        teacher, own = runtime.run_both(reference, free)
    else:  # at step 0 both sides' states agree
        teacher = own = runtime.run(reference)
    rows.append(StepRow(
        step=step, position=reference.past_length, length=int(reference.tokens.shape[1]),
        reference_token=_chosen(expected), teacher_token=_chosen(teacher),
        free_token=_chosen(own),
        teacher=_compare(expected, teacher, rtol, atol),
        free=_compare(expected, own, rtol, atol)))
    return own


def _chosen(outputs: Sequence[np.ndarray]) -> tuple[int, ...]:
    return tuple(int(t) for t in outputs[0][:, -1].argmax(axis=-1))


def _compare(expected: Sequence[np.ndarray], actual: Sequence[np.ndarray], rtol: float,
             atol: float) -> StepComparison:
    """The logits' and each layer's key and value deviation of ``actual`` from ``expected``."""
    deviations = [_deviation(e, a, rtol, atol) for e, a in zip(expected, actual, strict=True)]
    cache = deviations[1:]
    return StepComparison(logits=deviations[0], keys=tuple(cache[0::2]),
                          values=tuple(cache[1::2]))


def _deviation(expected: np.ndarray, actual: np.ndarray, rtol: float, atol: float) -> Deviation:
    if expected.shape != actual.shape:
        return Deviation(float("inf"), passed=False)
    if expected.size == 0:
        return Deviation(0.0, passed=True)
    with np.errstate(invalid="ignore"):  # an infinity less itself: NaN, judged below
        difference = np.abs(np.subtract(actual, expected, dtype=np.float64))
    largest = difference.max()
    # Within atol everywhere, it passes whatever rtol adds: most values of a run at
    # parity go no further (330 comparisons a 32-step run of 2 layers; NaN goes on).
    if largest <= atol:
        return Deviation(float(largest), passed=True)
    finite = np.isfinite(expected) & np.isfinite(actual)
    if finite.all():  # the largest is the largest error
        return Deviation(float(largest), passed=bool(
            (difference <= atol + rtol * np.abs(expected)).all()))
    # As the judge rules (judge/compare.py), a NaN against a NaN and an infinity against
    # the same infinity agree (the model computes them so); any other non-finite pair
    # fails (opposite infinities too, which an infinite rtol term would let pass).
    agree = ~finite & ((np.isnan(expected) & np.isnan(actual)) | (actual == expected))
    within = finite & (difference <= atol + rtol * np.abs(expected))
    difference[agree] = 0.0
    return Deviation(float(np.nanmax(difference)) if not np.isnan(difference).all()
                     else float("nan"), passed=bool((within | agree).all()))
