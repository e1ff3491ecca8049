"""OpenVINO models compiled for the CPU, and run the way ONNX Runtime sessions are.

The rest of bisect-onnx runs a candidate through objects with ONNX Runtime's
``run(fetched, feeds)``: :class:`OpenVinoSession` gives a compiled model that face,
so local checks and probes run in OpenVINO, in its inference precision, as
production does.

A value OpenVINO computes in bf16 or f16 and hands out in that type comes back from
its Python API as ``float16``-typed bits (bf16 has no numpy type): it is widened to
float32 here, exactly, so every value compares as the ONNX graph's float32.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bisect_onnx.errors import ModelError, UsageError, one_line

if TYPE_CHECKING:
    from types import ModuleType

    import openvino as ov

__all__ = ["import_openvino", "OpenVinoSession", "compile_model", "read_model", "with_outputs",
           "as_float32", "default_precision", "NARROW_TYPES", "DEVICE"]

DEVICE = "CPU"
#: Output precisions (as the runtime model writes them) a captured value is asked in,
#: so that its layer keeps the precision it has in production.
NARROW_TYPES = {"bf16": "bf16", "f16": "f16"}


def import_openvino() -> ModuleType:
    """The ``openvino`` package, or a one-line error saying how to install it."""
    try:
        import openvino
    except ImportError as error:
        raise UsageError(f"runtime openvino needs OpenVINO, which is not importable "
                         f"({error}); pip install bisect-onnx[openvino]") from None
    return openvino


def read_model(core: ov.Core, source: Path | bytes, label: str) -> ov.Model:
    """OpenVINO's model of an ONNX file (read in place) or of serialized ONNX bytes."""
    try:
        if isinstance(source, Path):
            return core.read_model(str(source))
        # ONNX bytes: external weights are found beside the user's file only when read
        # from a path (a limit of local checks on such models: docs/openvino.md).
        return core.read_model(source)
    except Exception as error:
        raise ModelError(f"OpenVINO could not read {label}: {one_line(error)}") from error


def compile_model(core: ov.Core, model: ov.Model, precision: str | None,
                  label: str) -> ov.CompiledModel:
    """The model compiled for the CPU, in ``precision`` (``None``: OpenVINO's default)."""
    config = {} if precision is None else {"INFERENCE_PRECISION_HINT": precision}
    try:
        return core.compile_model(model, DEVICE, config)
    except Exception as error:
        raise ModelError(f"OpenVINO could not compile {label}: {one_line(error)}") from error


def default_precision(core: ov.Core) -> str:
    """The CPU plugin's inference precision when none is asked for (``bf16``, ``f32``)."""
    return core.get_property(DEVICE, "INFERENCE_PRECISION_HINT").get_type_name()


def with_outputs(model: ov.Model, names: Sequence[str],
                 element_types: Mapping[str, str] | None = None) -> ov.Model:
    """``model`` with the tensors ``names`` made outputs, each in its element type.

    ``element_types``: the OpenVINO precision (``bf16``) to hand a value out in; the
    others come out as the graph declares them (float32), which makes their layer
    write float32 where production writes bf16, and changes what follows.
    """
    if not names:
        return model
    openvino = import_openvino()
    model.add_outputs(list(names))
    wanted = {name: kind for name, kind in (element_types or {}).items() if name in names}
    if not wanted:
        return model
    steps = openvino.preprocess.PrePostProcessor(model)
    for name, kind in wanted.items():
        steps.output(name).tensor().set_element_type(getattr(openvino.Type, kind))
    return steps.build()


def as_float32(tensor: ov.Tensor) -> np.ndarray:
    """An output tensor as numpy: bf16 and f16 widened (exactly) to float32, others copied."""
    kind = tensor.element_type.get_type_name()
    data = tensor.data
    if kind == "bf16":
        bits = np.asarray(data).view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32)
    if kind == "f16":
        return np.asarray(data, dtype=np.float32)
    return np.array(data)  # a copy: the request reuses its buffers


@dataclass
class _Output:
    name: str


class OpenVinoSession:
    """A compiled model with ONNX Runtime's ``run(fetched, feeds)`` and ``get_outputs()``."""

    def __init__(self, compiled: ov.CompiledModel, label: str) -> None:
        self.compiled = compiled
        self.label = label
        self._request = compiled.create_infer_request()
        self._ports = {name: index for index, port in enumerate(compiled.outputs)
                       for name in port.get_names()}

    def get_outputs(self) -> list[_Output]:
        """Each output by one of its names, in the compiled model's order."""
        names = []
        for port in self.compiled.outputs:
            known = sorted(port.get_names())
            names.append(_Output(known[0] if known else ""))
        return names

    def run(self, fetched: Sequence[str] | None,
            feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Run once on ``feeds`` (by input name); the ``fetched`` outputs, in order."""
        try:
            self._request.infer(dict(feeds))
        except Exception as error:
            raise ModelError(f"OpenVINO failed to run {self.label}: {one_line(error)}") \
                from error
        if fetched is None:
            fetched = [output.name for output in self.get_outputs()]
        return [as_float32(self._request.get_output_tensor(self._ports[name]))
                for name in fetched]

    def run_all(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every output, under each of its names."""
        self.run((), feeds)
        by_name = {}
        for index, port in enumerate(self.compiled.outputs):
            array = as_float32(self._request.get_output_tensor(index))
            for name in port.get_names():
                by_name[name] = array
        return by_name
