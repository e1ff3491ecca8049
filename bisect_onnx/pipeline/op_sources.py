"""Where a sample's op values come from.

The program at hand, a TorchScript trace, the whole model traced again, or only the
module call that holds a divergence. Tracing a model again (a file exported elsewhere)
takes seconds, so it is done only where op precision pays for it: on a divergence (a
hidden one has a culprit too), or when op granularity is asked for. At default
granularity a dynamo file's divergence first gets its culprit at module level, and only
that culprit's module call is traced (:mod:`bisect_onnx.pipeline.call_ops`); the whole
model is traced where that call cannot be traced alone exactly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from bisect_onnx.errors import ModelError
from bisect_onnx.events import CAPTURE_STARTED, emit
from bisect_onnx.judge.findings import Findings
from bisect_onnx.judge.reading import Reading
from bisect_onnx.pipeline.call_ops import (
    culprit_call_ops,
    exact_at_module_level,
    traces_one_call,
)
from bisect_onnx.pipeline.production import wants_probes
from bisect_onnx.pytorch.op_values import OpCapture, capture_ops
from bisect_onnx.pytorch.private_apis import PrivateApiMissing
from bisect_onnx.pytorch.script_ops import capture_script_ops
from bisect_onnx.runtime.sides import Capture

if TYPE_CHECKING:
    from bisect_onnx.align.modules import Pair
    from bisect_onnx.pipeline.production import CandidateRun
    from bisect_onnx.pipeline.torch_attribution import SampleValues
    from bisect_onnx.pipeline.torch_settings import Settings

__all__ = ["op_values", "later_op_values", "LaterOps"]

logger = logging.getLogger(__name__)


def op_values(settings: Settings, arrays: Sequence[np.ndarray], *, diverged: bool,
              memory_reason: str | None, later: bool = True) -> OpCapture | None:
    """Every ATen op's value, where the program the exporter translated is at hand.

    Over the budget, values are probed by their op names only on a divergence, and at
    parity nothing is probed, so no op values are needed. ``later``: nothing yet where
    :func:`later_op_values` may trace the culprit's module call alone once module level
    has found it.
    """
    prepared, granularity = settings.prepared, settings.granularity
    # Before PyTorch runs, ONNX Runtime's whole-model sessions are gone and parked weights
    # come back (a Linear's, parked on the file's transpose, could round otherwise). Over
    # the budget production is probed later, and they stay parked.
    weights_back = settings.parking.restore if not memory_reason else lambda: None
    # A file of unknown origin (its metadata dropped by an opset conversion, say) has
    # no module level to fall back on: it is matched to an export made here even at
    # parity, or nothing inside it is compared.
    unknown_origin = prepared.exporter == "unknown" and granularity is None and not memory_reason
    if prepared.wants_program and (granularity == "op" or unknown_origin or diverged and (
            granularity is None or memory_reason)):
        if later and not memory_reason and traces_one_call(settings):
            return None
        weights_back()
        prepared.find_program(settings.reference, arrays, settings.workdir)
    elif prepared.traced_elsewhere(settings.reference, arrays):
        weights_back()  # it may hold sizes the model computes anew at these shapes
        prepared.trace_at(settings.reference, arrays, settings.workdir)
    if prepared.script is not None and (diverged or not memory_reason):
        weights_back()
        emit(CAPTURE_STARTED, "pytorch ops")  # a TorchScript file: the traced graph's ops
        try:
            return capture_script_ops(prepared.script, arrays, prepared.script_aliases)
        except PrivateApiMissing as error:  # module level still compares the file
            logger.info("no op level for the TorchScript file: %s", error)
            return None
    if prepared.program is None or not (diverged or not memory_reason):
        return None
    weights_back()
    emit(CAPTURE_STARTED, "pytorch ops")
    try:
        return capture_ops(prepared.program, arrays)
    except ModelError as error:
        # torch.export's program of the model may fail where the model runs (a view
        # its decompositions made of a non-contiguous tensor): module level compares
        # without it.
        logger.warning("no op level: %s", error)
        return None


class LaterOps(NamedTuple):
    """What :func:`later_op_values` found: op values, or module-level findings that are exact."""

    ops: OpCapture | None = None
    attributed: tuple[Findings, SampleValues] | None = None
    """The findings attributed at module level, and the values ``attribute`` returned
    with them, where op level could name nothing finer: the sample's, as they are."""


def later_op_values(settings: Settings, arrays: Sequence[np.ndarray], report: Reading,
                    captures: tuple[Capture, Capture], pairs: Sequence[Pair], run: CandidateRun,
                    *, attribute: Callable[[Findings], tuple[Findings, SampleValues]]
                    ) -> LaterOps:
    """Op values for a divergence ``report`` found without them.

    Its module call's, else the whole model's (none where there are none), or nothing
    where the module-level attribution is already exact. ``attribute`` attributes a
    report's findings (module level here). Where production must be probed for the first
    divergence, the module-level one may not be it: the whole model is traced, as before.
    """
    probes, prepared = wants_probes(report, run, settings.judge.base), settings.prepared
    if not probes and (prepared.wants_program or prepared.script is not None
                       or prepared.program is not None):
        # PyTorch runs again, and ONNX Runtime's whole-model sessions are gone: parked
        # weights are read back at once (in parallel), not page by page as the trace
        # touches them. Where production is still to be probed they stay parked, and
        # where there is nothing to trace they are not read.
        settings.parking.restore()
    if traces_one_call(settings) and not probes:
        attributed = attribute(report.findings)
        module_level = Reading(attributed[0])  # its culprit says which call to trace
        if exact_at_module_level(module_level, settings.prepared.candidate.nodes):
            return LaterOps(attributed=attributed)
        ops = culprit_call_ops(settings.prepared, settings.reference, arrays, module_level,
                               captures, {pair.candidate.name: pair.reference.array
                                          for pair in pairs})
        if ops is not None:
            return LaterOps(ops)
    return LaterOps(op_values(settings, arrays, diverged=True, memory_reason=None, later=False))
