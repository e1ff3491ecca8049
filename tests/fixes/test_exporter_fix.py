"""Exporter culprits: other exports tried on real exporter bugs, and the standalone script.

Two real translation bugs of torch 2.13 (found by exporting single ops both ways):
- the TorchScript exporter drops ``nn.Softplus``'s ``threshold`` (beta=2, threshold=1
  is off by 0.15), which the dynamo exporter translates right: an "other exporter" fix;
- both exporters drop ``nn.AvgPool2d``'s ``divisor_override`` (``avgpool_divisor``), at
  every opset: no export fixes it, so the search writes the standalone script.
The exports are live: exporting is what is tested.
"""

import numpy as np
import onnx
import pytest
import torch

from bisect_onnx.fixes.exporter_fix import Baseline, find_export_fix
from bisect_onnx.fixes.exporter_op import CannotIsolate, locate_culprit_op
from bisect_onnx.fixes.exporter_repro import check_repro_script, exporter_repro_script
from bisect_onnx.fixes.exporter_trials import torch_outputs
from bisect_onnx.fixes.trial import FixKind
from bisect_onnx.judge.tolerances import Tolerance
from bisect_onnx.pytorch.reexport import ExportCall

RTOL, ATOL = 1e-3, 1e-5
TOLERANCE = Tolerance(RTOL, ATOL)


class SoftplusHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.act = torch.nn.Softplus(beta=2, threshold=1)

    def forward(self, x):
        return self.act(self.fc(x))


@pytest.fixture(scope="module")
def softplus():
    torch.manual_seed(0)
    return SoftplusHead().eval(), (torch.randn(4, 8),)


@pytest.fixture(scope="module")
def pool(fixture_case):
    model, inputs, _ = fixture_case("avgpool_divisor")
    return model, (torch.from_numpy(inputs["x"]),)


def test_the_dynamo_exporter_fixes_the_torchscript_softplus_and_the_model_is_left_alone(
        softplus):
    model, args = softplus
    state = {name: value.clone() for name, value in model.state_dict().items()}
    search = find_export_fix(model, args, used=ExportCall("torchscript", 18),
                             tolerance=TOLERANCE)
    assert search.before.max_abs > 0.1  # the used export was measured, and fails
    assert search.fixed
    fix = search.results[-1]
    assert fix.kind == FixKind.OTHER_EXPORT and fix.reaches_parity
    assert fix.details["export"] == {"exporter": "dynamo", "opset": 18, "options": {}}
    assert fix.details["call"] == ('torch.onnx.export(model, args, "model.onnx", dynamo=True, '
                                   'opset_version=18)')
    assert fix.after.max_abs < 1e-5 and fix.factor > 1e4
    fixed = onnx.load_from_string(fix.fixed_model)  # the re-export itself, for --write-fixed
    assert any(node.op_type == "Softplus" for node in fixed.graph.node)
    assert len(search.attempts) == 2  # the used export, then the first candidate fixed it
    assert all(torch.equal(value, state[name]) for name, value in model.state_dict().items())
    assert not model.training


def test_the_search_stops_when_its_time_budget_is_spent(softplus):
    model, args = softplus
    reference = torch_outputs(model, args, {})
    search = find_export_fix(model, args, used=ExportCall("torchscript", 18),
                             tolerance=TOLERANCE, time_budget_s=0.0,
                             baseline=Baseline(reference, _figures(reference)))
    assert search.out_of_time and search.attempts == () and search.results == ()


def _figures(reference):
    from bisect_onnx.fixes.trial import output_figures
    return output_figures(reference, [np.zeros_like(reference[0])], rtol=RTOL, atol=ATOL)


def test_no_export_fixes_the_dropped_divisor_override(pool):
    model, args = pool
    search = find_export_fix(model, args, used=ExportCall("dynamo", 18),
                             tolerance=TOLERANCE, candidates=[ExportCall("torchscript", 18),
                                                              ExportCall("dynamo", 17)])
    assert not search.fixed and search.results == ()  # neither improves: no result at all
    assert [attempt.figures.passes for attempt in search.attempts] == [False] * 3
    assert "none reaches parity" in search.summary()


def test_a_failing_export_is_an_attempt_with_its_reason_not_a_result(softplus):
    model, args = softplus
    search = find_export_fix(model, args, used=ExportCall("torchscript", 18),
                             tolerance=TOLERANCE, candidates=[ExportCall("torchscript", 3)])
    assert search.results == ()
    assert search.attempts[-1].figures is None and "opset 3" in search.attempts[-1].failure


def test_the_culprit_op_is_found_by_value_name_and_by_module(pool):
    model, args = pool
    by_name = locate_culprit_op(model, args, value_name="avg_pool2d")
    assert by_name.target == "aten.avg_pool2d.default"
    assert by_name.call == ("torch.ops.aten.avg_pool2d.default(input0, [2, 2], [2, 2], "
                            "[0, 0], False, True, 3)")
    assert [(spec.shape, spec.dtype) for spec in by_name.inputs] == [((1, 4, 8, 8), "float32")]
    assert locate_culprit_op(model, args, module="pool").call == by_name.call
    with pytest.raises(CannotIsolate, match="no op of the traced model"):
        locate_culprit_op(model, args, value_name="nothing", module="fc.missing")


def test_the_standalone_script_shows_the_divisor_override_bug_when_run(pool):
    model, args = pool
    op = locate_culprit_op(model, args, value_name="avg_pool2d")
    text = exporter_repro_script(op, ExportCall("dynamo", 18), rtol=RTOL, atol=ATOL,
                                 culprit="node 'node_avg_pool2d'")
    compile(text, "exporter_repro.py", "exec")
    check = check_repro_script(text)
    assert check.reproduces and check.returncode == 1, check.output
    assert "MISMATCH" in check.output and "aten.avg_pool2d.default" in check.output
    assert "dynamo=True, opset_version=18" in check.output


def test_the_standalone_script_of_a_right_translation_exits_0(softplus):
    model, args = softplus
    op = locate_culprit_op(model, args, module="act")
    assert op.target == "aten.softplus.default"
    text = exporter_repro_script(op, ExportCall("dynamo", 18), rtol=RTOL, atol=ATOL)
    check = check_repro_script(text)
    assert not check.reproduces and check.returncode == 0, check.output
    assert "OK: the export agrees" in check.output
    wrong = exporter_repro_script(op, ExportCall("torchscript", 18), rtol=RTOL, atol=ATOL)
    assert check_repro_script(wrong).reproduces, "the TorchScript softplus bug, alone"


def test_a_script_that_cannot_export_exits_2_and_does_not_reproduce(pool):
    model, args = pool
    op = locate_culprit_op(model, args, value_name="avg_pool2d")
    text = exporter_repro_script(op, ExportCall("torchscript", 3), rtol=RTOL, atol=ATOL)
    check = check_repro_script(text)
    assert check.returncode == 2 and not check.reproduces, check.output
    assert "the export or ONNX Runtime failed" in check.output
