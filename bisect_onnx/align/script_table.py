"""Which ONNX node holds each traced ATen op's value in a TorchScript export, by hand.

The fallback of :mod:`bisect_onnx.align.script_ends`, which reads it from the
exporter's own record of each op: used where the exporter cannot be asked (its
private API gone) or refuses an op alone. For an op with one output, the node types
its translation ends in; for an op with several (``topk``'s values and indices), the
node and output that hold each one; the ops that make no node at all; and the ops
whose translation goes past the node the table names, which are declined rather than
paired with a value that is not theirs. The Transpose and layout rules hold for both:
they are about the exporter's passes after the translation (merged transposes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bisect_onnx.pytorch.script_ops import ScriptOp

if TYPE_CHECKING:
    import onnx

__all__ = ["End", "END_OF", "LAYOUT", "OutputEnd", "TUPLE_END_OF", "PASS_THROUGH", "declined",
           "identity_by_constant", "passes_through", "permutation", "same_permutation"]


@dataclass(frozen=True)
class End:
    """The ONNX node an op's translation ends in."""

    types: frozenset[str]
    then: frozenset[str] = frozenset()
    """A node of these types right after it, reading it and otherwise only constants,
    ends the translation instead (the bias ``Add`` after a ``MatMul``)."""
    reads: str | None = None
    """The node must read the output of a node of this type (SDPA's last MatMul reads
    the Softmax)."""


def _ends(types: str, then: str = "", reads: str | None = None) -> End:
    return End(frozenset(types.split()), frozenset(then.split()), reads)


_ELEMENTWISE = {name: _ends(op) for name, op in (
    ("add", "Add"), ("sub", "Sub"), ("mul", "Mul"), ("div", "Div"), ("neg", "Neg"),
    ("exp", "Exp"), ("log", "Log"), ("sqrt", "Sqrt"), ("rsqrt", "Reciprocal"), ("pow", "Pow"),
    ("erf", "Erf"), ("abs", "Abs"), ("relu", "Relu"), ("sigmoid", "Sigmoid"), ("tanh", "Tanh"),
    ("leaky_relu", "LeakyRelu"), ("elu", "Elu"), ("hardtanh", "Clip"),
    ("softmax", "Softmax"), ("log_softmax", "LogSoftmax"), ("where", "Where"),
    ("cumsum", "CumSum"), ("floor", "Floor"), ("ceil", "Ceil"), ("round", "Round"),
    ("sign", "Sign"), ("sin", "Sin"), ("cos", "Cos"), ("tan", "Tan"), ("asin", "Asin"),
    ("acos", "Acos"), ("atan", "Atan"), ("reciprocal", "Reciprocal"),
    ("hardswish", "HardSwish"), ("hardsigmoid", "HardSigmoid"), ("selu", "Selu"),
    ("celu", "Celu"), ("relu6", "Clip"), ("clamp_min", "Clip Max"),
    ("clamp_max", "Clip Min"),
    ("maximum", "Max"), ("minimum", "Min"), ("fmod", "Mod"), ("square", "Mul"),
    ("rsub", "Sub"), ("log_sigmoid", "Log"), ("masked_fill", "Where"), ("isnan", "IsNaN"),
    ("gt", "Greater"), ("lt", "Less"), ("ge", "GreaterOrEqual"), ("le", "LessOrEqual"),
    ("eq", "Equal"), ("ne", "Not"),  # Equal, then Not
    ("logical_not", "Not"), ("bitwise_not", "Not BitwiseNot"), ("logical_and", "And"),
    ("__and__", "And BitwiseAnd"), ("logical_or", "Or"), ("__or__", "Or BitwiseOr"),
    ("logical_xor", "Xor"), ("__xor__", "Xor BitwiseXor"), ("tril", "Trilu"),
    ("triu", "Trilu"),
)}

#: ATen op (without ``aten::``) -> the node its value is held by.
END_OF = {
    **_ELEMENTWISE,
    # Bounds that are tensors are a Max, then a Min; softplus with a beta divides by it.
    "clamp": _ends("Clip Max Min", then="Min"), "softplus": _ends("Softplus", then="Div"),
    "linear": _ends("MatMul Gemm", then="Add"),
    "matmul": _ends("MatMul"), "bmm": _ends("MatMul"), "mm": _ends("MatMul Gemm"),
    "addmm": _ends("Gemm"),
    "_convolution": _ends("Conv"), "conv1d": _ends("Conv"), "conv2d": _ends("Conv"),
    "conv3d": _ends("Conv"),
    "batch_norm": _ends("BatchNormalization"), "layer_norm": _ends("LayerNormalization"),
    "group_norm": _ends("Add"),  # Reshape, InstanceNormalization, Reshape, Mul, Add
    "gelu": _ends("Mul", then="Mul"), "silu": _ends("Mul"),
    "scaled_dot_product_attention": _ends("MatMul", reads="Softmax"),
    "view": _ends("Reshape"), "reshape": _ends("Reshape"), "unflatten": _ends("Reshape"),
    "flatten": _ends("Flatten Reshape"), "transpose": _ends("Transpose"),
    "permute": _ends("Transpose"), "t": _ends("Transpose"), "unsqueeze": _ends("Unsqueeze"),
    "squeeze": _ends("Squeeze"), "select": _ends("Gather"), "embedding": _ends("Gather"),
    "cat": _ends("Concat"), "max_pool2d": _ends("MaxPool"), "avg_pool2d": _ends("AveragePool"),
    "adaptive_avg_pool2d": _ends("GlobalAveragePool AveragePool"),
    "upsample_bilinear2d": _ends("Resize"), "upsample_nearest2d": _ends("Resize"),
    "mean": _ends("ReduceMean"), "sum": _ends("ReduceSum"),
    "amax": _ends("ReduceMax"), "amin": _ends("ReduceMin"), "prod": _ends("ReduceProd"),
    "max": _ends("ReduceMax Max"), "min": _ends("ReduceMin Min"),  # of all, or of two
    "argmax": _ends("ArgMax"), "argmin": _ends("ArgMin"),
    "logsumexp": _ends("ReduceLogSumExp"), "linalg_vector_norm": _ends("ReduceL2 ReduceL1"),
    "einsum": _ends("Einsum"), "instance_norm": _ends("InstanceNormalization"),
    "pixel_shuffle": _ends("DepthToSpace"), "gather": _ends("GatherElements"),
    "index_select": _ends("Gather"), "narrow": _ends("Slice"), "slice": _ends("Slice"),
    "stack": _ends("Concat"), "repeat": _ends("Tile"), "addcmul": _ends("Add"),
    # Softplus, Tanh, Mul; Split, Sigmoid, Mul.
    "mish": _ends("Mul", reads="Tanh"), "glu": _ends("Mul", reads="Sigmoid"),
    # A cast is one Cast (none where the dtype does not change: then nothing is paired);
    # an integer remainder is one Mod, a floating one ends in the Sub of x - floor(x/y)*y.
    "to": _ends("Cast"), "remainder": _ends("Mod Sub"),
    # Every padding but a circular one is one Pad (its pads computed from constants).
    **{name: _ends("Pad") for name in (
        "pad", "constant_pad_nd", "reflection_pad1d", "reflection_pad2d", "reflection_pad3d",
        "replication_pad1d", "replication_pad2d", "replication_pad3d")},
}


@dataclass(frozen=True)
class OutputEnd:
    """The node that holds one output of a tuple-valued op, and which of its outputs."""

    type: str
    output: int
    occurrence: int = 0
    """How many nodes of :attr:`type` the op's translation makes before this one: a
    two-layer ``lstm`` makes an LSTM and a Squeeze per layer, its value the last."""


#: Tuple-valued ATen op -> for each of its outputs, the node and output holding it.
#: Outputs whose node type is the same are one node's (TopK's values and indices).
TUPLE_END_OF = {
    "topk": (OutputEnd("TopK", 0), OutputEnd("TopK", 1)),
    "sort": (OutputEnd("TopK", 0), OutputEnd("TopK", 1)),  # a TopK of every element
    "max": (OutputEnd("ReduceMax", 0), OutputEnd("ArgMax", 0)),  # max(x, dim)
    "min": (OutputEnd("ReduceMin", 0), OutputEnd("ArgMin", 0)),
}

#: Ops that only move or view data: the exporter may merge one into a node of the next
#: op (two transposes into one Transpose), which leaves it with no value of its own.
LAYOUT = frozenset({"transpose", "permute", "t", "view", "reshape", "unsqueeze", "squeeze",
                    "flatten", "unflatten", "expand", "expand_as"})

#: The end a traced ``x[1:]`` slices to (``sys.maxsize``).
_INT64_MAX = 2**63 - 1

#: Ops that hand their input back in an eval-mode export: no node of their own.
PASS_THROUGH = frozenset({"dropout", "feature_dropout", "contiguous", "clone", "alias"})


def passes_through(op: ScriptOp) -> bool:
    """Whether ``op`` hands back its input unchanged, and the exporter made no node for it.

    Besides :data:`PASS_THROUGH`, a slice from 0 to the end in steps of 1: ``x[:, 1:]`` is
    traced as such a slice of dim 0, then one of dim 1, and exported as one Slice. A
    slice that keeps every element by its bounds (``y[:, :8]`` of 8) is a Slice node.
    """
    short = op.kind.split("::", 1)[-1]
    if short in PASS_THROUGH:
        return True
    literals = [argument.value for argument in op.arguments or ()
                if argument.source == "constant"]
    return (short == "slice" and len(literals) == 4 and literals[1] == 0
            and literals[2] is not None and literals[2] >= _INT64_MAX and literals[3] == 1)


def identity_by_constant(op: ScriptOp) -> bool:
    """Whether ``op`` is ``x + 0``, ``x - 0``, ``x * 1`` or ``x / 1`` of one data value.

    TorchScript's peephole pass removes such an op from the whole model's graph, though
    the exporter's record of the op alone has its node: FocalNet's ``ctx_all = 0`` then
    ``ctx_all = ctx_all + ...`` has no node for its first sum, DeBERTa's ``score += ...``
    after ``score = 0`` keeps it.
    """
    short, arguments = op.kind.split("::", 1)[-1], op.arguments or ()
    values = [argument for argument in arguments if argument.source == "value"]
    literals = [argument.value for argument in arguments if argument.source == "constant"]
    if len(values) != 1 or arguments[0].source != "value" or not literals or not all(
            isinstance(literal, int | float) and not isinstance(literal, bool)
            for literal in literals):  # a constant may be a tensor (LeViT's attention bias)
        return False
    if short in ("add", "sub"):
        return literals[0] == 0 and literals[1:] in ([], [1])
    return short in ("mul", "div") and literals == [1]


def same_permutation(op: ScriptOp, node: onnx.NodeProto, rank: int) -> bool:
    """Whether a Transpose ``node`` (an ``onnx.NodeProto``) permutes as ``op`` does.

    The exporter merges consecutive transposes (``k.transpose(1, 2)`` then
    ``.transpose(-2, -1)`` become one node); with a square shape, the merged node
    would pass for either op by shape alone.
    """
    wanted = permutation(op, rank)
    perm = next((list(attribute.ints) for attribute in node.attribute
                 if attribute.name == "perm"), list(reversed(range(rank))))
    return wanted is not None and perm == wanted


def declined(op: ScriptOp, *, recorded: bool = False) -> str | None:
    """Why ``op`` is not paired with the node the table names for it, or ``None``.

    A ``div`` with a rounding mode (``floor``, ``trunc``) goes on past its Div node (a
    floor division of integers ends in a ``Where`` choosing the truncated quotient or
    one less), a tanh-approximated ``gelu`` has another decomposition than the exact
    one, and a circular padding is Slices and a Concat, not a Pad: the node's value is
    not the op's. The overload says whether a ``div`` has a rounding mode, whatever its
    arguments; where it is unknown, a quotient whose arguments are unknown is declined.

    ``recorded``: the exporter's record of the op says where it ends (a tanh ``gelu``
    at its last Mul, a rounded ``div`` at its Floor, Where or Cast, a circular ``pad``
    at its Concat): these rules are the table's alone, for an op without a record.
    """
    literals = [argument.value for argument in op.arguments or ()
                if argument.source == "constant" and isinstance(argument.value, str)]
    rounded = (op.overload.endswith("_mode") if op.overload
               else op.arguments is None or bool(literals))
    if recorded:
        return None
    if op.kind == "aten::div" and (literals or rounded):
        return (f"{op.kind} with a rounding mode ends in a Where or Floor after its Div, "
                "which the alignment does not pair (not guessed)")
    if op.kind == "aten::gelu" and (op.arguments is None or "tanh" in literals):
        return (f"{op.kind} with approximate='tanh' (or an approximation not known) is six "
                "Muls around a Tanh, not the exact form's Div, Erf, Add, Mul, Mul, which the "
                "alignment does not pair (not guessed)")
    if op.kind == "aten::pad" and (op.arguments is None or "circular" in literals):
        return (f"{op.kind} in circular mode (or a mode not known) is made of Slices and a "
                "Concat, not one Pad, which the alignment does not pair (not guessed)")
    return None


def permutation(op: ScriptOp, rank: int) -> list[int] | None:
    """The axes order ``aten::transpose``, ``permute`` or ``t`` makes; ``None`` if unknown."""
    literals = [argument.value for argument in op.arguments or ()
                if argument.source == "constant"]
    order = list(range(rank))
    if op.kind == "aten::t":
        return order[::-1]
    if op.kind == "aten::transpose" and len(literals) == 2:
        first, second = (axis % rank for axis in literals)
        order[first], order[second] = order[second], order[first]
        return order
    if op.kind == "aten::permute" and literals and isinstance(literals[0], list):
        return [axis % rank for axis in literals[0]]
    return None
