"""A recorded reference as the reference side of ONNX against ONNX.

``bisect-onnx check`` compares the runtime under test with PyTorch's values recorded
where PyTorch runs (:mod:`bisect_onnx.reference`). The comparison is ONNX against ONNX's
(:mod:`bisect_onnx.pipeline.onnx_sample`) with this runner as its reference: its "run"
hands back the recorded values, by the ONNX value names they were aligned to, once the
inputs are checked to be the recorded ones. It computes nothing, so it has no sessions.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace

import numpy as np

from bisect_onnx.errors import InputError
from bisect_onnx.runtime.input_specs import InputSpec
from bisect_onnx.runtime.runner import (
    ProductionCheck,
    ReferenceOnlyRunner,
    Runner,
    RuntimeRun,
    captured_by_node,
)
from bisect_onnx.runtime.sides import CapturedValue, JsonObject

__all__ = ["RecordedRunner", "RECORDED"]

#: The runner's name: the report's ``reference.kind`` and ``environment.reference_runtime``.
RECORDED = "recorded"

_REFERENCE_ONLY = ("a recorded reference holds values, it runs nothing; check it against "
                   "a runtime (bisect-onnx check REF --runtime ...)")


class RecordedRunner(ReferenceOnlyRunner):
    """PyTorch's recorded values of the file the runner ``beside`` runs, by ONNX value name.

    ``values`` gives the recorded arrays, those named or (``None``) all of them, read
    from the archive when a run asks; ``outputs`` names the recorded final outputs in
    order; ``inputs`` are the recorded inputs in the graph's order, which every run
    must be given again; ``description`` is the report's ``reference`` entry.
    """

    runtime = RECORDED
    reference_label = "recorded reference"
    reference_only = _REFERENCE_ONLY

    def __init__(self, beside: Runner, *,
                 values: Callable[[Collection[str] | None], Mapping[str, np.ndarray]],
                 outputs: Sequence[str], inputs: Sequence[np.ndarray],
                 description: JsonObject) -> None:
        # The graph the runtime under test loaded, shared rather than loaded again (a
        # large model's file takes seconds to read): a recorded reference only reads it.
        self.path, self.promote, self.model = beside.path, "all", beside.model
        self.inputs, self.nodes, self.view = beside.inputs, beside.nodes, beside.view
        self.output_names = beside.output_names
        self._values = values
        self._outputs = list(outputs)
        self._inputs = [np.asarray(array) for array in inputs]
        self._description = description

    def describe(self) -> JsonObject:
        """The recorded reference: the archive, and what was recorded."""
        return dict(self._description)

    def describe_capture(self, production: ProductionCheck | None) -> JsonObject:
        """The values were recorded, not captured here."""
        return {"mode": "recorded values"}

    def with_promotion(self, promote: str) -> RecordedRunner:
        """Itself: what was recorded is all there is."""
        return self

    def run(self, inputs: Sequence[np.ndarray]) -> RuntimeRun:
        """The recorded values, once ``inputs`` are found to be the recorded ones.

        In the order they were recorded: the order the recording's comparison paired
        them in (a reference ONNX file's graph order, where a converter reordered the
        candidate's nodes), which the check's rows keep.
        """
        self.check_inputs(inputs)
        recorded = self._values(None)
        capture = captured_by_node(self.nodes, self._outputs, recorded)
        return RuntimeRun(replace(capture, values={
            name: capture.values[name] for name in recorded if name in capture.values}))

    def run_outputs(self, inputs: Sequence[np.ndarray]) -> list[CapturedValue]:
        """The recorded final outputs, and no other value read."""
        self.check_inputs(inputs)
        return captured_by_node(self.nodes, self._outputs,
                                self._values(set(self._outputs))).outputs

    def check_inputs(self, inputs: Sequence[np.ndarray]) -> None:
        """Refuse inputs other than the recorded ones: the values hold for those only."""
        self.check_given(self.inputs, inputs, self._inputs)

    @staticmethod
    def check_given(specs: Sequence[InputSpec], given: Sequence[np.ndarray],
                    recorded: Sequence[np.ndarray]) -> None:
        """Refuse ``given`` inputs that are not the ``recorded`` ones, naming the first."""
        if len(given) != len(recorded):
            raise InputError(f"{len(given)} input(s) given, but the reference was recorded "
                             f"on {len(recorded)}; give the recorded inputs or none")
        for spec, one, kept in zip(specs, given, recorded, strict=True):
            one, kept = np.asarray(one), np.asarray(kept)
            if one.shape != kept.shape or one.dtype != kept.dtype:
                differs = f"{one.dtype}{list(one.shape)}, recorded {kept.dtype}{list(kept.shape)}"
            elif not np.array_equal(one, kept, equal_nan=one.dtype.kind in "fc"):
                differs = _how_values_differ(one, kept)
            else:
                continue
            raise InputError(f"input {spec.name!r} is not the one the reference was recorded "
                             f"on ({differs}): its values hold for the recorded inputs only; "
                             "give those, or none")



    def where_it_ran(self, value: str, node: str | None) -> JsonObject:
        """Recorded elsewhere."""
        return {"runtime": self.runtime, "provider": None, "kernel": None}


def _how_values_differ(given: np.ndarray, recorded: np.ndarray) -> str:
    """How many elements differ, the first's index, and by how much where numeric."""
    unequal = given != recorded
    if given.dtype.kind in "fc":
        unequal &= ~(np.isnan(given) & np.isnan(recorded))
    count = int(unequal.sum())
    first = tuple(int(i) for i in np.argwhere(unequal)[0]) if given.ndim else ()
    said = f"{count} of {given.size} elements differ, the first at {list(first)}"
    ours, theirs = given[unequal], recorded[unequal]
    if given.dtype.kind in "iu":  # Python's integers: int64 past 2**53 keeps its units
        gaps = [abs(x - y) for x, y in zip(ours.tolist(), theirs.tolist(), strict=True)]
        said += f", by up to {max(gaps)}"
    elif given.dtype.kind in "fc":  # a complex number by the modulus of its difference
        wide = np.complex128 if given.dtype.kind == "c" else np.float64
        said += f", by up to {float(np.max(np.abs(ours.astype(wide) - theirs.astype(wide)))):.3g}"
    return said

