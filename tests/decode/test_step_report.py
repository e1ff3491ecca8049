"""Which step fails first and how, read off per-step rows (no model runs here)."""

from __future__ import annotations

import json

from bisect_onnx.decode.step_report import (
    DecodeReport,
    Deviation,
    StepComparison,
    StepRow,
    find_failure,
)
from bisect_onnx.decode.text import decode_text

OK, BAD = Deviation(1e-7, passed=True), Deviation(1e-2, passed=False)


def _comparison(*, logits: bool = True, layer_1: float | None = None) -> StepComparison:
    value = (Deviation(1e-7, passed=True) if layer_1 is None
             else Deviation(layer_1, passed=layer_1 < 1e-5))
    return StepComparison(logits=OK if logits else BAD, keys=(OK, OK), values=(OK, value))


def _rows(teacher_fails: set[int] = frozenset(), drift: float | None = None,
          steps: int = 6) -> tuple[StepRow, ...]:
    rows = []
    for step in range(steps + 1):
        free_value = None if drift is None else drift * (step + 1)
        rows.append(StepRow(
            step=step, position=0 if step == 0 else 3 + step, length=4 if step == 0 else 1,
            reference_token=(7,), teacher_token=(7,), free_token=(7,) if step < 5 else (8,),
            teacher=_comparison(logits=step not in teacher_fails),
            free=_comparison(logits=step not in teacher_fails, layer_1=free_value)))
    return tuple(rows)


def test_a_step_failing_only_at_the_prefill_is_named_so():
    finding = find_failure(_rows({0}))
    assert (finding.step, finding.kind, finding.where) == (0, "introduced", "prefill only")
    assert find_failure(_rows({0, 3})).where == "prefill and decode"


def test_steps_failing_from_a_position_on_are_named_at_it():
    finding = find_failure(_rows({3, 4, 5, 6}))
    assert (finding.step, finding.where) == (3, "decode, from position 6 on")
    assert find_failure(_rows({3, 5})).where == "decode"


def test_a_drift_through_the_cache_names_its_layer_and_growth():
    finding = find_failure(_rows(drift=3e-6))
    assert (finding.step, finding.kind, finding.layer) == (3, "accumulated", 1)
    assert finding.growth[:4] == (3e-6, 6e-6, 9e-6, 1.2e-5)


def test_parity_has_no_finding_and_the_text_shows_tokens_to_the_first_difference():
    rows = _rows()
    assert find_failure(rows) is None
    report = DecodeReport("M", "(exported)", "dynamo", 1e-3, 1e-5, ((1, 2, 3, 4),), rows)
    text = decode_text(report)
    assert "tokens, part ways at step 5:" in text
    assert "  torch:   7 7 7 7 7 7\n  runtime: 7 7 7 7 7 8" in text
    assert text.endswith("PARITY: prefill and 6 decode steps within tolerance, "
                         "teacher-forced and free-running (rtol=0.001, atol=1e-05)")
    data = json.loads(json.dumps(report.to_dict()))
    assert data["first_token_difference"] == 5 and data["first_failure"] is None
    assert data["steps"][1]["tokens"] == {"reference": [7], "teacher_forced": [7],
                                          "free_running": [7]}


def test_a_drift_after_a_near_tie_says_the_tokens_parted_first():
    rows = _rows(drift=1e-6, steps=12)  # the free-running token differs from step 5
    report = DecodeReport("M", "(exported)", "dynamo", 1e-3, 1e-5, ((1, 2, 3, 4),), rows,
                          find_failure(rows))
    assert report.finding.step == 10  # 1.1e-05 > atol
    assert "chose another token at step 5 with its logits within tolerance" in str(report)
