"""The parameters of one QuantizeLinear/DequantizeLinear pair, and what they do to a value.

A candidate quantized by ONNX Runtime's QDQ tooling holds a pair after each float
tensor; :mod:`bisect_onnx.align.onnx_pairs` reads them to pair and compare its values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Quantization", "Conversion"]


@dataclass(frozen=True)
class Quantization:
    """The parameters of a QuantizeLinear/DequantizeLinear pair."""

    scale: np.ndarray
    zero_point: np.ndarray | None
    axis: int = 1

    @property
    def step(self) -> float:
        """The scale as one number (the largest, for per-channel scales)."""
        return float(np.max(np.abs(self.scale.astype(np.float64))))

    def dequantize(self, quantized: np.ndarray) -> np.ndarray:
        """What DequantizeLinear computes: ``(q - zero_point) * scale`` in float32."""
        scale = self.scale.astype(np.float32)
        zero = (self.zero_point if self.zero_point is not None
                else np.zeros_like(self.scale)).astype(np.float32)
        if scale.ndim == 1 and quantized.ndim > 1:  # per axis
            shape = [1] * quantized.ndim
            shape[self.axis % quantized.ndim] = scale.size
            scale, zero = scale.reshape(shape), zero.reshape(shape)
        return ((quantized.astype(np.float32) - zero) * scale).astype(np.float32)

    def round_trip(self, value: np.ndarray) -> np.ndarray:
        """What QuantizeLinear then DequantizeLinear make of a float tensor.

        Rounding half to even and saturating to the zero point's integer type, as the
        ONNX specification says (uint8 when the pair has no zero point).
        """
        integer = np.dtype(self.zero_point.dtype if self.zero_point is not None else np.uint8)
        limits = np.iinfo(integer)
        scale = self.scale.astype(np.float32)
        zero = (self.zero_point if self.zero_point is not None
                else np.zeros_like(self.scale)).astype(np.float32)
        if scale.ndim == 1 and value.ndim > 1:
            shape = [1] * value.ndim
            shape[self.axis % value.ndim] = scale.size
            scale, zero = scale.reshape(shape), zero.reshape(shape)
        quantized = np.clip(np.rint(value.astype(np.float32) / scale) + zero, limits.min,
                            limits.max)
        return self.dequantize(quantized.astype(integer))


@dataclass(frozen=True)
class Conversion:
    """How a reference value recorded under a candidate value's name is compared with it.

    A QDQ candidate's value the in-process comparison judged only once converted: its
    QuantizeLinear's integers dequantized, or a float put through its QDQ pair. A
    check pairs by name, so the recording says how, and whose pair converts it.
    """

    how: str
    """``dequantized`` or ``requantized`` (:class:`~bisect_onnx.align.onnx_pairs.ValuePair`)."""
    quantized_as: str
    """The value whose Q/DQ pair's parameters convert it (the pair's ``quantization``)."""
