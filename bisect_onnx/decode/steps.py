"""The step loop: a prompt and N greedy steps in PyTorch and in ONNX Runtime, twice over.

Each step runs PyTorch once and the runtime twice: teacher-forced, on PyTorch's own
tokens and cache (what the runtime computes from the reference's state, so an error
there is introduced at this step), and free-running, on the runtime's own tokens and
cache from the previous step (what generation would do, so an error there that the
teacher-forced run lacks came through the cache).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.decode.step_report import Deviation, StepComparison, StepRow

if TYPE_CHECKING:
    import onnxruntime as ort

    from bisect_onnx.decode.flat_cache import DecoderStep
    from bisect_onnx.decode.layout import CacheLayout

__all__ = ["StepState", "TorchStepper", "RuntimeStepper", "StepLoop", "open_session",
           "run_steps"]


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
        self.module = step.module
        self.layout = step.layout
        self.seconds = 0.0

    def run(self, state: StepState) -> list[np.ndarray]:
        """The step's outputs (logits, then each layer's key and value) as float32 arrays."""
        import torch

        started = time.perf_counter()
        with torch.no_grad():
            outputs = self.module(*[torch.from_numpy(a) for a in state.arrays(self.layout)])
        self.seconds += time.perf_counter() - started
        return [output.detach().float().numpy() for output in outputs]


def open_session(path: Path, *, provider: str, opt_level: str) -> ort.InferenceSession:
    """The session that runs every step; its inputs and outputs name the cache's layout."""
    from bisect_onnx.runtime.onnxruntime.sessions import SessionSettings, create_session

    # PyTorch computes between the runs: threads left spinning would starve it.
    settings = SessionSettings(provider, opt_level, spinning=False)
    return create_session(path, model_dir=path.parent, label=path.name, settings=settings)


class RuntimeStepper:
    """The runtime side: one ONNX Runtime session run per step."""

    def __init__(self, session: ort.InferenceSession, layout: CacheLayout, label: str) -> None:
        self.session = session
        self.layout = layout
        self.label = label
        self.types = {value.name: value.type for value in self.session.get_inputs()}
        self.seconds = 0.0

    def run(self, state: StepState) -> list[np.ndarray]:
        """The step's outputs in the layout's order, as float32 arrays.

        An input the file does not take is not fed: the TorchScript exporter drops an
        ``attention_mask`` the model never reads.
        """
        feed = {name: _as_type(array, self.types[name])
                for name, array in zip(self.layout.input_names(), state.arrays(self.layout),
                                       strict=True) if name in self.types}
        started = time.perf_counter()
        try:
            outputs = self.session.run(self.layout.output_names(), feed)
        except Exception as error:
            from bisect_onnx.runtime.onnxruntime.sessions import refusal

            raise refusal(f"ONNX Runtime failed to run a decode step of {self.label}",
                          error) from error
        self.seconds += time.perf_counter() - started
        return [np.asarray(output, dtype=np.float32) for output in outputs]


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
    """Step 0 (the prompt, an empty cache) and ``steps`` greedy steps on both sides."""
    reference = free = StepState(prompt.astype(np.int64), empty_past)
    rows: list[StepRow] = []
    introduced: StepState | None = None
    for step in range(steps + 1):
        expected = torch_side.run(reference)
        teacher = runtime.run(reference)
        own = runtime.run(free) if step else teacher  # at step 0 both sides' states agree
        rows.append(StepRow(
            step=step, position=reference.past_length, length=int(reference.tokens.shape[1]),
            reference_token=_chosen(expected), teacher_token=_chosen(teacher),
            free_token=_chosen(own),
            teacher=_compare(expected, teacher, rtol, atol),
            free=_compare(expected, own, rtol, atol)))
        if introduced is None and not rows[-1].teacher.passed:
            introduced = reference
        reference, free = reference.after(expected), free.after(own)
    return StepLoop(tuple(rows), torch_side.seconds, runtime.seconds, introduced)


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
    difference = np.abs(actual.astype(np.float64) - expected)
    bad = ~(difference <= atol + rtol * np.abs(expected))  # NaN fails
    return Deviation(float(np.nanmax(difference)) if not np.isnan(difference).all()
                     else float("nan"), passed=not bool(bad.any()))
