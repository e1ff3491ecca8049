"""Planted bugs: small edits of an exported ONNX file that make it disagree with PyTorch.

Each edit changes one node, so a test knows exactly which node and module the
divergence must be reported at.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from bisect_onnx.graph.provenance import read_torch_metadata


def plant(source: Path, target: Path, edit: Callable[[onnx.ModelProto], onnx.NodeProto]):
    """Copy ``source`` to ``target`` with ``edit`` applied; return the edited node's name
    and, for a dynamo export, its innermost module (from metadata; else ``None``)."""
    model = onnx.load(str(source))
    node = edit(model)
    onnx.save(model, str(target))
    meta = read_torch_metadata({p.key: p.value for p in node.metadata_props})
    return node.name, meta.scopes[-1] if meta else None


def node_of_module(model: onnx.ModelProto, module: str, op_type: str) -> onnx.NodeProto:
    """The node of ``op_type`` in ``module``: named so (a TorchScript export's
    ``/layer2/conv1/Conv``), or whose innermost module scope it is (a dynamo export)."""
    for node in model.graph.node:
        if node.name == module and node.op_type == op_type:
            return node
    for node in model.graph.node:
        meta = read_torch_metadata({p.key: p.value for p in node.metadata_props})
        if node.op_type == op_type and meta and meta.scopes and meta.scopes[-1] == module:
            return node
    raise LookupError(f"no {op_type} node in module {module}")


def scale_conv_weight(module: str, factor: float):
    """Multiply the weight of the Conv node of ``module`` by ``factor``."""

    def edit(model: onnx.ModelProto) -> onnx.NodeProto:
        node = node_of_module(model, module, "Conv")
        for index, init in enumerate(model.graph.initializer):
            if init.name == node.input[1]:
                scaled = numpy_helper.to_array(init) * np.float32(factor)
                model.graph.initializer[index].CopyFrom(numpy_helper.from_array(scaled, init.name))
                return node
        raise LookupError(f"weight {node.input[1]} is not an initializer")

    return edit


def shift_bias(module: str, op_type: str, amount: float):
    """Add ``amount`` to the bias (input 2) of the ``op_type`` node of ``module``."""

    def edit(model: onnx.ModelProto) -> onnx.NodeProto:
        node = node_of_module(model, module, op_type)
        for init in model.graph.initializer:
            if init.name == node.input[2]:
                shifted = numpy_helper.to_array(init) + np.float32(amount)
                init.CopyFrom(numpy_helper.from_array(shifted, init.name))
                return node
        raise LookupError(f"bias {node.input[2]} is not an initializer")

    return edit


def set_attribute(module: str, op_type: str, name: str, value: object):
    """Set attribute ``name`` of the ``op_type`` node of ``module`` to ``value``."""

    def edit(model: onnx.ModelProto) -> onnx.NodeProto:
        node = node_of_module(model, module, op_type)
        kept = [attr for attr in node.attribute if attr.name != name]
        del node.attribute[:]
        node.attribute.extend(kept + [onnx.helper.make_attribute(name, value)])
        return node

    return edit


def scale_initializer_input(node_name: str, index: int, factor: float):
    """Scale input ``index`` (an initializer) of node ``node_name`` by ``factor``.

    The node gets a private copy: exporters share constants between nodes (both GELUs
    of a model read one ``sqrt(2)``), and the edit must change this node only.
    """

    def edit(model: onnx.ModelProto) -> onnx.NodeProto:
        node = next(node for node in model.graph.node if node.name == node_name)
        original = next(init for init in model.graph.initializer
                        if init.name == node.input[index])
        array = numpy_helper.to_array(original)
        copy = numpy_helper.from_array((array * factor).astype(array.dtype),
                                       f"{original.name}_planted")
        model.graph.initializer.append(copy)
        node.input[index] = copy.name
        return node

    return edit


def scale_quantized_weight(node_name: str, factor: float):
    """Scale the dequantization scale of the weight QDQ node ``node_name`` reads."""

    def edit(model: onnx.ModelProto) -> onnx.NodeProto:
        node = next(node for node in model.graph.node if node.name == node_name)
        dequantize = next(other for other in model.graph.node if node.input[1] in other.output)
        scale_initializer_input(dequantize.name, 1, factor)(model)
        return node

    return edit


def quantize_qdq(source: Path, target: Path, x: np.ndarray) -> Path:
    """``source`` statically quantized to QDQ at ``target``, its one input ``x``
    calibrated on four standard normal draws of its shape and on ``x`` itself."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    name = onnx.load(str(source), load_external_data=False).graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.batches = iter([{name: rng.standard_normal(x.shape).astype(np.float32)}
                                 for _ in range(4)] + [{name: x}])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(str(source), str(target), Reader(), quant_format=QuantFormat.QDQ)
    return target


def fx_segment(model: onnx.ModelProto, fx_node: str) -> list[onnx.NodeProto]:
    """The nodes the dynamo exporter made from one FX node, in graph order."""
    return [node for node in model.graph.node
            if (meta := read_torch_metadata({p.key: p.value for p in node.metadata_props}))
            and meta.fx_node == fx_node]


def insert_mul(node_name: str, factor: float):
    """Insert ``Mul`` by ``factor`` after ``node_name``'s first output (no counterpart)."""

    def edit(model: onnx.ModelProto) -> onnx.NodeProto:
        index, node = next((index, node) for index, node in enumerate(model.graph.node)
                           if node.name == node_name)
        value, scaled = node.output[0], f"{node.output[0]}_inserted"
        for other in model.graph.node:
            other.input[:] = [scaled if name == value else name for name in other.input]
        for output in model.graph.output:
            if output.name == value:
                output.name = scaled
        model.graph.initializer.append(onnx.numpy_helper.from_array(
            np.asarray(factor, dtype=np.float32), f"{scaled}_factor"))
        inserted = onnx.helper.make_node("Mul", [value, f"{scaled}_factor"], [scaled],
                                         name="inserted_mul")
        model.graph.node.insert(index + 1, inserted)
        return inserted

    return edit


def export_torchscript_at_parity(model, x, folder: Path) -> tuple[Path, Path]:
    """``model`` exported by the TorchScript exporter (opset 17) to ``folder``, checked at
    parity; returns the clean file's path and the path a planted copy goes to."""
    import torch

    import bisect_onnx

    clean, planted = folder / "clean.onnx", folder / "planted.onnx"
    torch.onnx.export(model, (x,), str(clean), dynamo=False, opset_version=17)
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=clean)
    assert not report.diverged, report.summary()
    return clean, planted


def bisect_torchscript_with_scaled_weight(model, x, folder: Path, node: str, index: int):
    """The op-level report on ``model``'s TorchScript export (checked at parity) with
    input ``index`` of node ``node``, a weight, scaled by 1.05."""
    import bisect_onnx

    clean, planted = export_torchscript_at_parity(model, x, folder)
    plant(clean, planted, scale_initializer_input(node, index, 1.05))
    return bisect_onnx.bisect(model, x.numpy(), onnx_model=planted,
                              search=bisect_onnx.SearchOptions(granularity="op"))


def export_dynamo(model, x, folder: Path) -> Path:
    """``model`` exported by the dynamo exporter (opset 18) to ``folder``/model.onnx."""
    import torch

    path = folder / "model.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=True, opset_version=18)
    return path


def clean_at_module_level(model, x, path: Path):
    """The module-level report of a clean export, checked to have no failing row."""
    import bisect_onnx

    report = bisect_onnx.bisect(model, x, onnx_model=path,
                                search=bisect_onnx.SearchOptions(granularity="module"))
    assert not report.diverged and not any(row.failed for row in report.comparisons), (
        report.summary())
    return report


def inserted_after_first(model, x, folder: Path, op_type: str):
    """A Mul inserted after the first ``op_type`` node of ``model``'s TorchScript export,
    bisected against ``model``: the report and the inserted node's name."""
    import bisect_onnx

    clean, planted = export_torchscript_at_parity(model, x, folder)
    after = next(node.name for node in onnx.load(str(clean)).graph.node
                 if node.op_type == op_type)
    inserted, _ = plant(clean, planted, insert_mul(after, 1.5))
    return bisect_onnx.bisect(model, x.numpy(), onnx_model=planted), inserted


#: The past key's planted scale: a float32 cache's.
PAST_KEY_SCALE = np.float32(1.01)


def scale_past_key(graph: onnx.GraphProto, factor: np.generic = PAST_KEY_SCALE) -> None:
    """Scale layer 0's past key on its way in (by 1.01): nothing to scale at the prefill.

    ``factor``: in the cache's element type (``np.float16(1.5)`` for a float16 file).
    """
    for node in graph.node:
        node.input[:] = ["past_scaled" if n == "past_key_values.0.key" else n
                         for n in node.input]
    graph.initializer.append(numpy_helper.from_array(np.array(factor), "factor"))
    graph.node.insert(0, onnx.helper.make_node("Mul", ["past_key_values.0.key", "factor"],
                                               ["past_scaled"], name="planted_scale"))
