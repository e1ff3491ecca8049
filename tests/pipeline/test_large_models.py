"""Models whose weights live in external data, as every model over 2 GB must.

No real 2 GB model: a small one saved with every weight external stands in for it,
and the limits that decide what a big model gets (protobuf's 2 GiB, the size past
which two sessions are not held at once) are lowered where a test needs the big path.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
import weakref
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx import numpy_helper
from torch import nn

import bisect_onnx
from bisect_onnx.graph.walk import graph_tensors
from bisect_onnx.graph.weights import copy_model, link_or_copy, weight_bytes, write_external_data
from bisect_onnx.pipeline import onnx_vs_onnx
from bisect_onnx.report import repro
from bisect_onnx.runtime.onnxruntime import runner as onnx_side
from bisect_onnx.runtime.onnxruntime.sessions import create_session
from tests.torch_warnings import DYNAMO_LEAFSPEC_DEPRECATED

pytestmark = DYNAMO_LEAFSPEC_DEPRECATED

MODULE_ROWS = bisect_onnx.SearchOptions(granularity="module")

WEIGHTS_FILE = "weights.bin"


class Mlp(nn.Module):
    """Two Linear layers around a GELU: enough for a culprit, local checks and a repro."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


@pytest.fixture(scope="module")
def external_model(tmp_path_factory):
    """The model, its input, and a read-only folder holding its export with fc2's weight
    scaled (a planted bug), every weight in one external file."""
    model = Mlp().eval()
    x = np.random.RandomState(0).randn(4, 16).astype(np.float32)
    program = torch.onnx.export(model, (torch.from_numpy(x),), dynamo=True, verbose=False)
    proto = program.model_proto
    fc2 = next(init for init in proto.graph.initializer if init.name == "fc2.weight")
    fc2.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(fc2) * np.float32(1.01),
                                         fc2.name))
    # Every weight's bytes (those of 16 values or more are unmistakable in a file).
    weights = {init.name: numpy_helper.to_array(init).tobytes()
               for init in proto.graph.initializer}
    folder = tmp_path_factory.mktemp("user")
    path = folder / "model.onnx"
    onnx.save_model(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=WEIGHTS_FILE, size_threshold=0)
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)  # root ignores it: the listing is checked too
    yield model, x, path, weights, fc2.name
    folder.chmod(stat.S_IRWXU)


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {path.name: (path.stat().st_size, path.stat().st_mtime_ns)
            for path in folder.iterdir()}


class SessionSpy:
    """Wraps ``onnxruntime.InferenceSession``: what each session was given, which temporary
    files existed then, and how many sessions on the whole model were alive at once."""

    def __init__(self, monkeypatch, user_model: Path, temp_root: Path) -> None:
        self.sources: list[bytes] = []
        self.files: dict[Path, bytes] = {}
        self.alive = 0
        self.most_alive = 0
        original = onnxruntime.InferenceSession
        spy = self

        def make(source, *args, **kwargs):
            whole = (Path(source) == user_model if isinstance(source, (str, Path))
                     else onnx.load_from_string(source).graph.name
                     == onnx.load(str(user_model), load_external_data=False).graph.name)
            if isinstance(source, bytes):
                spy.sources.append(source)
            session = original(source, *args, **kwargs)
            for path in temp_root.rglob("*"):
                if path.is_file() and not path.is_symlink():
                    spy.files[path] = path.read_bytes()
            if whole:
                spy.alive += 1
                spy.most_alive = max(spy.most_alive, spy.alive)
                weakref.finalize(session, spy._released)
            return session

        monkeypatch.setattr(onnxruntime, "InferenceSession", make)

    def _released(self) -> None:
        self.alive -= 1


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def _holds_any(blob: bytes, weights: dict[str, bytes], names=None) -> list[str]:
    return [name for name, data in weights.items()
            if (names is None or name in names) and len(data) >= 64 and data in blob]


@pytest.mark.parametrize("hold_once", [False, True], ids=["default", "weights-held-once"])
def test_external_weights_are_never_inlined_nor_written_beside_the_model(
        external_model, tmp_path, temp_root, monkeypatch, hold_once):
    model, x, path, weights, planted = external_model
    if hold_once:  # the path a model over 1 GiB takes
        monkeypatch.setattr(onnx_side, "HOLD_WEIGHTS_ONCE_ABOVE", 0)
    before = _listing(path.parent)
    spy = SessionSpy(monkeypatch, path, temp_root)
    report = bisect_onnx.bisect(model, x, onnx_model=path,
                                output=bisect_onnx.OutputOptions(repro_dir=tmp_path / "repro"),
                                search=MODULE_ROWS)

    assert report.verdict == "diverged"
    assert report.culprit is not None  # the local checks ran
    assert report.capture["outputs_match_production"] is True
    assert report.capture["fusions_match_production"] is True
    assert report.repro is not None and report.repro.reproduces is True
    assert _listing(path.parent) == before
    # Neither the promoted copy, nor the local checks' model, nor ONNX Runtime's optimized
    # graphs hold a weight: ONNX Runtime reads them from the user's folder.
    assert spy.sources and spy.files
    for blob in spy.sources + list(spy.files.values()):
        assert _holds_any(blob, weights) == []
    # The repro stands alone: the weights its segment needs, and only those, embedded.
    repro_model = onnx.load(str(tmp_path / "repro" / "model.onnx"))
    needed = {init.name for init in repro_model.graph.initializer}
    assert planted in needed
    for file in (tmp_path / "repro").rglob("*.onnx"):
        assert _holds_any(file.read_bytes(), weights, set(weights) - needed) == []
    # Production's graph comes from a session released at once, and the capture's graph
    # is production's: no second whole-model session, big model or not.
    assert spy.most_alive == 1


def test_weights_held_once_give_the_same_report_over_several_samples(external_model,
                                                                      monkeypatch):
    model, _, path, _, _ = external_model
    samples = bisect_onnx.RandomInputs(samples=2)
    shared = bisect_onnx.bisect(model, onnx_model=path, inputs=samples)
    monkeypatch.setattr(onnx_side, "HOLD_WEIGHTS_ONCE_ABOVE", 0)
    seen = []
    with bisect_onnx.events.listening(seen.append):
        once = bisect_onnx.bisect(model, onnx_model=path, inputs=samples)
    assert once.to_dict()["comparisons"] == shared.to_dict()["comparisons"]
    # How production was checked differs: run, or known to have the capture's graph.
    assert ({**once.capture, "production_check": None}
            == {**shared.capture, "production_check": None})
    # Production and capture session for the first sample; the capture session made
    # again for the second, where production's graph is known to be the capture's.
    assert [(event.kind, event.detail) for event in seen].count(
        ("session_created", path.name)) == 3


def test_a_repro_past_protobufs_limit_keeps_its_weights_in_one_linked_file(
        external_model, tmp_path, monkeypatch):
    model, x, path, weights, planted = external_model
    monkeypatch.setattr(repro, "_PROTOBUF_LIMIT", 0)
    report = bisect_onnx.bisect(model, x, onnx_model=path,
                                output=bisect_onnx.OutputOptions(repro_dir=tmp_path / "repro"),
                                search=MODULE_ROWS)
    folder = tmp_path / "repro"
    assert report.repro.reproduces is True
    segment = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    needed = {init.name for init in segment.graph.initializer}
    assert planted in needed
    for file in (folder / "model.onnx", folder / "backend_test" / "model.onnx"):
        assert _holds_any(file.read_bytes(), weights) == []
    data = folder / "model.onnx.data"
    assert data.stat().st_size == sum(len(weights[name]) for name in needed)
    assert (folder / "backend_test" / "model.onnx.data").read_bytes() == data.read_bytes()
    for file in (folder / "model.onnx", folder / "backend_test" / "model.onnx"):
        loaded = onnx.load(str(file))  # onnx refuses a data file with two hard links
        assert {init.name: numpy_helper.to_array(init).tobytes()
                for init in loaded.graph.initializer} == {name: weights[name] for name in needed}
    # A smaller repro written over it leaves no stale weights file.
    monkeypatch.setattr(repro, "_PROTOBUF_LIMIT", 2**31 - 1)
    bisect_onnx.bisect(model, x, onnx_model=path,
                       output=bisect_onnx.OutputOptions(repro_dir=folder), search=MODULE_ROWS)
    assert not data.exists()
    assert not (folder / "backend_test" / "model.onnx.data").exists()


def test_the_optimized_graph_is_written_without_its_weights(external_model, tmp_path):
    _, x, path, _, _ = external_model
    optimized = tmp_path / "optimized.onnx"
    session = create_session(path, model_dir=path.parent, label="model",
                             optimized_path=optimized)
    assert session.run(None, {session.get_inputs()[0].name: x})
    graph = onnx.load(str(optimized), load_external_data=False).graph
    assert graph.node
    written = [file for file in tmp_path.iterdir() if file.is_file() and file != optimized]
    if os.name != "nt":  # where links can be made, the weights went to the null device
        assert all(file.stat().st_size == 0 for file in written)


# --- the helpers -----------------------------------------------------------------------


def test_link_or_copy_links_where_it_can(tmp_path):
    source = tmp_path / "source.bin"
    source.write_bytes(b"weights")
    assert link_or_copy(source, tmp_path / "target.bin") == "link"
    assert (tmp_path / "target.bin").stat().st_ino == source.stat().st_ino


def test_link_or_copy_copies_across_file_systems(tmp_path, monkeypatch):
    def cross_device(*_):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    source = tmp_path / "source.bin"
    source.write_bytes(b"weights")
    assert link_or_copy(source, tmp_path / "target.bin") == "copy"
    assert (tmp_path / "target.bin").read_bytes() == b"weights"
    assert (tmp_path / "target.bin").stat().st_ino != source.stat().st_ino


def test_link_or_copy_replaces_a_target_rather_than_writing_through_it(tmp_path):
    precious, other = tmp_path / "precious.bin", tmp_path / "other.bin"
    precious.write_bytes(b"user's weights")
    other.write_bytes(b"new")
    os.link(precious, tmp_path / "target.bin")
    link_or_copy(other, tmp_path / "target.bin")
    assert precious.read_bytes() == b"user's weights"
    assert (tmp_path / "target.bin").read_bytes() == b"new"


def _small_model(folder: Path, *, external: bool, one_file: bool = True) -> Path:
    rng = np.random.RandomState(0)
    weight = numpy_helper.from_array(rng.randn(4, 4).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.randn(4).astype(np.float32), "b")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"]),
         onnx.helper.make_node("Add", ["y", "b"], ["z"])], "small",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT, [1, 4])],
        initializer=[weight, bias])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "small.onnx"
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, size_threshold=0,
                        all_tensors_to_one_file=one_file, location="small.data")
    else:
        onnx.save_model(model, str(path))
    return path


def _weights(path: Path) -> dict[str, np.ndarray]:
    return {init.name: numpy_helper.to_array(init)
            for init in onnx.load(str(path)).graph.initializer}


@pytest.mark.parametrize("layout", ["inline", "one file", "a file per tensor"])
def test_copy_model_keeps_the_weights_and_names_their_file_after_the_target(tmp_path,
                                                                            layout):
    source = _small_model(tmp_path / "export", external=layout != "inline",
                          one_file=layout == "one file")
    before = _listing(source.parent)
    original = {name: array.tolist() for name, array in _weights(source).items()}
    target = tmp_path / "kept" / "mine.onnx"
    copy_model(source, target)
    assert _listing(source.parent) == before
    expected = {"mine.onnx"} if layout == "inline" else {"mine.onnx", "mine.onnx.data"}
    assert {file.name for file in target.parent.iterdir()} == expected
    if layout == "one file":  # linked, where the temporary export is about to go
        assert ((tmp_path / "kept" / "mine.onnx.data").stat().st_ino
                == (tmp_path / "export" / "small.data").stat().st_ino)
    shutil.rmtree(source.parent)  # as the temporary folder is, after the run
    assert {name: array.tolist() for name, array in _weights(target).items()} == original


def test_write_external_data_moves_tensor_by_tensor_and_weight_bytes_agrees(tmp_path):
    source = _small_model(tmp_path / "export", external=True, one_file=False)
    model = onnx.load(str(source), load_external_data=False)
    tensors = list(graph_tensors(model.graph))
    assert weight_bytes(tensors) == 4 * 4 * 4 + 4 * 4
    out = tmp_path / "out"
    out.mkdir()
    written = write_external_data(tensors, source.parent, out / "x.data")
    assert written == weight_bytes(tensors) == (out / "x.data").stat().st_size
    onnx.save_model(model, str(out / "x.onnx"))
    assert {name: array.tolist() for name, array in _weights(out / "x.onnx").items()} == {
        name: array.tolist() for name, array in _weights(source).items()}


def test_a_proto_naming_external_weights_it_cannot_find_is_refused(tmp_path, fixture_case):
    import onnx

    import bisect_onnx
    from bisect_onnx.errors import InputError

    model, inputs, exported = fixture_case("tiny_mlp")
    proto = onnx.load(str(exported))
    onnx.save(proto, str(tmp_path / "external.onnx"), save_as_external_data=True,
              location="external.data", size_threshold=0)
    loose = onnx.load(str(tmp_path / "external.onnx"), load_external_data=False)
    with pytest.raises(InputError, match="pass the path"):
        bisect_onnx.bisect(model, inputs, onnx_model=loose)


@pytest.mark.parametrize("hold_once", [False, True], ids=["default", "weights-held-once"])
def test_a_large_models_sessions_against_onnx_are_made_in_the_heap(external_model, monkeypatch,
                                                                    heap_watch, hold_once):
    """ONNX against ONNX: a large model's sessions are made in the kept heap, given back last."""
    _, x, path, _, _ = external_model
    if hold_once:  # the path a model over 1 GiB takes
        monkeypatch.setattr(onnx_side, "HOLD_WEIGHTS_ONCE_ABOVE", 0)
    happened = heap_watch(onnx_vs_onnx, onnx_vs_onnx)
    levels = {"reference_runtime": bisect_onnx.RuntimeOptions(opt_level="disabled"),
              "candidate_runtime": bisect_onnx.RuntimeOptions(opt_level="all")}
    with bisect_onnx.events.listening(lambda event: happened.append(event.kind)):
        report = bisect_onnx.bisect_onnx_models(path, None, x, **levels)
    assert report.verdict == "parity"
    assert happened.count(f"kept {hold_once}") == 1
    # Every session is made inside; what the heap kept is given back after the last.
    assert (happened.index(f"kept {hold_once}") < happened.index("session_started")
            and happened.count("session_created") >= 2)
    assert happened[-1] == "given back"
