"""Parameters parked on the ONNX file's own bytes: matched whole, never written, given back."""

from __future__ import annotations

import hashlib
import logging

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from torch import nn

import bisect_onnx
from bisect_onnx.pytorch import parking, weights_in_file
from bisect_onnx.pytorch.parking import WeightParking
from bisect_onnx.pytorch.weights_in_file import StoredWeights


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.last = nn.Linear(32, 8, bias=False)
        self.register_buffer("steps", torch.arange(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.norm(self.first(x))) + self.steps.sum()


def _save_with_external_data(tmp_path, initializers: dict[str, np.ndarray]):
    """An ONNX model holding ``initializers`` in ``weights.onnx.data``; it and its digest."""
    tensors = [numpy_helper.from_array(np.ascontiguousarray(array), name)
               for name, array in initializers.items()]
    graph = helper.make_graph([], "weights", [], [], initializer=tensors)
    model = helper.make_model(graph)
    path = tmp_path / "weights.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.onnx.data", size_threshold=0)
    return onnx.load(str(path), load_external_data=False), _digest(tmp_path)


def _digest(folder) -> str:
    return hashlib.sha256((folder / "weights.onnx.data").read_bytes()).hexdigest()


def _as_exported(model: Net) -> dict[str, np.ndarray]:
    """The weights as an exporter stores them: a Linear's weight transposed, others as they are."""
    state = {name: tensor.detach().numpy() for name, tensor in model.named_parameters()}
    return {"first_t": state["first.weight"].T, "first.bias": state["first.bias"],
            "norm.weight": state["norm.weight"], "norm.bias": state["norm.bias"],
            "last_t": state["last.weight"].T}


def _inside_map(parked: WeightParking, tensor: torch.Tensor, file) -> bool:
    mapped = parked._maps[file]  # noqa: SLF001
    slot = next(slot for slot in parked._slots if slot.file == file)  # noqa: SLF001
    start = slot.tensor.untyped_storage().data_ptr() - slot.offset
    return start <= tensor.untyped_storage().data_ptr() < start + len(mapped)


def test_parameters_point_at_the_files_bytes_and_come_back_whole(tmp_path):
    model = Net().eval()
    weights = _as_exported(model)
    # A decoy of the last weight's shape, one element off at the very end, stored first:
    # its head matches, so only the whole comparison tells it apart.
    decoy = weights["last_t"].copy()
    decoy.reshape(-1)[-1] += 1
    proto, digest = _save_with_external_data(tmp_path, {"decoy": decoy, **weights})
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    x = torch.randn(3, 16)
    with torch.no_grad():
        expected = model(x)
    run = tmp_path / "run"
    run.mkdir()
    parked = WeightParking(model, run, min_bytes=0)
    parked.park(proto, tmp_path)
    data = (tmp_path / "weights.onnx.data").resolve()
    for _, tensor in model.named_parameters():
        assert _inside_map(parked, tensor, data)
    assert _inside_map(parked, model.steps, parked._written)  # noqa: SLF001 - buffers are written
    slots = {slot.tensor is model.last.weight: slot for slot in parked._slots}  # noqa: SLF001
    # The decoy is not taken for the last weight: it lies after it in the file.
    assert slots[True].transposed and slots[True].offset >= decoy.nbytes
    assert not model.first.weight.is_contiguous()  # the file's transpose, viewed
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, rtol=0, atol=1e-6)
        model.first.bias.add_(1.0)  # a write while parked stays this process's own
    assert _digest(tmp_path) == digest
    parked.restore()
    assert not parked.parked and _digest(tmp_path) == digest
    assert torch.equal(model.first.bias, before["first.bias"] + 1.0)
    for name, tensor in model.state_dict().items():
        assert tensor.is_contiguous()
        if name != "first.bias":
            assert torch.equal(tensor, before[name]), name


def test_an_edited_weight_is_written_out_not_taken_from_the_file(tmp_path):
    model = Net()
    weights = _as_exported(model)
    weights["last_t"] = weights["last_t"].copy()
    weights["last_t"][3, 5] *= 1.003  # a planted edit, as a user's file may carry
    proto, _ = _save_with_external_data(tmp_path, weights)
    parked = WeightParking(model, tmp_path, min_bytes=0)
    parked.park(proto, tmp_path)
    files = {id(slot.tensor): slot.file for slot in parked._slots}  # noqa: SLF001
    assert files[id(model.last.weight)] == parked._written  # noqa: SLF001
    for name, tensor in model.named_parameters():
        if name != "last.weight":
            assert files[id(tensor)] == (tmp_path / "weights.onnx.data").resolve(), name
    parked.restore()
    assert model.last.weight[5, 3] == torch.from_numpy(_as_exported(model)["last_t"])[3, 5]


def test_a_stored_tensor_serves_one_parameter_only(tmp_path):
    zeros = np.zeros(32, dtype=np.float32)
    proto, _ = _save_with_external_data(tmp_path, {"zeros": zeros,
                                                   "halves": np.full(8, 0.5, np.float16)})
    first, second = (nn.Parameter(torch.zeros(32)) for _ in range(2))
    with StoredWeights(proto, tmp_path) as stored:
        assert stored.find(first) is not None
        assert stored.find(second) is None  # shared bytes would see each other's writes
        assert stored.find(nn.Parameter(torch.full((8,), 0.5))) is None  # not float16
        assert stored.find(nn.Parameter(torch.full((8,), 0.5, dtype=torch.float16))) is not None


@pytest.mark.parametrize("column", [None, 0, 5, 9, 10])
def test_a_transposed_weight_is_compared_in_every_block_of_rows(tmp_path, monkeypatch, column):
    """A transposed weight is compared a few of the file's rows at a time: each block counts."""
    monkeypatch.setattr(weights_in_file, "_ROWS_AT_ONCE", 4)  # blocks of columns 0-3, 4-7, 8-10
    weight = nn.Parameter(torch.randn(6, 11))
    stored_t = weight.detach().numpy().T.copy()
    if column is not None:  # one element off, in the first, a middle or the last block
        stored_t[column, 2] = np.nextafter(stored_t[column, 2], np.float32(np.inf))
    proto, _ = _save_with_external_data(tmp_path, {"weight_t": stored_t})
    with StoredWeights(proto, tmp_path) as stored:
        found = stored.find(weight)
    assert (found is not None) == (column is None)
    assert found is None or found.transposed


@pytest.mark.parametrize("name", ["tiny_transformer", "resnet_like"])
def test_a_run_on_an_external_data_export_parks_on_its_bytes(name, fixture_case, tmp_path,
                                                             monkeypatch, caplog):
    model, inputs, exported = fixture_case(name)
    path = tmp_path / "model.onnx"
    onnx.save_model(onnx.load(str(exported)), str(path), save_as_external_data=True,
                    location="model.onnx.data")
    digest = hashlib.sha256((tmp_path / "model.onnx.data").read_bytes()).hexdigest()
    state = {key: value.clone() for key, value in model.state_dict().items()}
    plain = bisect_onnx.bisect(model, inputs, onnx_model=path)
    monkeypatch.setattr(parking, "PARK_MIN_BYTES", 0)
    with caplog.at_level(logging.INFO, logger="bisect_onnx.pytorch.parking"):
        parked = bisect_onnx.bisect(model, inputs, onnx_model=path)
    message = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("parked"))
    assert "(0 B of them" not in message and "in the ONNX file's own data" in message
    def errors(report):
        return [(r.onnx_value, r.figures.max_abs_error) for r in report.comparisons]

    assert (parked.verdict, errors(parked)) == (plain.verdict, errors(plain))
    assert hashlib.sha256((tmp_path / "model.onnx.data").read_bytes()).hexdigest() == digest
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), key


@pytest.mark.parametrize("failing", ["_map", "__init__"])  # mapping, or reading the sizes
def test_a_data_file_that_cannot_be_mapped_leaves_the_weights_to_be_written(
        failing, tmp_path, monkeypatch, caplog):
    model = Net()
    proto, _ = _save_with_external_data(tmp_path, _as_exported(model))

    def no_device(*args, **kwargs):
        raise OSError(19, "No such device")

    monkeypatch.setattr(StoredWeights, failing, no_device)
    parked = WeightParking(model, tmp_path, min_bytes=0)
    with caplog.at_level(logging.INFO, logger="bisect_onnx.pytorch.parking"):
        parked.park(proto, tmp_path)
    assert "No such device" in caplog.text
    assert {slot.file for slot in parked._slots} == {parked._written}  # noqa: SLF001
    assert len(parked._slots) == len(list(model.parameters())) + 1  # noqa: SLF001


def test_each_match_is_read_ahead_of_its_comparison(tmp_path, monkeypatch):
    model = Net()
    proto, _ = _save_with_external_data(tmp_path, _as_exported(model))
    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(weights_in_file, "READ_AHEAD", 64)
    monkeypatch.setattr(weights_in_file, "advise", lambda mapped, advice, offset, nbytes, **_:
                        asked.append((offset, nbytes)) if advice == "MADV_WILLNEED" else None)
    parked = WeightParking(model, tmp_path / "run", min_bytes=0)
    (tmp_path / "run").mkdir()
    parked.park(proto, tmp_path)
    slots = [slot for slot in parked._slots if slot.file != parked._written]  # noqa: SLF001
    assert len(slots) == len(list(model.parameters()))
    size = (tmp_path / "weights.onnx.data").stat().st_size
    for slot in slots:  # the tensor, and what lies after it in the file
        assert (slot.offset, min(slot.nbytes + 64, size - slot.offset)) in asked
    parked.restore()
