"""A sample's comparison is one list of stages: each applies or is skipped, in order."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import bisect_onnx
from bisect_onnx.pipeline.onnx_sample import ONNX_STAGES
from bisect_onnx.pipeline.stages import Stage, run_stages
from bisect_onnx.pipeline.torch_sample import TORCH_STAGES


@dataclass(frozen=True)
class Count:
    value: int = 0
    log: tuple[str, ...] = ()


def _add(amount: int, name: str):
    return Stage(name, lambda state: replace(state, value=state.value + amount,
                                             log=(*state.log, name)),
                 lambda state: state.value < 10)


def test_each_stage_that_applies_runs_on_what_the_one_before_returned():
    state = run_stages([_add(4, "a"), _add(4, "b"), _add(4, "c"), _add(1, "d")], Count())
    assert state.log == ("a", "b", "c")  # d: 12 is not under 10
    assert state.value == 12


def _stages_run(caplog) -> list[str]:
    return [record.getMessage().removeprefix("stage: ") for record in caplog.records
            if record.name == "bisect_onnx.pipeline.stages"
            and record.getMessage().startswith("stage: ")]


def test_a_diverged_pytorch_sample_runs_every_stage_but_the_memory_bisection(
        fixture_case, caplog):
    model, inputs, _ = fixture_case("avgpool_divisor")
    from fixtures.registry import FIXTURES, repo_path

    with caplog.at_level(logging.DEBUG, logger="bisect_onnx.pipeline.stages"):
        report = bisect_onnx.bisect(model, inputs,
                                    onnx_model=repo_path(FIXTURES["avgpool_divisor"].onnx_file))
    assert report.diverged and report.culprit is not None
    names = [stage.name for stage in TORCH_STAGES]
    # (The file's shapes are fixed: the run's are the export's, nothing could be baked.)
    assert _stages_run(caplog) == [name for name in names
                                   if name not in ("bisect production over the memory budget",
                                                   "check for baked shapes", "suggest fixes")]


def test_an_onnx_sample_at_parity_attributes_nothing(fixture_case, caplog):
    _, inputs, path = fixture_case("tiny_mlp")
    with caplog.at_level(logging.DEBUG, logger="bisect_onnx.pipeline.stages"):
        report = bisect_onnx.bisect_onnx_models(
            path, None, inputs, candidate_runtime=bisect_onnx.RuntimeOptions(opt_level="basic"))
    assert not report.diverged
    assert _stages_run(caplog) == [stage.name for stage in ONNX_STAGES if stage.name not in (
        "probe production", "attribute the culprit", "suggest fixes")]


def test_over_the_memory_budget_production_is_bisected_instead(fixture_case, caplog):
    model, inputs, _ = fixture_case("avgpool_divisor")
    from fixtures.registry import FIXTURES, repo_path

    with caplog.at_level(logging.DEBUG, logger="bisect_onnx.pipeline.stages"):
        report = bisect_onnx.bisect(model, inputs,
                                    onnx_model=repo_path(FIXTURES["avgpool_divisor"].onnx_file),
                                    runtime=bisect_onnx.RuntimeOptions(max_memory="1KB"))
    assert report.diverged and report.search.mode == "bisection"
    ran = _stages_run(caplog)
    assert "bisect production over the memory budget" in ran
    assert "op values for a divergence" not in ran  # over the budget, nothing is traced


def test_a_samples_report_is_laid_out_once_after_its_last_stage(fixture_case, monkeypatch):
    """Stages read the findings (a Reading); the report is made once, with the fixes."""
    import bisect_onnx.judge.assembly as assembly
    import bisect_onnx.pipeline.torch_sample as torch_sample

    made = []

    def counting(findings):
        made.append(findings)
        return assembly.assemble(findings)

    monkeypatch.setattr(torch_sample, "assemble", counting)
    model, inputs, path = fixture_case("avgpool_divisor")
    report = bisect_onnx.bisect(model, inputs, onnx_model=path, suggest_fix=True)
    assert report.diverged and report.culprit is not None and report.fix_notes
    assert len(made) == 1 and made[0] is report.findings
