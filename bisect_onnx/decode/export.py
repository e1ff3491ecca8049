"""Export a decoder step with its cache flattened, under optimum's names and dynamic axes.

The dummy inputs hold a cache of 5 positions, a step of 3 tokens and a batch of 2, so
neither exporter specializes a dimension on 0 or 1 (torch.export does) and the step
exported serves the prefill (an empty cache) and the one-token decode steps alike.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bisect_onnx.errors import ModelError, UsageError, one_line
from bisect_onnx.pytorch.exporting import EXPORTERS, export_failure, quiet_exporter

if TYPE_CHECKING:
    import onnx
    import torch
    from torch.export import ExportedProgram

    from bisect_onnx.decode.flat_cache import DecoderStep

__all__ = ["export_decoder", "translated_program"]

logger = logging.getLogger(__name__)

_BATCH, _SEQUENCE, _PAST = 2, 3, 5


def export_decoder(step: DecoderStep, folder: Path, *, exporter: str = "dynamo",
                   opset: int | None = None) -> Path:
    """Export ``step.module`` into ``folder/decoder.onnx``; its path.

    Axes: ``batch`` and ``sequence`` of the tokens, ``past_sequence`` of the cache
    taken, ``total_sequence`` of the mask and of the cache returned.
    """
    import torch

    if exporter not in EXPORTERS:
        raise UsageError(f"exporter {exporter!r} is not one of {', '.join(EXPORTERS)}")
    if step.cache_tails is None:
        raise UsageError(f"the shape of {step.name}'s cache is unknown; pass "
                         "cache_shape=(layers, heads, head_dim) (--cache-shape L,H,D) or an "
                         "export of it (--onnx FILE)")
    layout = step.layout
    args = _dummy_inputs(step)
    path = folder / "decoder.onnx"
    axes = _axes(layout)
    logger.info("exporting %s's decode step with the %s exporter", step.name, exporter)
    try:
        with quiet_exporter(f"the {exporter} exporter", native=exporter == "torchscript"):
            if exporter == "torchscript":
                torch.onnx.export(step.module, args, str(path), dynamo=False,
                                  input_names=layout.input_names(),
                                  output_names=layout.output_names(), dynamic_axes=axes,
                                  opset_version=opset or 18)
            else:
                _dynamo_export(step, args, opset).save(str(path))
    except Exception as error:
        logger.debug("decoder export failed", exc_info=True)
        raise ModelError(export_failure(exporter, step.module, error)) from error
    if exporter == "dynamo":
        _name_axes(path, axes)
    return path


def translated_program(step: DecoderStep, path: Path) -> ExportedProgram | None:
    """The program the dynamo exporter translated ``step.module`` from into ``path``.

    ``None`` unless ``path`` is a dynamo export. Its values carry the FX node names of
    the program the exporter traced at :func:`export_decoder`'s sizes with dynamic
    shapes; a trace at a step's own sizes (a batch of one, one token) specializes them
    and names its nodes otherwise, and the step's bisection would compare the file at
    module level only. Exported again as :func:`export_decoder` exports, not optimized
    (only the program is kept); ``None`` where that fails. Whether the program names
    the file's values, the bisection checks.
    """
    from bisect_onnx.graph.nodes import read_nodes
    from bisect_onnx.graph.scopes import detect_exporter
    from bisect_onnx.graph.skeleton import load_skeleton

    if step.cache_tails is None or detect_exporter(read_nodes(load_skeleton(path).graph)) != (
            "dynamo"):
        return None
    logger.info("tracing %s's decode step as the dynamo exporter does, for op level",
                step.name)
    try:
        with quiet_exporter("the dynamo exporter"):
            return _dynamo_export(step, _dummy_inputs(step), None, optimize=False
                                  ).exported_program
    except Exception as error:  # the step's bisection compares at module level
        logger.info("no program for op level: %s", one_line(error))
        return None


def _dynamo_export(step: DecoderStep, args: tuple[torch.Tensor, ...], opset: int | None, *,
                   optimize: bool = True) -> torch.onnx.ONNXProgram:
    import torch

    layout = step.layout
    return torch.onnx.export(step.module, args, dynamo=True, opset_version=opset,
                             input_names=layout.input_names(),
                             output_names=layout.output_names(),
                             dynamic_shapes=_dynamic_shapes(step.module, args),
                             optimize=optimize, verbose=False)


def _dummy_inputs(step: DecoderStep) -> tuple[torch.Tensor, ...]:
    import torch

    from bisect_onnx.decode.flat_cache import float_type

    generator = torch.Generator().manual_seed(0)
    layout = step.layout
    vocab = step.vocab_size or 2
    tokens = torch.randint(0, vocab, (_BATCH, _SEQUENCE), generator=generator)
    mask = torch.ones((_BATCH, _PAST + _SEQUENCE), dtype=torch.long)
    head = [tokens, mask]
    if layout.positions:
        head.append(torch.arange(_PAST, _PAST + _SEQUENCE).expand(_BATCH, _SEQUENCE).clone())
    dtype = float_type(step.module) or torch.float32
    past = [torch.randn((_BATCH, tail[0], _PAST, *tail[1:]), generator=generator).to(dtype)
            for pair in step.cache_tails or () for tail in pair]
    return (*head, *past)


def _axes(layout: Any) -> dict[str, dict[int, str]]:
    """The TorchScript exporter's ``dynamic_axes``, and the names of the dynamo export's."""
    axes = {layout.tokens: {0: "batch", 1: "sequence"},
            layout.mask: {0: "batch", 1: "total_sequence"},
            layout.logits: {0: "batch", 1: "sequence"}}
    if layout.positions:
        axes[layout.positions] = {0: "batch", 1: "sequence"}
    for key, value in layout.past:
        axes[key] = axes[value] = {0: "batch", 2: "past_sequence"}
    for key, value in layout.present:
        axes[key] = axes[value] = {0: "batch", 2: "total_sequence"}
    return axes


def _dynamic_shapes(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    """torch.export's dynamic shapes for ``forward``'s parameters (``*past`` a tuple).

    ``Dim.DYNAMIC`` everywhere: torch.export works out that the mask is as long as
    the cache and the step together, which a named ``Dim`` would have to spell.
    """
    from torch.export import Dim

    def spec(tensor: torch.Tensor) -> dict[int, Any]:
        # Tokens, mask and positions: batch and length; a cache entry: batch and length.
        return {0: Dim.DYNAMIC, (1 if tensor.dim() == 2 else 2): Dim.DYNAMIC}

    shapes: dict[str, Any] = {}
    rest = list(args)
    for parameter in inspect.signature(module.forward).parameters.values():
        if parameter.kind is parameter.VAR_POSITIONAL:
            shapes[parameter.name] = tuple(spec(tensor) for tensor in rest)
            rest = []
        elif rest:
            shapes[parameter.name] = spec(rest.pop(0))
    return shapes


def _name_axes(path: Path, axes: dict[str, dict[int, str]]) -> None:
    """Rename the dynamo export's symbols (``s43``) after the axes they stand for."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    renames: dict[str, str] = {}
    for value in list(model.graph.input) + list(model.graph.output):
        for index, name in axes.get(value.name, {}).items():
            dims = value.type.tensor_type.shape.dim
            if index < len(dims) and dims[index].dim_param:
                renames.setdefault(dims[index].dim_param, name)
    values: list[onnx.ValueInfoProto] = [*model.graph.input, *model.graph.output,
                                         *model.graph.value_info]
    for value in values:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in renames:
                dim.dim_param = renames[dim.dim_param]
    onnx.save(model, str(path))
