"""The verdict: from ordered records to parity/diverged and the first divergence.

Pure logic on records, no models: the drivers in :mod:`bisect_onnx.pipeline` run the
sides; this decides what the numbers mean.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from bisect_onnx.judge.records import Record
from bisect_onnx.judge.vocabulary import Verdict

__all__ = ["Decision", "decide", "identical_values"]


@dataclass(frozen=True)
class Decision:
    """What the records say."""

    verdict: Verdict
    first_divergence: Record | None
    hidden_divergences: list[Record]
    note: str | None
    nan_origin: Record | None = None
    """The first value holding NaN or Inf on one side only, where it differs from the
    first divergence (an earlier value may fail by a small margin): where the NaN
    starts matters more than where a tolerance was first crossed."""


def decide(comparisons: Sequence[Record], final_outputs: Sequence[Record],
           output_order: Mapping[str, int] | None = None,
           feeding: Callable[[Sequence[str]], Collection[str] | None] | None = None,
           ) -> Decision:
    """Decide the verdict from the final outputs and locate the first divergence.

    ``comparisons`` must be in topological order. The verdict is ``diverged`` when
    any final output fails. The first divergence is then the first failing comparison
    the failing outputs are computed from (``feeding``: the values the given outputs
    are computed from; ``None`` for either, any value may be); a failing value that
    feeds none of them is set aside, with a note. If none fails, it is the failing
    final output computed first (``output_order``: ONNX value -> graph position), with
    a note that the culprit lies after the last passing checkpoint. Intermediate
    failures under passing outputs (masked positions, say) are *hidden divergences*,
    not a verdict.
    """
    failing_outputs = [record for record in final_outputs if record.failed]
    if not failing_outputs:
        failing = [record for record in comparisons if record.failed]
        note = None
        if failing:
            note = (
                f"{len(failing)} intermediate value(s) diverge but the final outputs agree "
                "(masked or discarded positions?): listed as hidden divergences"
            )
        return Decision(Verdict.PARITY, None, failing, note)
    relevant, aside = _feeding_rows(comparisons, failing_outputs, feeding)
    failing = [record for record in relevant if record.failed]
    if failing:
        nan_origin = next((record for record in failing if record.figures.nan_mismatch), None)
        return Decision(Verdict.DIVERGED, failing[0], [], aside,
                        nan_origin if nan_origin is not failing[0] else None)
    passing = [record for record in relevant if not record.failed]
    last_passing = passing[-1] if passing else None
    where = (
        f"after the last passing checkpoint ({last_passing.torch_module} = ONNX value "
        f"{last_passing.onnx_value!r})" if last_passing
        else "somewhere in the graph: no intermediate value could be compared"
    )
    note = (f"no aligned intermediate value that feeds the failing outputs fails; the "
            f"culprit lies {where}") + (f"; {aside}" if aside else "")
    order = output_order or {}
    first_output = min(failing_outputs,
                       key=lambda record: order.get(record.onnx_value, len(order) + record.index))
    return Decision(Verdict.DIVERGED, first_output, [], note)


def identical_values(comparisons: Sequence[Record]) -> frozenset[str]:
    """The values both sides computed alike, bit for bit (``feeding``'s ``settled``).

    An error upstream of one stops there.
    """
    return frozenset(record.onnx_value for record in comparisons if record.identical)


def _feeding_rows(comparisons: Sequence[Record], failing_outputs: Sequence[Record],
                  feeding: Callable[[Sequence[str]], Collection[str] | None] | None,
                  ) -> tuple[list[Record], str | None]:
    """The rows the failing outputs are computed from, and a note on the failing others.

    The others: a TopK's indices nothing reads, say, differing where values tie.
    """
    upstream = (feeding([record.onnx_value for record in failing_outputs])
                if feeding is not None else None)
    if upstream is None:
        return list(comparisons), None
    relevant = [record for record in comparisons if record.onnx_value in upstream]
    aside = [record for record in comparisons
             if record.failed and record.onnx_value not in upstream]
    if not aside:
        return relevant, None
    return relevant, (f"{len(aside)} failing value(s) feed no failing output, or only "
                      "through a value both sides computed alike (first: "
                      f"{aside[0].onnx_value!r}), so none of them is where the divergence "
                      "starts")
