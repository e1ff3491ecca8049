"""A check over its memory budget: production probed, recorded values read one at a time."""

from __future__ import annotations

import weakref

import numpy as np
import onnx
import pytest

import bisect_onnx
from bisect_onnx.reference import loaded as loaded_module
from bisect_onnx.runtime.memory import estimate_values_bytes
from tests.reference.test_check import assert_same_answer, case_files

pytestmark = pytest.mark.filterwarnings("ignore::bisect_onnx.BisectOnnxWarning")


def _one_side(reference, onnx_path) -> int:
    """What a full capture of one side takes, as the run with PyTorch estimates it."""
    inputs = bisect_onnx.Reference.load(reference).inputs()
    return estimate_values_bytes(onnx.load(str(onnx_path)), inputs)


@pytest.mark.parametrize(("name", "plant_id"), [("resnet_like", "conv-weight"),
                                                ("tiny_transformer", "layernorm-epsilon")])
def test_a_check_over_its_budget_names_the_culprit_the_whole_check_names(
        fixture_case, tmp_path, monkeypatch, name, plant_id):
    model, inputs, onnx_path = case_files(fixture_case, tmp_path, name, plant_id)
    reference = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                   onnx_model=onnx_path)
    whole = bisect_onnx.check(reference)
    assert whole.search.mode != "bisection"
    budget = _one_side(reference, onnx_path)  # both sides (twice this) do not fit
    recorded = bisect_onnx.Reference.load(reference)
    every = sum(recorded.value(name).nbytes for name in recorded.value_names)

    # The recorded values alive at once, as they are read and let go.
    read: list[int] = []
    live = {"now": 0, "peak": 0}
    real_read = loaded_module.read_array

    def let_go(size):
        live["now"] -= size

    def tracked(archive, path, member):
        array = real_read(archive, path, member)
        read.append(array.nbytes)
        live["now"] += array.nbytes
        live["peak"] = max(live["peak"], live["now"])
        weakref.finalize(array, let_go, array.nbytes)
        return array

    monkeypatch.setattr(loaded_module, "read_array", tracked)
    checked = bisect_onnx.check(reference, runtime=bisect_onnx.RuntimeOptions(max_memory=budget))
    assert checked.search.mode == "bisection"
    assert "memory budget" in checked.search.reason
    assert_same_answer(checked, whole)
    # What was held at once: the recorded values alive together, and the largest probe's
    # values (the bisection keeps each value it found, as the run with PyTorch does).
    size = {name: recorded.value_entry(name) for name in recorded.value_names}
    largest_probe = max(sum(int(np.prod(size[value].shape)) * np.dtype(size[value].dtype).itemsize
                            for value in probe.values) for probe in checked.search.probes)
    assert live["peak"] + largest_probe <= budget
    # One recorded value at a time, as the probes asked: never the whole archive.
    assert sum(read) < every


def test_parity_over_the_budget_compares_the_final_outputs(fixture_case, tmp_path):
    model, inputs, onnx_path = fixture_case("tiny_mlp")
    reference = bisect_onnx.record(model, inputs, path=tmp_path / "ref.npz",
                                   onnx_model=onnx_path)
    budget = _one_side(reference, onnx_path)
    checked = bisect_onnx.check(reference, runtime=bisect_onnx.RuntimeOptions(max_memory=budget))
    assert checked.verdict == "parity"
    assert checked.search.mode == "final outputs only"
    assert "memory-parity" in [getattr(warning, "code", None) for warning in checked.warnings]
