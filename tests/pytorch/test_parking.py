"""Weights parked on disk while ONNX Runtime holds its copy, and given back whole."""

from __future__ import annotations

import logging
import mmap
from collections import namedtuple

import pytest
import torch
from torch import nn

import bisect_onnx
from bisect_onnx.pytorch import parking, weights_in_file
from bisect_onnx.pytorch.parking import WeightParking, parking_for


class Tied(nn.Module):
    """A tied weight, a buffer, an int buffer, a view of a parameter and a BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(50, 16)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight  # one Parameter under two names
        self.norm = nn.BatchNorm1d(16)
        self.register_buffer("steps", torch.arange(7))
        self.register_buffer("scale", torch.ones(3, 4, dtype=torch.float16))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden = self.norm(self.embed(ids).transpose(1, 2)).transpose(1, 2)
        return self.head(hidden) + self.steps.sum() + self.scale.sum()


def _map_range(parked: WeightParking, file=None) -> tuple[int, int]:
    """The address range of the map of ``file`` (the written file by default)."""
    file = file or parked._written  # noqa: SLF001
    slot = next(slot for slot in parked._slots if slot.file == file)  # noqa: SLF001
    start = slot.tensor.untyped_storage().data_ptr() - slot.offset
    return start, start + len(parked._maps[file])  # noqa: SLF001


def _inside(tensor: torch.Tensor, bounds: tuple[int, int]) -> bool:
    return bounds[0] <= tensor.untyped_storage().data_ptr() < bounds[1]


def test_parked_tensors_point_into_the_file_and_compute_the_same(tmp_path):
    model = Tied().eval()
    ids = torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        expected = model(ids)
    own = {name: tensor.untyped_storage().data_ptr() for name, tensor in model.state_dict().items()}
    parked = WeightParking(model, tmp_path, min_bytes=0)
    parked.park()
    assert parked.parked and (tmp_path / "parked-weights.bin").exists()
    bounds = _map_range(parked)
    for name, tensor in model.state_dict().items():
        assert _inside(tensor, bounds), name
        assert tensor.untyped_storage().data_ptr() != own[name]
        assert tensor.untyped_storage().data_ptr() % mmap.PAGESIZE == 0
    assert model.head.weight is model.embed.weight  # still tied
    with torch.no_grad():
        assert torch.equal(model(ids), expected)  # the same bytes, the same numbers


def test_restore_gives_each_tensor_its_own_memory_and_bytes(tmp_path):
    model = Tied().train()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    objects = {name: id(tensor) for name, tensor in model.named_parameters()}
    with parking_for(model, tmp_path) as parked:
        parked.min_bytes = 0
        parked.park()
        bounds = _map_range(parked)
        model(torch.randint(0, 50, (2, 5)))  # training: BatchNorm writes its running stats
        running = model.norm.running_mean.clone()
    assert not parked.parked and not (tmp_path / "parked-weights.bin").exists()
    assert {name: id(tensor) for name, tensor in model.named_parameters()} == objects
    assert model.embed.weight.requires_grad
    for name, tensor in model.state_dict().items():
        assert not _inside(tensor, bounds), name
        if name.startswith("norm.running") or name == "norm.num_batches_tracked":
            continue
        assert torch.equal(tensor, before[name]), name
    # What PyTorch wrote while parked is what comes back.
    assert torch.equal(model.norm.running_mean, running)
    assert not torch.equal(running, before["norm.running_mean"])


def test_views_and_small_models_stay_where_they_are(tmp_path):
    model = nn.Linear(8, 8)
    model.register_buffer("row", model.weight.data[0])  # a view into the weight's storage
    parked = WeightParking(model, tmp_path, min_bytes=0)
    parked.park()
    bounds = _map_range(parked)
    assert _inside(model.bias, bounds)
    # Parking one of two tensors over one storage would free nothing and split them.
    assert not _inside(model.weight, bounds) and not _inside(model.row, bounds)
    assert model.row.untyped_storage().data_ptr() == model.weight.untyped_storage().data_ptr()
    small = WeightParking(nn.Linear(8, 8), tmp_path)  # far below PARK_MIN_BYTES
    small.park()
    assert not small.parked


def test_no_parking_without_the_disk_for_it(tmp_path, monkeypatch, caplog):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(parking.shutil, "disk_usage", lambda _: usage(10, 10, 0))
    parked = WeightParking(Tied(), tmp_path, min_bytes=0)
    with caplog.at_level(logging.INFO, logger="bisect_onnx.pytorch.parking"):
        parked.park()
    assert not parked.parked
    assert "not parked" in caplog.text


def _summary(report) -> tuple:
    rows = [(r.onnx_value, r.figures.status, r.figures.max_abs_error, r.local.max_abs_error,
             r.local.classification)
            for r in [*report.comparisons, *report.op_comparisons]]
    culprit = report.culprit and (report.culprit.onnx_node, report.culprit.local.introduced_here)
    return report.verdict, culprit, rows, [(r.onnx_value, r.figures.max_abs_error)
                                           for r in report.final_outputs]


@pytest.mark.parametrize("name", ["avgpool_divisor", "resnet_like"])
def test_a_parked_run_reports_what_an_unparked_one_does(name, fixture_case, monkeypatch, caplog):
    model, inputs, onnx_path = fixture_case(name)
    state = {key: value.clone() for key, value in model.state_dict().items()}
    plain = bisect_onnx.bisect(model, inputs, onnx_model=onnx_path)
    monkeypatch.setattr(parking, "PARK_MIN_BYTES", 0)
    with caplog.at_level(logging.INFO, logger="bisect_onnx.pytorch.parking"):
        parked = bisect_onnx.bisect(model, inputs, onnx_model=onnx_path)
    assert "parked" in caplog.text
    assert _summary(parked) == _summary(plain)
    for key, value in model.state_dict().items():  # the caller's model, as it was
        assert torch.equal(value, state[key]), key



def test_each_sample_runs_pytorch_on_its_own_memory(fixture_case, monkeypatch, caplog):
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    doubled = {key: value * 2 for key, value in inputs.items()}
    samples = bisect_onnx.Samples([inputs, doubled])
    plain = bisect_onnx.bisect(model, samples, onnx_model=onnx_path)
    monkeypatch.setattr(parking, "PARK_MIN_BYTES", 0)
    restored = []
    original = WeightParking.restore
    monkeypatch.setattr(WeightParking, "restore", lambda self: (
        restored.append(self.parked), original(self))[1])
    with caplog.at_level(logging.INFO, logger="bisect_onnx.pytorch.parking"):
        parked = bisect_onnx.bisect(model, samples, onnx_model=onnx_path)
    parks = [r for r in caplog.records if r.getMessage().startswith("parked ")]
    assert len(parks) == 2  # once for each sample's ONNX Runtime side
    assert restored[:2] == [False, True]  # before sample 1 nothing; before sample 2 the park
    assert _summary(parked) == _summary(plain)


def test_a_caller_done_with_its_model_gets_it_released(fixture_case, monkeypatch, tmp_path):
    # The model is its own (built here, as the CLI builds its MODEL): not the fixture's.
    # At parity PyTorch never runs again after ONNX Runtime, so the weights stay parked.
    _, inputs, onnx_path = fixture_case("resnet_like")
    from fixtures.registry import FIXTURES, build_model

    model = build_model(FIXTURES["resnet_like"])
    monkeypatch.setattr(parking, "PARK_MIN_BYTES", 0)
    with parking.models_released_at_end():
        report = bisect_onnx.bisect(model, inputs, onnx_model=onnx_path)
    assert report.verdict == "parity" and not report.hidden_divergences
    assert all(tensor.numel() == 0 for tensor in model.state_dict().values())
    with pytest.raises(RuntimeError):  # a stray use fails at once
        model(*[torch.from_numpy(array) for array in inputs.values()])
    # Outside the block a run gives the model back whole.
    other = build_model(FIXTURES["resnet_like"])
    bisect_onnx.bisect(other, inputs, onnx_model=onnx_path)
    assert all(tensor.numel() > 0 for tensor in other.state_dict().values())


@pytest.mark.parametrize("parallel", [True, False])
def test_weights_read_back_in_chunks_are_the_same_bytes(tmp_path, monkeypatch, parallel):
    model = Tied()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    monkeypatch.setattr(weights_in_file, "READ_CHUNK", 1000)  # many reads, unaligned
    if not parallel:  # where os.preadv does not exist (Windows)
        monkeypatch.delattr(weights_in_file.os, "preadv")
    parked = WeightParking(model, tmp_path, min_bytes=0)
    parked.park()
    parked.restore()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name


def test_a_failed_write_leaves_the_model_as_it_was(tmp_path, monkeypatch, caplog):
    model = Tied()
    own = {name: tensor.untyped_storage().data_ptr() for name, tensor in model.state_dict().items()}

    def full_disk(tensors, path):
        path.write_bytes(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(parking, "_write", full_disk)
    parked = WeightParking(model, tmp_path, min_bytes=0)
    with caplog.at_level(logging.INFO, logger="bisect_onnx.pytorch.parking"):
        parked.park()
    assert not parked.parked and "No space left" in caplog.text
    assert not list(tmp_path.iterdir())
    assert own == {name: tensor.untyped_storage().data_ptr()
                   for name, tensor in model.state_dict().items()}


def test_weights_come_back_before_pytorch_traces_a_divergence(fixture_case, tmp_path,
                                                             monkeypatch, caplog):
    import onnx

    from bisect_onnx.pipeline import inside_op
    from bisect_onnx.search.translation_eval import CannotEvaluate
    from tests.planting import node_of_module, plant, scale_initializer_input

    model, inputs, exported = fixture_case("tiny_transformer")
    node = node_of_module(onnx.load(str(exported)), "blocks.0.attn.v", "MatMul")
    planted = tmp_path / "planted.onnx"
    plant(exported, planted, scale_initializer_input(node.name, 1, 1.05))
    monkeypatch.setattr(parking, "PARK_MIN_BYTES", 0)

    def cannot(call, arrays):  # so that the Linear's call is traced for its MatMul
        raise CannotEvaluate("refused for the test")

    monkeypatch.setattr(inside_op, "evaluate_translation", cannot)
    with caplog.at_level(logging.INFO, logger="bisect_onnx"):
        report = bisect_onnx.bisect(model, inputs, onnx_model=planted)
    assert report.culprit.onnx_node == node.name
    messages = [record.getMessage() for record in caplog.records]
    parked = next(i for i, m in enumerate(messages) if m.startswith("parked "))
    back = next(i for i, m in enumerate(messages) if m.startswith("weights read back"))
    traced = next(i for i, m in enumerate(messages) if m.startswith("tracing "))
    # Read back at once, after ONNX Runtime's run and before PyTorch runs again.
    assert parked < back < traced


def test_a_parked_run_keeps_freed_memory_for_the_weights_then_gives_it_back(
        fixture_case, monkeypatch, heap_watch):
    from bisect_onnx.pipeline import torch_sample

    model, inputs, onnx_path = fixture_case("resnet_like")
    monkeypatch.setattr(parking, "PARK_MIN_BYTES", 0)
    happened = heap_watch(torch_sample, parking)
    original = WeightParking.restore
    monkeypatch.setattr(WeightParking, "restore", lambda self: (
        happened.append("restored" if self.parked else "nothing parked"), original(self))[1])
    bisect_onnx.bisect(model, inputs, onnx_model=onnx_path)
    # ONNX Runtime's sessions allocate from the heap once the weights are parked; what
    # they free is given back only after the weights were read back into it.
    assert [event for event in happened if event.startswith("kept")] == ["kept True"]
    assert (happened.index("kept True") < happened.index("restored")
            < happened.index("given back") == len(happened) - 1)


def test_the_onnx_file_itself_is_never_parked_on(tmp_path):
    # A model read in place references the file's inline weights; parking points
    # parameters only at data files, never at the .onnx file a re-export writes over.
    import onnx
    from onnx import helper, numpy_helper

    from bisect_onnx.runtime.onnx_files import file_key
    from bisect_onnx.runtime.weights_in_place import model_in_place

    torch.manual_seed(0)
    linear = nn.Linear(64, 64, bias=False)
    weight = numpy_helper.from_array(linear.weight.detach().numpy().T.copy(), "w")
    for padding in range(4):  # the weight's bytes at an offset a float32 can start at
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"])], "g" * (padding + 1),
            [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 64])],
            initializer=[weight])
        path = tmp_path / "m.onnx"
        onnx.save(helper.make_model(graph), str(path))
        model = model_in_place(path, file_key(path))
        offset = int(next(entry.value for entry in model.graph.initializer[0].external_data
                          if entry.key == "offset"))
        if offset % 4 == 0:
            break
    before = linear.weight.detach().clone()
    pointed = WeightParking(linear, tmp_path / "run", min_bytes=0)
    (tmp_path / "run").mkdir()
    pointed.park(model, tmp_path)
    assert path in pointed._maps  # noqa: SLF001 (without model_file: the file's bytes)
    pointed.restore()
    kept_off = WeightParking(linear, tmp_path / "run", min_bytes=0)
    kept_off.park(model, tmp_path, model_file=path)
    assert kept_off.parked and path not in kept_off._maps  # noqa: SLF001 (written out)
    kept_off.restore()
    assert torch.equal(linear.weight, before)
