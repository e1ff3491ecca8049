"""PyTorch's steps first, its weights parked while the runtime steps; in turn where they cannot.

The tiny decoders are far below the size parking starts at: it is forced here, and the
report must be the one of a run that holds both copies, the model given back bit for bit.
"""

from __future__ import annotations

import logging
import re

import numpy as np
import onnx
import pytest
import torch

pytest.importorskip("transformers")

import bisect_onnx  # noqa: E402
import bisect_onnx.pytorch.parking as parking  # noqa: E402
from bisect_onnx.decode.html import decode_html  # noqa: E402
from bisect_onnx.decode.layout import standard_layout  # noqa: E402
from bisect_onnx.decode.steps import StepState, run_reference  # noqa: E402
from fixtures.decoders import PlainDecoder, tiny_llama  # noqa: E402
from tests.planting import scale_past_key  # noqa: E402


@pytest.fixture(scope="module")
def llama_file(tmp_path_factory):
    """Tiny Llama's TorchScript export, every weight in an external data file."""
    folder = tmp_path_factory.mktemp("llama")
    path = folder / "exported.onnx"
    bisect_onnx.bisect_decode(tiny_llama(), steps=0, export=bisect_onnx.ExportOptions(
        exporter="torchscript", save_to=path))
    model = onnx.load(str(path))
    external = folder / "decoder.onnx"
    onnx.save(model, str(external), save_as_external_data=True, location="decoder.data",
              size_threshold=0)
    return external


def _without_times(report: bisect_onnx.DecodeReport) -> dict:
    """The JSON report but its times (and the bisection's, told by its summary)."""
    found = report.to_dict()
    found.pop("seconds")
    bisection = found.pop("bisection")
    found["bisection"] = report.bisection.summary() if bisection else None
    return found


def _bits(model: torch.nn.Module) -> dict[str, tuple[int, bytes]]:
    """Each tensor's identity and bytes."""
    return {name: (id(tensor), tensor.detach().contiguous().numpy().tobytes())
            for name, tensor in [*model.named_parameters(), *model.named_buffers()]}


def _planted(source, target):
    """Layer 0's past key scaled by 1.01 on its way in: step 1 fails, bisected."""
    model = onnx.load(str(source))
    scale_past_key(model.graph)
    onnx.save(model, str(target), save_as_external_data=True, location="planted.data",
              size_threshold=0)
    return target


@pytest.mark.parametrize("planted", [False, True], ids=["parity", "introduced"])
def test_parked_weights_leave_the_report_and_the_model_as_they_were(
        llama_file, tmp_path, monkeypatch, caplog, planted):
    path = _planted(llama_file, tmp_path / "planted.onnx") if planted else llama_file
    model = tiny_llama()
    held = bisect_onnx.bisect_decode(model, steps=4, onnx_model=path)
    before = _bits(model)

    monkeypatch.setattr(parking, "PARK_MIN_BYTES", 1)  # the tiny model parked as a large one
    caplog.set_level(logging.INFO, logger="bisect_onnx.pytorch.parking")
    parked = bisect_onnx.bisect_decode(model, steps=4, onnx_model=path)

    parked_message = re.search(r"parked (.+?) of weights \((.+?) of them in the ONNX file's",
                               caplog.text)
    assert parked_message and "read back" in caplog.text
    assert parked_message[2] != "0 B"  # the Linears pointed at the file's own bytes
    assert _without_times(parked) == _without_times(held)
    assert str(parked) == str(held)
    assert decode_html(parked) == decode_html(held)
    assert _bits(model) == before
    if planted:
        assert parked.finding.step == 1 and "planted_scale" in parked.finding.culprit
    else:
        assert parked.verdict == "parity"


class CroppingDecoder(PlainDecoder):
    """One attention layer whose cache keeps its last 4 positions: a sliding window."""

    WINDOW = 4

    def kept(self, cache: torch.Tensor) -> torch.Tensor:
        return cache[:, :, -self.WINDOW:]


def test_a_cache_that_drops_positions_steps_both_sides_in_turn(caplog):
    """No one cache holds every step's: the steps are compared as they come, as before."""
    caplog.set_level(logging.INFO, logger="bisect_onnx.decode.steps")
    report = bisect_onnx.bisect_decode(
        CroppingDecoder().eval(), np.array([1, 2, 3]), steps=4,
        export=bisect_onnx.ExportOptions(exporter="torchscript"),
        decode=bisect_onnx.DecodeOptions(cache_shape=(1, 1, 8)))
    assert "not its past with positions added: the two sides step in turn" in caplog.text
    assert report.verdict == "parity", str(report)
    # The window: 3, then 4 positions held; each step's row compared with its own cache.
    assert [row.position for row in report.rows] == [0, 3, 4, 4, 4]


class ToyTorch:
    """A step that keeps its cache growing, or keeps only the last ``window`` positions."""

    def __init__(self, window: int | None = None) -> None:
        self.window, self.seconds = window, 0.0

    def run(self, state: StepState) -> list[np.ndarray]:
        tokens = state.tokens
        logits = np.eye(5, dtype=np.float32)[(tokens + 1) % 5]
        added = tokens[:, None, :, None].astype(np.float32)
        present = np.concatenate([state.past[0], added], axis=2)
        if self.window is not None:
            present = present[:, :, -self.window:]
        return [logits, present]


def test_the_kept_cache_gives_every_steps_inputs_and_outputs():
    empty = (np.zeros((1, 1, 0, 1), np.float32),)
    kept = run_reference(ToyTorch(), np.array([[1, 2]]), empty, 3)
    assert kept is not None and kept.lengths == (2, 3, 4, 5)
    assert kept.cache[0].ravel().tolist() == [1, 2, 3, 4, 0]
    assert kept.state(2).past[0].ravel().tolist() == [1, 2, 3]
    assert kept.state(2).tokens.tolist() == [[4]]
    assert kept.outputs(2)[1].ravel().tolist() == [1, 2, 3, 4]
    assert kept.state(0).past[0].shape == (1, 1, 0, 1)
    assert kept.state(1).arrays(standard_layout(0, positions=False))[1].shape == (1, 3)
    assert run_reference(ToyTorch(window=3), np.array([[1, 2]]), empty, 3) is None
