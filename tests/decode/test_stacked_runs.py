"""A step's teacher-forced and free-running runs as one stacked run, where that changes nothing.

A fake session (a toy decoder in numpy) counts the runs; the tiny Llama checks that a
real file's report is the same, run stacked or apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from bisect_onnx.decode.layout import standard_layout
from bisect_onnx.decode.steps import RuntimeStepper, StepState, run_steps

LAYOUT = standard_layout(1, positions=False)
VOCAB = 7


@dataclass(frozen=True)
class Value:
    name: str
    type: str
    shape: list


def _toy_step(tokens: np.ndarray, past: np.ndarray) -> list[np.ndarray]:
    """Each row on its own: the next token is the last plus one; the cache keeps tokens."""
    logits = np.eye(VOCAB, dtype=np.float32)[(tokens + 1) % VOCAB]
    added = np.broadcast_to(tokens[:, None, :, None], (*tokens.shape[:1], 1,
                                                       tokens.shape[1], 2)).astype(np.float32)
    present = np.concatenate([past, added], axis=2)
    return [logits, present, present + 1]


class FakeSession:
    """The toy step as an ONNX Runtime session; ``skew`` is added to a stacked run's logits."""

    def __init__(self, batch: object = "batch", skew: float = 0.0,
                 provider: str = "CPUExecutionProvider") -> None:
        self.batch, self.skew, self.batches = batch, skew, []
        self.provider = provider

    def get_providers(self) -> list[str]:
        return [self.provider, "CPUExecutionProvider"]

    def get_inputs(self) -> list[Value]:
        return [Value("input_ids", "tensor(int64)", [self.batch, "sequence"]),
                Value("attention_mask", "tensor(int64)", [self.batch, "total"]),
                *(Value(name, "tensor(float)", [self.batch, 1, "past", 2])
                  for name in LAYOUT.past[0])]

    def get_outputs(self) -> list[Value]:
        return [Value(name, "tensor(float)", [self.batch, "sequence", VOCAB])
                for name in LAYOUT.output_names()]

    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        tokens = feed["input_ids"]
        self.batches.append(tokens.shape[0])
        outputs = _toy_step(tokens, feed["past_key_values.0.key"])
        outputs[0] = outputs[0] + self.skew * (tokens.shape[0] - 1)
        return outputs


class ToyTorch:
    seconds = 0.0

    def run(self, state: StepState) -> list[np.ndarray]:
        return _toy_step(state.tokens, state.past[0])


def _loop(session: FakeSession, *, stack: bool = True, steps: int = 5):
    runner = RuntimeStepper(session, LAYOUT, "toy.onnx", stack=stack)
    empty = (np.zeros((1, 1, 0, 2), np.float32),) * 2
    loop = run_steps(ToyTorch(), runner, np.array([[1, 2, 3]]), empty, steps, rtol=1e-3,
                     atol=1e-5)
    return loop, runner


def test_both_runs_of_a_step_go_as_one_once_the_first_stacked_run_matches():
    session = FakeSession()
    loop, runner = _loop(session)
    # The prefill once; step 1 stacked and apart (the check); steps 2..5 stacked.
    assert session.batches == [1, 2, 1, 1, 2, 2, 2, 2]
    assert runner.stacking is True
    assert all(row.teacher.passed and row.free.passed for row in loop.rows)
    assert [row.free_token for row in loop.rows] == [(4,), (5,), (6,), (0,), (1,), (2,)]


@pytest.mark.parametrize("session, stack", [
    (FakeSession(skew=1e-9), True),  # a stacked run that is not the separate runs' bit for bit
    (FakeSession(batch=1), True),  # a file whose batch axis is fixed
    (FakeSession(), False),  # the caches of a stacked run over the memory budget
    (FakeSession(provider="CUDAExecutionProvider"), True),  # kernels chosen by batch size
], ids=["differs", "fixed-batch", "no-memory", "gpu"])
def test_the_runs_go_apart_where_stacking_would_change_or_cost_something(session, stack):
    loop, runner = _loop(session, stack=stack)
    assert runner.stacking is False
    assert session.batches.count(2) <= 1 and len([b for b in session.batches if b == 1]) == 11
    assert all(row.teacher.passed and row.free.passed for row in loop.rows)
    apart, _ = _loop(FakeSession(), stack=False)
    assert loop.rows == apart.rows


def test_a_real_files_report_is_the_same_stacked_or_apart(monkeypatch, tmp_path, caplog):
    pytest.importorskip("transformers")
    import bisect_onnx
    import bisect_onnx.decode.run
    from fixtures.decoders import tiny_llama

    llama = tiny_llama()
    path = tmp_path / "decoder.onnx"
    caplog.set_level("INFO", logger="bisect_onnx.decode.steps")
    stacked = bisect_onnx.bisect_decode(llama, steps=6, export=bisect_onnx.ExportOptions(
        exporter="torchscript", save_to=path))
    monkeypatch.setattr(bisect_onnx.decode.run, "stacking_fits", lambda *args: False)
    apart = bisect_onnx.bisect_decode(llama, steps=6, onnx_model=path)
    assert stacked.verdict == "parity"
    assert "go as one, stacked" in caplog.text
    assert stacked.rows == apart.rows
