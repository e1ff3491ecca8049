"""Unit tests for bisect_onnx.judge.verdict.decide on hand-built records."""

from __future__ import annotations

from dataclasses import replace

from bisect_onnx.judge.compare import Status
from bisect_onnx.judge.record_parts import ComparisonFigures
from bisect_onnx.judge.records import Record
from bisect_onnx.judge.verdict import decide, identical_values


def record(index: int, status: str = Status.PASS, *, module: str | None = None,
           value: str | None = None, max_abs: float = 0.0) -> Record:
    """A record with the given status; names default to ``m{index}`` / ``v{index}``."""
    passed = status == Status.PASS
    return Record(index=index, onnx_node=f"node_{index}", onnx_op="Relu",
                  onnx_value=value or f"v{index}",
                  torch_module=module if module is not None else f"m{index}",
                  torch_op="aten.relu.default", source=None, shape=[2], dtype="float32",
                  candidate_shape=[2], candidate_dtype="float32", figures=ComparisonFigures(
        max_abs_error=max_abs, max_rel_error=0.0, mismatch_fraction=0.0 if passed else 1.0,
        min_passing_atol=max_abs, nan_mismatch=0, status=status))


def output(status: str = Status.PASS, index: int = 0) -> Record:
    return record(index, status, module=None, value=f"output_{index}")


def test_record_helper_failed_flag_follows_status():
    assert not record(0).failed
    for status in (Status.FAIL, Status.SHAPE_MISMATCH, Status.DTYPE_MISMATCH,
                   Status.NAN_MISMATCH):
        assert record(0, status).failed


def test_all_passing_is_parity_without_note():
    decision = decide([record(0), record(1)], [output()])
    assert decision.verdict == "parity"
    assert decision.first_divergence is None
    assert decision.hidden_divergences == []
    assert decision.note is None


def test_first_divergence_is_the_first_failing_record_not_the_worst():
    comparisons = [
        record(0),
        record(1, Status.FAIL, max_abs=0.01),
        record(2),
        record(3, Status.FAIL, max_abs=100.0),
    ]
    decision = decide(comparisons, [output(Status.FAIL)])
    assert decision.verdict == "diverged"
    assert decision.first_divergence is comparisons[1]
    assert decision.hidden_divergences == []
    assert decision.note is None


def test_any_failing_status_counts_as_the_first_divergence():
    comparisons = [record(0), record(1, Status.SHAPE_MISMATCH), record(2, Status.FAIL)]
    decision = decide(comparisons, [output(Status.FAIL)])
    assert decision.first_divergence is comparisons[1]


def test_one_failing_output_among_several_means_diverged():
    comparisons = [record(0, Status.NAN_MISMATCH)]
    decision = decide(comparisons, [output(index=0), output(Status.FAIL, index=1)])
    assert decision.verdict == "diverged"
    assert decision.first_divergence is comparisons[0]


def test_failing_output_without_failing_checkpoint_points_after_the_last_passing_one():
    comparisons = [record(0, module="fc1", value="linear"),
                   record(1, module="relu", value="relu_out")]
    failing = output(Status.FAIL)
    decision = decide(comparisons, [failing])
    assert decision.verdict == "diverged"
    assert decision.first_divergence is failing
    assert decision.hidden_divergences == []
    assert decision.note is not None
    assert "relu" in decision.note
    assert "'relu_out'" in decision.note
    assert "fc1" not in decision.note


def test_first_failing_output_is_chosen_when_several_fail():
    first, second = output(Status.FAIL, index=0), output(Status.FAIL, index=1)
    decision = decide([record(0)], [output(index=2), first, second])
    assert decision.first_divergence is first


def test_failing_intermediates_under_passing_outputs_are_hidden_divergences():
    comparisons = [record(0), record(1, Status.FAIL), record(2), record(3, Status.FAIL)]
    decision = decide(comparisons, [output()])
    assert decision.verdict == "parity"
    assert decision.first_divergence is None
    assert decision.hidden_divergences == [comparisons[1], comparisons[3]]
    assert decision.note is not None
    assert "2 intermediate" in decision.note


def test_no_comparisons_and_passing_outputs_is_parity():
    decision = decide([], [output()])
    assert decision.verdict == "parity"
    assert decision.first_divergence is None
    assert decision.hidden_divergences == []
    assert decision.note is None


def test_no_comparisons_and_failing_output_says_nothing_could_be_compared():
    failing = output(Status.FAIL)
    decision = decide([], [failing])
    assert decision.verdict == "diverged"
    assert decision.first_divergence is failing
    assert decision.note is not None
    assert "no intermediate value could be compared" in decision.note


def test_failing_outputs_are_taken_in_graph_order_not_output_order():
    outputs = [output(Status.FAIL, 0), output(Status.FAIL, 1)]
    # output_1 is computed before output_0 (``return a + 1, a``): it is where it starts.
    decision = decide([], outputs, output_order={"output_0": 7, "output_1": 3})
    assert decision.first_divergence is outputs[1]
    assert decide([], outputs).first_divergence is outputs[0]


def test_a_failing_value_that_feeds_no_failing_output_is_not_the_first_divergence():
    """A TopK's indices nothing reads may differ at ties: the divergence starts elsewhere."""
    comparisons = [record(0, Status.FAIL, value="indices"), record(1, Status.FAIL)]
    failing = output(Status.FAIL)
    upstream = {"output_0": {"output_0", "v1", "v0_input"}}

    def feeding(outputs):
        return set().union(*(upstream[name] for name in outputs))

    decision = decide(comparisons, [failing], feeding=feeding)
    assert decision.first_divergence is comparisons[1]
    assert decision.note is not None and "'indices'" in decision.note  # set aside, said
    assert decide(comparisons, [failing]).first_divergence is comparisons[0]
    # Control flow: what feeds the outputs is not known, so nothing is set aside.
    assert decide(comparisons, [failing],
                  feeding=lambda outputs: None).first_divergence is comparisons[0]


def test_only_values_both_sides_computed_bit_for_bit_alike_are_identical():
    exact, close = record(0), record(1, max_abs=1e-7)
    reshaped = replace(record(2), candidate_shape=[1, 2])
    failing = record(3, Status.FAIL)
    assert identical_values([exact, close, reshaped, failing]) == {"v0"}


def test_a_failing_value_behind_an_identical_one_is_set_aside():
    """OpenVINO's 32-bit BitwiseOr (v0) under a Where both sides compute alike (v1)."""
    from bisect_onnx.graph.nodes import NodeInfo
    from bisect_onnx.graph.reach import feeding
    from bisect_onnx.graph.view import GraphView

    nodes = [NodeInfo(0, "or", "BitwiseOr", ("v0",), None, ("x",)),
             NodeInfo(1, "where", "Where", ("v1",), None, ("v0", "x")),
             NodeInfo(2, "mul", "Mul", ("v2",), None, ("x",)),
             NodeInfo(3, "add", "Add", ("output_0",), None, ("v1", "v2"))]
    comparisons = [record(0, Status.FAIL), record(1), record(2, Status.FAIL)]
    decision = decide(comparisons, [output(Status.FAIL)], feeding=lambda outputs: feeding(
        GraphView.of(nodes), outputs, settled=identical_values(comparisons)))
    assert decision.first_divergence is comparisons[2]
    assert "'v0'" in decision.note and "computed alike" in decision.note
