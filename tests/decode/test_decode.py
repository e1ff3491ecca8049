"""Decode loops end to end: tiny decoders at parity over 16 steps, planted errors named.

Tiny configs from ``transformers`` (nothing downloaded). Each decoder is exported once per
exporter for the module; the planted files are edits of Llama's TorchScript export (and
of its dynamo export, for a scale on the past key).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("transformers")

import bisect_onnx  # noqa: E402
from bisect_onnx.cli.command import main  # noqa: E402
from fixtures.decoders import (  # noqa: E402
    TINY_DECODERS,
    PlainDecoder,
    tiny_gpt2,
    tiny_llama,
)
from tests.planting import scale_past_key  # noqa: E402

STEPS = 16


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


@pytest.fixture(scope="module")
def llama_torchscript(llama, tmp_path_factory):
    """The parity run of Llama exported with TorchScript, and the file it exported."""
    path = tmp_path_factory.mktemp("llama") / "decoder.onnx"
    report = bisect_onnx.bisect_decode(
        llama, steps=STEPS, export=bisect_onnx.ExportOptions(exporter="torchscript",
                                                             save_to=path))
    return report, path


def _parity(report: bisect_onnx.DecodeReport) -> None:
    assert report.verdict == "parity", str(report)
    assert len(report.rows) == STEPS + 1
    assert report.first_token_difference() is None
    assert all(row.teacher.passed and row.free.passed for row in report.rows)
    # Every step one position on, a sliding window's layers too (the cache keeps all).
    assert [row.position for row in report.rows] == [0, *range(8, 8 + STEPS)]


def test_llama_torchscript_at_parity_over_16_steps(llama_torchscript):
    report, path = llama_torchscript
    _parity(report)
    graph = onnx.load(str(path)).graph
    assert [value.name for value in graph.input] == [
        "input_ids", "attention_mask", "position_ids", "past_key_values.0.key",
        "past_key_values.0.value", "past_key_values.1.key", "past_key_values.1.value"]
    assert [value.name for value in graph.output] == [
        "logits", "present.0.key", "present.0.value", "present.1.key", "present.1.value"]
    past = graph.input[3].type.tensor_type.shape.dim
    assert [dim.dim_param or dim.dim_value for dim in past] == ["batch", 1, "past_sequence", 16]
    assert report.rows[0].length == 8 and report.rows[1].position == 8  # the prefill, then one


@pytest.fixture(scope="module")
def llama_dynamo(llama, tmp_path_factory):
    """The parity run of Llama exported with dynamo (the default), and the file it exported."""
    path = tmp_path_factory.mktemp("llama-dynamo") / "decoder.onnx"
    report = bisect_onnx.bisect_decode(llama, steps=STEPS,
                                       export=bisect_onnx.ExportOptions(save_to=path))
    return report, path


def test_llama_dynamo_at_parity_over_16_steps(llama_dynamo):
    report, path = llama_dynamo
    _parity(report)
    assert report.exporter == "dynamo"
    graph = onnx.load(str(path)).graph
    assert [value.name for value in graph.input][3:] == [
        "past_key_values.0.key", "past_key_values.0.value", "past_key_values.1.key",
        "past_key_values.1.value"]
    assert [value.name for value in graph.output][0] == "logits"
    past = graph.input[3].type.tensor_type.shape.dim
    assert [dim.dim_param or dim.dim_value for dim in past] == ["batch", 1, "past_sequence", 16]


@pytest.mark.parametrize("name", ["gpt2", "qwen2", "mistral", "phi3", "gemma"])
def test_more_decoders_at_parity_with_dynamo(name):
    """Each takes the dynamo exporter (the default): none is refused."""
    report = bisect_onnx.bisect_decode(TINY_DECODERS[name](), steps=STEPS)
    _parity(report)
    assert report.exporter == "dynamo" and report.finding is None, str(report)


def test_a_model_left_training_is_warned_about(llama, llama_torchscript):
    llama.train()
    try:
        with pytest.warns(bisect_onnx.BisectOnnxWarning, match="training mode"):
            report = bisect_onnx.bisect_decode(llama, steps=1, onnx_model=llama_torchscript[1])
    finally:
        llama.eval()
    assert report.warnings and "model.eval()" in report.warnings[0]


def test_gpt2_torchscript_at_parity_with_its_dropout_left_off():
    # The wrapper mirrors the model's eval mode: the exporter's restore of the wrapper's
    # mode once turned GPT-2's dropout on after export.
    model = tiny_gpt2()
    report = bisect_onnx.bisect_decode(
        model, steps=STEPS, export=bisect_onnx.ExportOptions(exporter="torchscript"))
    _parity(report)
    assert report.verdict == "parity" and report.finding is None, str(report)
    assert not model.training  # the user's eval mode, kept


@pytest.mark.parametrize("name", ["qwen2", "mistral", "phi3", "gemma"])
def test_more_decoders_at_parity_with_torchscript(name):
    # Mistral's window (16) is shorter than the prompt's 8 positions and 16 steps' 16.
    report = bisect_onnx.bisect_decode(
        TINY_DECODERS[name](), steps=STEPS,
        export=bisect_onnx.ExportOptions(exporter="torchscript"))
    _parity(report)
    assert report.verdict == "parity" and report.finding is None, str(report)
    assert [row.position for row in report.rows][-1] == 8 + STEPS - 1


def _edited(source: Path, target: Path, edit) -> Path:
    model = onnx.load(str(source))
    edit(model.graph)
    onnx.save(model, str(target))
    return target


def _mask_out_past_positions(graph: onnx.GraphProto) -> None:
    """Zero the attention mask over the cache's positions: at the prefill there are none."""
    for node in graph.node:
        node.input[:] = ["mask_edited" if n == "attention_mask" else n for n in node.input]
    for name, value in (("one", 1), ("zero", 0)):
        graph.initializer.append(numpy_helper.from_array(np.array(value, np.int64), name))
    edits = [
        helper.make_node("Shape", ["input_ids"], ["ids_shape"], name="ids_shape"),
        helper.make_node("Gather", ["ids_shape", "one"], ["new"], name="new", axis=0),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"], name="mask_shape"),
        helper.make_node("Gather", ["mask_shape", "one"], ["total"], name="total", axis=0),
        helper.make_node("Sub", ["total", "new"], ["cached"], name="cached"),
        helper.make_node("Range", ["zero", "total", "one"], ["index"], name="index"),
        helper.make_node("GreaterOrEqual", ["index", "cached"], ["keep"], name="keep"),
        helper.make_node("Cast", ["keep"], ["keep_int"], name="keep_int", to=TensorProto.INT64),
        helper.make_node("Mul", ["attention_mask", "keep_int"], ["mask_edited"],
                         name="planted_mask")]
    for index, node in enumerate(edits):
        graph.node.insert(index, node)


def _offset_positions_past_the_prompt(graph: onnx.GraphProto) -> None:
    """Shift position_ids by one once the cache holds anything: the prefill's are right."""
    for node in graph.node:
        node.input[:] = ["positions_edited" if n == "position_ids" else n for n in node.input]
    for name, value in (("two", 2), ("one", 1)):
        graph.initializer.append(numpy_helper.from_array(np.array(value, np.int64), name))
    edits = [
        helper.make_node("Shape", ["past_key_values.0.key"], ["past_shape"], name="past_shape"),
        helper.make_node("Gather", ["past_shape", "two"], ["cached"], name="cached", axis=0),
        helper.make_node("Min", ["cached", "one"], ["offset"], name="offset"),
        helper.make_node("Add", ["position_ids", "offset"], ["positions_edited"],
                         name="planted_offset")]
    for index, node in enumerate(edits):
        graph.node.insert(index, node)


def _drift_present_value(graph: onnx.GraphProto) -> None:
    """Add 3e-6 to layer 1's returned value: within tolerance once, not fed back 4 times."""
    for node in graph.node:
        node.output[:] = ["exact" if n == "present.1.value" else n for n in node.output]
    graph.initializer.append(numpy_helper.from_array(np.array(3e-6, np.float32), "drift"))
    graph.node.append(helper.make_node("Add", ["exact", "drift"], ["present.1.value"],
                                       name="planted_drift"))


def test_past_key_scale_is_named_at_its_node_and_step(llama, llama_torchscript, tmp_path):
    planted = _edited(llama_torchscript[1], tmp_path / "scaled.onnx", scale_past_key)
    report = bisect_onnx.bisect_decode(llama, steps=3, onnx_model=planted)
    assert report.rows[0].teacher.passed  # the prefill's cache is empty
    finding = report.finding
    assert (finding.step, finding.kind) == (1, "introduced")
    assert finding.where == "decode, from position 8 on"
    assert "planted_scale" in finding.culprit
    assert report.bisection is not None and report.bisection.diverged
    text = str(report)
    assert "DIVERGED at step 1" in text and "step 1's bisection" in text


def test_past_key_scale_in_a_dynamo_file_is_named_at_its_node(llama, llama_dynamo, tmp_path):
    """Op level on a file exported with dynamic axes, at the step's sizes (one token).

    Traced at those sizes, torch.export specializes them and names its nodes otherwise
    than the file's: the program is the one the exporter traced at the export's sizes.
    """
    planted = _edited(llama_dynamo[1], tmp_path / "scaled.onnx", scale_past_key)
    finding = bisect_onnx.bisect_decode(llama, steps=1, onnx_model=planted).finding
    assert (finding.step, finding.kind) == (1, "introduced")
    assert "planted_scale" in finding.culprit, finding.culprit  # not the Concat it feeds
    assert "in these 2 nodes: planted_scale, " in finding.culprit


def test_a_file_without_position_ids_is_stepped_and_bisected(llama, tmp_path):
    from bisect_onnx.decode.export import export_decoder
    from bisect_onnx.decode.flat_cache import decoder_step

    clean = export_decoder(decoder_step(llama, positions=False), tmp_path,
                           exporter="torchscript")
    assert "position_ids" not in [value.name for value in onnx.load(str(clean)).graph.input]
    assert bisect_onnx.bisect_decode(llama, steps=4, onnx_model=clean).verdict == "parity"
    planted = _edited(clean, tmp_path / "scaled.onnx", scale_past_key)
    finding = bisect_onnx.bisect_decode(llama, steps=2, onnx_model=planted).finding
    assert finding.step == 1 and "planted_scale" in finding.culprit


def test_a_mask_edit_over_past_positions_is_named_at_its_nodes_and_step(
        llama, llama_torchscript, tmp_path):
    planted = _edited(llama_torchscript[1], tmp_path / "mask.onnx", _mask_out_past_positions)
    report = bisect_onnx.bisect_decode(llama, steps=2, onnx_model=planted)
    finding = report.finding
    assert (finding.step, finding.kind) == (1, "introduced"), str(report)
    assert "cached" in finding.culprit and "keep" in finding.culprit
    assert report.first_token_difference() == 1  # attending to itself alone, it errs


def test_a_position_offset_past_the_prompt_is_named_at_its_step(llama, llama_torchscript,
                                                                tmp_path):
    planted = _edited(llama_torchscript[1], tmp_path / "offset.onnx",
                      _offset_positions_past_the_prompt)
    report = bisect_onnx.bisect_decode(llama, steps=2, onnx_model=planted)
    assert report.rows[0].teacher.passed  # the prefill has no cache: no offset
    finding = report.finding
    assert (finding.step, finding.kind) == (1, "introduced"), str(report)
    assert finding.where == "decode, from position 8 on"
    assert "planted_offset" in finding.culprit  # the segment of the inserted nodes
    assert report.bisection is not None and report.bisection.diverged


def test_drift_through_the_cache_is_named_at_its_layer(llama, llama_torchscript, tmp_path):
    planted = _edited(llama_torchscript[1], tmp_path / "drift.onnx", _drift_present_value)
    report = bisect_onnx.bisect_decode(llama, steps=8, onnx_model=planted)
    finding = report.finding
    assert finding.kind == "accumulated" and finding.layer == 1, str(report)
    assert finding.step >= 2
    assert all(row.teacher.passed for row in report.rows)
    growth = finding.growth[:finding.step + 1]
    assert list(growth) == sorted(growth) and growth[-1] > 2 * growth[0]
    assert report.bisection is None
    assert "accumulated through the cache" in str(report)
    notebook = report._repr_html_()
    assert "<svg" in notebook and "<tr class='fail first'>" in notebook
    saved = bisect_onnx.DecodeReport.save(report, tmp_path / "drift.json")
    assert json.loads(saved.read_text())["first_failure"]["layer"] == 1


def test_cli_steps_prints_the_table_and_writes_the_json(llama_torchscript, tmp_path, capsys,
                                                        monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[2])
    np.save(tmp_path / "prompt.npy", np.array([[5, 17, 42, 3]]))
    status = main(["fixtures/decoders.py:tiny_llama", "--steps", "3", "--onnx",
                   str(llama_torchscript[1]), "--input", str(tmp_path / "prompt.npy"),
                   "--json", str(tmp_path / "decode.json"), "--html", str(tmp_path / "d.html")])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "PARITY: prefill and 3 decode steps" in out and "tokens, agree" in out
    data = json.loads((tmp_path / "decode.json").read_text())
    assert data["kind"] == "decode" and data["prompt"] == [[5, 17, 42, 3]]
    assert [step["step"] for step in data["steps"]] == [0, 1, 2, 3]
    assert data["steps"][0]["free_running"]["layers"][1]["value"]["pass"] is True
    page = (tmp_path / "d.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page
    assert "layer 1 cache (free)" in page and "PARITY: prefill and 3 decode steps" in page


def test_cli_steps_exits_1_on_a_divergence_and_quiet_prints_the_verdict(
        llama_torchscript, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[2])
    planted = _edited(llama_torchscript[1], tmp_path / "drift.onnx", _drift_present_value)
    status = main(["fixtures/decoders.py:tiny_llama", "--steps", "6", "--onnx", str(planted),
                   "-q"])
    out = capsys.readouterr().out
    assert status == 1
    assert out.startswith("DIVERGED at step") and "accumulated through the cache" in out
    assert "torch token" not in out  # -q: no table


def test_cli_refuses_options_a_decode_run_does_not_take(capsys):
    status = main(["fixtures/decoders.py:tiny_llama", "--steps", "2", "--record", "x.npz"])
    assert status == 2
    assert "--record does not apply to a decode run" in capsys.readouterr().err


def test_cache_inputs_that_match_no_layer_are_refused_in_one_line(llama, llama_torchscript,
                                                                  tmp_path):
    def rename(graph: onnx.GraphProto) -> None:
        for value in graph.input:
            if value.name == "past_key_values.1.value":
                value.name = "v1"
        for node in graph.node:
            node.input[:] = ["v1" if n == "past_key_values.1.value" else n for n in node.input]

    odd = _edited(llama_torchscript[1], tmp_path / "odd.onnx", rename)
    with pytest.raises(bisect_onnx.UsageError, match="cannot be matched to its layers") as error:
        bisect_onnx.bisect_decode(llama, steps=1, onnx_model=odd)
    assert "\n" not in str(error.value) and "--cache-name" in str(error.value)
    report = bisect_onnx.bisect_decode(
        llama, steps=1, onnx_model=odd,
        decode=bisect_onnx.DecodeOptions(cache_names={"past_key_values.1.value": "v1"}))
    assert report.verdict == "parity"


def test_a_file_with_a_fixed_batch_or_length_is_refused_before_it_runs(llama, llama_torchscript,
                                                                       tmp_path):
    def fix(axis: int, size: int):
        def edit(graph: onnx.GraphProto) -> None:
            dim = next(value for value in graph.input if value.name == "input_ids"
                       ).type.tensor_type.shape.dim[axis]
            dim.Clear()
            dim.dim_value = size
        return edit

    batch_of_one = _edited(llama_torchscript[1], tmp_path / "batch.onnx", fix(0, 1))
    with pytest.raises(bisect_onnx.InputError, match="input_ids has its batch fixed at 1 and "
                                                     "the prompt has 2 rows") as error:
        bisect_onnx.bisect_decode(llama, np.ones((2, 4), dtype=np.int64), steps=1,
                                  onnx_model=batch_of_one)
    assert "\n" not in str(error.value)
    assert bisect_onnx.bisect_decode(llama, np.ones((1, 4), dtype=np.int64), steps=1,
                                     onnx_model=batch_of_one).verdict == "parity"
    eight_tokens = _edited(llama_torchscript[1], tmp_path / "length.onnx", fix(1, 8))
    with pytest.raises(bisect_onnx.InputError, match="length .* fixed at 8, and this run feeds "
                                                     "it 1, 8; .*sequence axes are dynamic"):
        bisect_onnx.bisect_decode(llama, steps=1, onnx_model=eight_tokens)
    # A size the run always feeds is fine: one token a step, a prompt of one.
    one_token = _edited(llama_torchscript[1], tmp_path / "one.onnx", fix(1, 1))
    assert bisect_onnx.bisect_decode(llama, np.ones((1, 1), dtype=np.int64), steps=2,
                                     onnx_model=one_token).verdict == "parity"


def test_a_file_that_is_not_a_decoder_or_not_onnx_is_refused_in_one_line(llama, tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(graph), str(tmp_path / "relu.onnx"))
    with pytest.raises(bisect_onnx.UsageError, match="not a decoder step with its cache: it "
                                                     "takes x and returns y"):
        bisect_onnx.bisect_decode(llama, steps=1, onnx_model=tmp_path / "relu.onnx")
    (tmp_path / "cut.onnx").write_bytes((tmp_path / "relu.onnx").read_bytes()[:-9])
    with pytest.raises(bisect_onnx.InputError, match="is not a readable ONNX model"):
        bisect_onnx.bisect_decode(llama, steps=1, onnx_model=tmp_path / "cut.onnx")


def test_a_mapping_that_swaps_a_key_and_value_is_named_as_the_likelier_fault(
        llama, llama_torchscript, tmp_path):
    names = {"past_key_values.0.key": "k0", "past_key_values.0.value": "v0"}

    def rename(graph: onnx.GraphProto) -> None:
        for value in graph.input:
            value.name = names.get(value.name, value.name)
        for node in graph.node:
            node.input[:] = [names.get(n, n) for n in node.input]

    renamed = _edited(llama_torchscript[1], tmp_path / "renamed.onnx", rename)
    report = bisect_onnx.bisect_decode(llama, steps=2, onnx_model=renamed,
                                       decode=bisect_onnx.DecodeOptions(cache_names={
                                           "past_key_values.0.key": "v0",
                                           "past_key_values.0.value": "k0"}))
    assert report.diverged and report.finding.step == 1
    assert "the --cache-name mapping may pair the wrong inputs" in report.finding.culprit


def test_prompt_past_the_model_positions_is_refused(llama, llama_torchscript):
    with pytest.raises(bisect_onnx.InputError, match="need 72 positions .* has 64; pass a "
                                                     "prompt of at most 62 tokens"):
        bisect_onnx.bisect_decode(llama, np.zeros(70, dtype=np.int64), steps=2,
                                  onnx_model=llama_torchscript[1])
    with pytest.raises(bisect_onnx.InputError, match="a random prompt of 70 tokens .*"
                                                     "--prompt-length 62 or less"):
        bisect_onnx.bisect_decode(llama, steps=2, onnx_model=llama_torchscript[1],
                                  decode=bisect_onnx.DecodeOptions(prompt_length=70))
    with pytest.raises(bisect_onnx.InputError, match="need 74 positions .* has 64; take at "
                                                     "most 60 --steps$"):
        bisect_onnx.bisect_decode(llama, np.zeros(4, dtype=np.int64), steps=70,
                                  onnx_model=llama_torchscript[1])


def test_steps_whose_caches_pass_the_memory_budget_are_refused(llama, llama_torchscript):
    with pytest.raises(bisect_onnx.UsageError, match="over the memory budget of 1.0 KiB; "
                                                     "pass fewer --steps"):
        bisect_onnx.bisect_decode(llama, steps=4, onnx_model=llama_torchscript[1],
                                  runtime=bisect_onnx.RuntimeOptions(max_memory=1024))


def test_steps_over_the_memory_budget_are_refused_before_the_export(llama, monkeypatch):
    """A transformers model's cache shape is known before the export: no export is made."""
    import bisect_onnx.decode.export

    def no_export(*args: object, **kwargs: object) -> None:
        raise AssertionError("exported before the memory budget was checked")

    monkeypatch.setattr(bisect_onnx.decode.export, "export_decoder", no_export)
    with pytest.raises(bisect_onnx.UsageError, match=r"^4 steps on a prompt of 8 tokens hold "
                                                     r".* over the memory budget of 1.0 KiB; "
                                                     "pass fewer --steps") as error:
        bisect_onnx.bisect_decode(llama, steps=4,
                                  runtime=bisect_onnx.RuntimeOptions(max_memory=1024))
    assert "\n" not in str(error.value)
    with pytest.raises(bisect_onnx.UsageError, match="prompt of 3 tokens"):  # [batch, sequence]
        bisect_onnx.bisect_decode(llama, torch.zeros((2, 3), dtype=torch.long), steps=4,
                                  runtime=bisect_onnx.RuntimeOptions(max_memory=1024))
    with pytest.raises(bisect_onnx.UsageError, match="prompt of 3 tokens"):  # a list of ids
        bisect_onnx.bisect_decode(llama, [1, 2, 3], steps=4,
                                  runtime=bisect_onnx.RuntimeOptions(max_memory=1024))


def test_logits_kept_for_the_steps_count_against_the_memory_budget(llama, monkeypatch):
    """PyTorch's logits of every step are kept while the runtime steps, beside the caches.

    The tiny Llama's caches at 12 positions, 6 copies of 256 bytes a position, fit
    20,000 bytes; with its 12 positions of 100 logits (4,800 bytes) they do not.
    """
    import bisect_onnx.decode.export

    def no_export(*args: object, **kwargs: object) -> None:
        raise AssertionError("exported before the memory budget was checked")

    monkeypatch.setattr(bisect_onnx.decode.export, "export_decoder", no_export)
    with pytest.raises(bisect_onnx.UsageError, match=r"\(6 copies of the cache at 12 "
                                                     r"positions and 4\.7 KiB of logits kept\)"):
        bisect_onnx.bisect_decode(llama, steps=4,
                                  runtime=bisect_onnx.RuntimeOptions(max_memory=20_000))


def test_a_plain_module_taking_its_cache_as_tensors_is_stepped():
    report = bisect_onnx.bisect_decode(
        PlainDecoder().eval(), np.array([1, 2, 3]), steps=4,
        export=bisect_onnx.ExportOptions(exporter="torchscript"),
        decode=bisect_onnx.DecodeOptions(cache_shape=(1, 1, 8)))
    assert report.verdict == "parity", str(report)
    with pytest.raises(bisect_onnx.UsageError, match="cache_shape"):
        bisect_onnx.bisect_decode(PlainDecoder(), np.array([1, 2]), steps=1)


class NormedDecoder(PlainDecoder):
    """The plain decoder with a BatchNorm over its embedding: training mode updates it."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(20)

    def forward(self, input_ids, attention_mask, key, value):
        logits, keys, values = super().forward(input_ids, attention_mask, key, value)
        return self.norm(logits.transpose(1, 2)).transpose(1, 2), keys, values


def test_a_decode_run_leaves_the_model_as_it_came():
    """Buffers and modes: a training-mode BatchNorm's statistics are put back."""
    torch.manual_seed(0)
    model = NormedDecoder().train()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    modes = [module.training for module in model.modules()]

    with pytest.warns(bisect_onnx.BisectOnnxWarning, match="training mode"):
        bisect_onnx.bisect_decode(
            model, np.array([[1, 2, 3], [4, 5, 6]]), steps=2,
            export=bisect_onnx.ExportOptions(exporter="torchscript"),
            decode=bisect_onnx.DecodeOptions(cache_shape=(1, 1, 8)))

    assert [module.training for module in model.modules()] == modes
    after = model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before), [
        name for name in before if not torch.equal(before[name], after[name])]


def test_per_value_tolerance_rules_are_refused_in_one_line():
    with pytest.raises(bisect_onnx.UsageError, match="per-value tolerance rules"):
        bisect_onnx.bisect_decode(PlainDecoder().eval(), np.array([1, 2]), steps=1,
                                  tolerance=bisect_onnx.Tolerance(rules={"logits": (1, 1)}))


def test_the_tolerance_follows_a_float16_files_precision(tmp_path):
    """As bisect's does: an rtol or atol left out takes float16's defaults."""
    from bisect_onnx.decode.run import _judge
    from bisect_onnx.graph.skeleton import load_skeleton
    from bisect_onnx.judge.tolerances import PRECISION_DEFAULTS

    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT16)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2])])
    path = tmp_path / "half.onnx"
    onnx.save(helper.make_model(graph), str(path))
    skeleton = load_skeleton(path)

    assert _judge(None, skeleton).base == PRECISION_DEFAULTS["float16"]
    assert _judge((1e-3, 1e-5), skeleton).base.atol == 1e-5  # given: kept


class MaskFreeDecoder(PlainDecoder):
    """The plain decoder that never reads its attention mask: the export drops the input."""

    def forward(self, input_ids, attention_mask, *past):
        hidden = self.embed(input_ids)
        keys = torch.cat([past[0], self.key(hidden)[:, None]], dim=2)
        values = torch.cat([past[1], self.value(hidden)[:, None]], dim=2)
        weights = torch.softmax(hidden[:, None] @ keys.transpose(-1, -2), dim=-1)
        return self.head((weights @ values)[:, 0]), keys, values


def test_a_mask_the_export_dropped_is_not_fed():
    report = bisect_onnx.bisect_decode(
        MaskFreeDecoder().eval(), np.array([1, 2, 3]), steps=3,
        export=bisect_onnx.ExportOptions(exporter="torchscript"),
        decode=bisect_onnx.DecodeOptions(cache_shape=(1, 1, 8)))
    assert report.verdict == "parity", str(report)


def test_a_prompt_past_the_positions_is_refused_before_the_export(llama, monkeypatch):
    """A large model would be exported for minutes only to be refused: refused first."""
    import bisect_onnx.decode.export as export

    def never(*args, **kwargs):
        raise AssertionError("exported before the prompt's length was checked")

    monkeypatch.setattr(export, "export_decoder", never)
    with pytest.raises(bisect_onnx.InputError, match="need 72 positions .* has 64"):
        bisect_onnx.bisect_decode(llama, np.zeros(70, dtype=np.int64), steps=2)
    with pytest.raises(bisect_onnx.InputError, match="need 66 positions .* has 64"):
        bisect_onnx.bisect_decode(llama, steps=2,
                                  decode=bisect_onnx.DecodeOptions(prompt_length=64))
