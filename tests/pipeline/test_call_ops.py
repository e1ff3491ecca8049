"""A divergence in a dynamo file exported elsewhere traces only the culprit's module call.

The verdict must be the one the whole model's trace gives (culprit node, classification,
the node inside a multi-node op), with the rest of the model compared per module call,
and the coverage must say that only that call's ops were compared. Where the call's ops
cannot be named exactly as the file names them, the whole model is traced as before.
"""

from __future__ import annotations

import logging

import onnx
import pytest

import bisect_onnx
from bisect_onnx.events import CAPTURE_STARTED
from bisect_onnx.pipeline import inside_op
from bisect_onnx.report.verdict import verdict_line
from bisect_onnx.search.translation_eval import CannotEvaluate
from tests.planting import node_of_module, plant, scale_initializer_input

OP_ROWS = bisect_onnx.SearchOptions(granularity="op")

WHOLE_TRACE = "tracing the model with torch.export"

# (fixture, module whose node is planted, its op, the call traced alone): a Linear in an
# attention branch (the MatMul named inside the op).
PLANTS = [("tiny_transformer", "blocks.0.attn.v", "MatMul", "blocks.0.attn.v")]


def _planted(fixture_case, tmp_path, name, module, op, *, metadata=None):
    model, inputs, exported = fixture_case(name)
    node = node_of_module(onnx.load(str(exported)), module, op)
    target = tmp_path / "planted.onnx"

    def edit(proto):
        edited = scale_initializer_input(node.name, 1, 1.05)(proto)
        if metadata is not None:
            metadata(proto)
        return edited

    plant(exported, target, edit)
    return model, inputs, target


def _bisect(model, inputs, path, caplog, **options):
    """The report, which op captures ran, and whether the whole model was traced."""
    seen = []
    with caplog.at_level(logging.INFO, logger="bisect_onnx"), \
            bisect_onnx.events.listening(seen.append):
        report = bisect_onnx.bisect(model, inputs, onnx_model=path, **options)
    captures = [event.detail for event in seen if event.kind == CAPTURE_STARTED
                and event.detail.startswith("pytorch ops")]
    whole = any(WHOLE_TRACE in record.getMessage() for record in caplog.records)
    caplog.clear()
    return report, captures, whole


def _cannot_evaluate(call, arrays):
    raise CannotEvaluate("refused for the test")


@pytest.mark.parametrize(("name", "module", "op", "call"), PLANTS, ids=["attention-linear"])
def test_only_the_culprits_call_is_traced_and_the_verdict_is_the_whole_traces(
        fixture_case, tmp_path, caplog, monkeypatch, name, module, op, call):
    """Where the op's translation cannot be evaluated on its own, its call is traced."""
    model, inputs, planted = _planted(fixture_case, tmp_path, name, module, op)
    with monkeypatch.context() as patched:
        patched.setattr(inside_op, "evaluate_translation", _cannot_evaluate)
        one_call, captures, whole = _bisect(model, inputs, planted, caplog)
    assert captures == [f"pytorch ops of {call}"] and not whole
    everything, captures, whole = _bisect(model, inputs, planted, caplog, search=OP_ROWS)
    assert captures == ["pytorch ops"] and whole  # op granularity asked: the whole trace

    assert one_call.verdict == everything.verdict == "diverged"
    for field in ("onnx_node", "onnx_value", "fx_node", "torch_module"):
        assert getattr(one_call.culprit, field) == getattr(everything.culprit, field), field
    assert one_call.culprit.local.classification == everything.culprit.local.classification
    assert one_call.culprit.local.classification == "graph semantics"
    assert _inside_node(one_call) == _inside_node(everything)
    # What was compared is said as it is: that call's ops, the rest per module call.
    assert one_call.coverage.op_scope == call and everything.coverage.op_scope is None
    assert 0 < one_call.coverage.torch_ops < everything.coverage.torch_ops
    assert f"torch ops of {call} (the call traced alone" in verdict_line(one_call)
    ops = [record for record in one_call.comparisons if record.fx_node is not None]
    modules = [record for record in one_call.comparisons if record.fx_node is None]
    assert ops and modules
    assert all(record.torch_module.partition("@")[0].startswith(call) for record in ops)
    assert [record.index for record in one_call.comparisons] == list(
        range(len(one_call.comparisons)))


def test_a_node_inside_a_linear_is_named_and_classified_without_any_trace(
        fixture_case, tmp_path, caplog):
    """The Linear's MatMul: its translation evaluated alone names it, as the whole trace does."""
    model, inputs, planted = _planted(fixture_case, tmp_path, "tiny_transformer",
                                      "blocks.0.attn.v", "MatMul")
    module_level, captures, whole = _bisect(model, inputs, planted, caplog)
    assert captures == [] and not whole
    everything, _, _ = _bisect(model, inputs, planted, caplog, search=OP_ROWS)
    for field in ("onnx_node", "onnx_value", "onnx_op", "torch_module"):
        assert getattr(module_level.culprit, field) == getattr(everything.culprit, field), field
    assert module_level.culprit.local.classification == everything.culprit.local.classification
    assert module_level.culprit.onnx_op == "MatMul"
    assert module_level.culprit.local.classification == "graph semantics"
    assert module_level.inside_op.node == everything.inside_op.node
    assert module_level.coverage.granularity == "module"


def test_a_culprit_reading_only_pytorchs_values_is_classified_without_any_trace(
        fixture_case, tmp_path, caplog):
    """A Conv folded into the BatchNorm of a downsampling block: one ONNX node, nothing inside.

    Op level could name no finer node, so nothing is traced: the module call around the
    segment is rerun in float64 for the classification, which must be the whole trace's.
    """
    model, inputs, planted = _planted(fixture_case, tmp_path, "resnet_like", "layer2.bn1",
                                      "Conv")
    module_level, captures, whole = _bisect(model, inputs, planted, caplog)
    assert captures == [] and not whole
    everything, captures, whole = _bisect(model, inputs, planted, caplog, search=OP_ROWS)
    assert captures == ["pytorch ops"] and whole

    assert module_level.verdict == everything.verdict == "diverged"
    for field in ("onnx_node", "onnx_value", "torch_module"):
        assert getattr(module_level.culprit, field) == getattr(everything.culprit, field), field
    assert module_level.culprit.local.classification == everything.culprit.local.classification
    assert module_level.culprit.local.classification == "graph semantics"
    assert module_level.coverage.granularity == "module"
    assert module_level.coverage.op_scope is None


def _misread_input(module: str):
    """Say in the file that the planted call's ops read a value no op computes."""

    def edit(proto):
        for node in proto.graph.node:
            props = {prop.key: prop for prop in node.metadata_props}
            scopes = props.get("pkg.torch.onnx.name_scopes")
            text = props.get("pkg.torch.onnx.fx_node")
            if scopes is not None and text is not None and f"'{module}'" in scopes.value:
                head, _, args = text.value.partition("args = (%")
                text.value = head + "args = (%clone_999" + args[args.index(","):]

    return edit


def test_a_call_whose_ops_the_file_names_otherwise_falls_back_to_the_whole_trace(
        fixture_case, tmp_path, caplog):
    module = "blocks.0.attn.v"
    model, inputs, planted = _planted(fixture_case, tmp_path, "tiny_transformer", module,
                                      "MatMul", metadata=_misread_input(module))
    report, captures, whole = _bisect(model, inputs, planted, caplog)
    assert whole and captures[-1] == "pytorch ops"  # the call was refused: the whole trace
    assert report.coverage.op_scope is None
    assert report.culprit.torch_module == module
    assert report.culprit.onnx_op == "MatMul"
    assert report.culprit.local.classification == "graph semantics"


def test_a_program_that_fails_to_run_leaves_module_level_standing(fixture_case, monkeypatch):
    # torch.export's program may fail where the model runs (corpus seeds 85 and 141: a
    # view of a non-contiguous tensor); the run compares module calls instead.
    import bisect_onnx
    import bisect_onnx.pipeline.op_sources as op_sources
    from bisect_onnx.errors import ModelError

    def fails(program, arrays):
        raise ModelError("the exported program raised RuntimeError on inputs ...: view size")

    monkeypatch.setattr(op_sources, "capture_ops", fails)
    model, inputs, onnx_path = fixture_case("avgpool_divisor")
    report = bisect_onnx.bisect(model, inputs, onnx_model=onnx_path,
                                search=bisect_onnx.SearchOptions(granularity="op"))
    assert report.diverged and report.coverage.granularity == "module"
    assert report.culprit is not None or report.culprit_segment is not None


def _inside_node(report) -> str | None:
    """The node found inside the culprit's op, if any."""
    return report.inside_op.node if report.inside_op is not None else None
