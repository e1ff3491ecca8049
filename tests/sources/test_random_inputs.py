"""Random inputs from the ONNX input specification: shapes, ranges, determinism, --dim."""

from __future__ import annotations

import io

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from bisect_onnx.errors import InputError, UsageError
from bisect_onnx.runtime.input_specs import InputSpec
from bisect_onnx.sources.random_inputs import (
    DEFAULT_INT_HIGH,
    parse_dim_options,
    synthesize_inputs,
    vocabulary_limits,
)
from tests.torch_warnings import DYNAMO_LEAFSPEC_DEPRECATED, LEGACY_EXPORTER_DEPRECATED


def spec(name: str, dtype: str, shape) -> InputSpec:
    return InputSpec(name, np.dtype(dtype), None if shape is None else tuple(shape))


MIXED = [
    spec("pixels", "float32", [2, 3, 4]),
    spec("half", "float16", [5]),
    spec("scalar", "float64", []),
    spec("input_ids", "int64", [2, "seq"]),
    spec("flags", "bool", [3]),
    spec("bytes", "uint8", [4]),
]


def one_line_error(kind, call) -> str:
    with pytest.raises(kind) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_shapes_and_dtypes_follow_the_specs():
    arrays = synthesize_inputs(MIXED, dims={"seq": 7})
    assert [a.shape for a in arrays] == [(2, 3, 4), (5,), (), (2, 7), (3,), (4,)]
    assert [a.dtype for a in arrays] == [s.dtype for s in MIXED]


def test_samples_are_reproducible_and_differ_from_each_other():
    def draw(**kwargs):
        return synthesize_inputs(MIXED, dims={"seq": 64}, **kwargs)

    for first, again in zip(draw(seed=3, sample=2), draw(seed=3, sample=2), strict=True):
        np.testing.assert_array_equal(first, again)
    for other in (draw(seed=3, sample=1), draw(seed=4, sample=2)):
        assert not np.array_equal(draw(seed=3, sample=2)[0], other[0])
        assert not np.array_equal(draw(seed=3, sample=2)[3], other[3])


def test_floats_are_standard_normal():
    (array,) = synthesize_inputs([spec("x", "float32", [100_000])])
    assert abs(array.mean()) < 0.02 and abs(array.std() - 1) < 0.02


def test_integer_ranges_follow_int_high_then_defaults_by_name():
    specs = [spec(name, "int64", [10_000]) for name in
             ("input_ids", "attention_mask", "token_type_ids", "labels")]
    ids, mask, segments, labels = synthesize_inputs(specs, int_high={"labels": 7})
    assert ids.min() >= 0 and ids.max() == DEFAULT_INT_HIGH - 1
    assert set(np.unique(mask)) == {0, 1} and set(np.unique(segments)) == {0, 1}
    assert set(np.unique(labels)) == set(range(7))
    (small,) = synthesize_inputs([spec("ids", "int8", [10_000])], int_high={"ids": 1000})
    assert small.max() == 127  # the bound is clamped to what the dtype holds


def test_dims_fill_named_free_dimensions():
    specs = [spec("a", "float32", ["batch", 3]), spec("b", "int32", ["batch", "seq"])]
    a, b = synthesize_inputs(specs, dims={"batch": 2, "seq": 5})
    assert a.shape == (2, 3) and b.shape == (2, 5)


def test_a_missing_dim_names_the_input_axis_and_the_option():
    specs = [spec("input_ids", "int64", ["batch", "seq"])]
    message = one_line_error(InputError, lambda: synthesize_inputs(specs, dims={"batch": 1}))
    assert "'input_ids'" in message and "axis 1" in message and "--dim seq=VALUE" in message
    message = one_line_error(InputError, lambda: synthesize_inputs(specs))
    assert "--dim batch=VALUE" in message and "also unset: seq" in message


@pytest.mark.parametrize(("shape", "expected"), [
    ([2, None], "axis 1 is a free dimension without a name"),
    (None, "has no shape"),
])
def test_unsettable_shapes_ask_for_real_inputs(shape, expected):
    message = one_line_error(InputError, lambda: synthesize_inputs([spec("x", "float32", shape)]))
    assert expected in message and "'x'" in message and "--input" in message


def test_unsupported_dtypes_ask_for_real_inputs():
    message = one_line_error(InputError,
                             lambda: synthesize_inputs([spec("text", "object", [1])]))
    assert "'text'" in message and "--input" in message


def test_a_dim_that_names_no_free_dimension_is_a_usage_error():
    specs = [spec("x", "float32", ["batch", 3])]
    message = one_line_error(UsageError,
                             lambda: synthesize_inputs(specs, dims={"batch": 1, "btach": 2}))
    assert "btach" in message and "free dimensions are: batch" in message


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"seed": -1}, "seed is -1"),
    ({"sample": -2}, "sample is -2"),
    ({"dims": {"batch": 0}}, "batch=0"),
    ({"int_high": {"x": 0}}, "input 'x' is 0"),
])
def test_bad_values_are_usage_errors(kwargs, named):
    specs = [spec("x", "int64", ["batch"])]
    kwargs = {"dims": {"batch": 1}, **kwargs}
    message = one_line_error(UsageError, lambda: synthesize_inputs(specs, **kwargs))
    assert named in message
    assert "positive integer" in message or "non-negative integer" in message


def test_parse_dim_options():
    assert parse_dim_options([]) == {}
    assert parse_dim_options(["batch=2", " seq = 16 ", "batch=2"]) == {"batch": 2, "seq": 16}
    assert parse_dim_options(["input_ids_dynamic_axes_1=8"]) == {"input_ids_dynamic_axes_1": 8}


@pytest.mark.parametrize(("items", "expected"), [
    (["batch"], "not NAME=VALUE"),
    (["=2"], "not NAME=VALUE"),
    (["batch=0"], "positive integer"),
    (["batch=-3"], "positive integer"),
    (["batch=two"], "positive integer"),
    (["batch="], "positive integer"),
    (["batch=2", "batch=3"], "given twice"),
])
def test_parse_dim_options_refuses_bad_syntax(items, expected):
    assert expected in one_line_error(UsageError, lambda: parse_dim_options(items))


def _graph_model(nodes, inputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs,
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
                              initializer=initializers)
    return helper.make_model(graph)


def _table(name: str, *dims: int):
    return helper.make_tensor(name, TensorProto.FLOAT, dims, np.zeros(dims).ravel().tolist())


def test_vocabulary_limits_follow_index_preserving_ops_and_take_the_smallest_table():
    ids = helper.make_tensor_value_info("ids", TensorProto.INT32, [1, 4])
    rows = helper.make_tensor_value_info("rows", TensorProto.INT64, [3])
    features = helper.make_tensor_value_info("features", TensorProto.FLOAT, [3])
    model = _graph_model(
        [
            helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64),
            helper.make_node("Unsqueeze", ["ids64", "axes"], ["ids3d"]),
            helper.make_node("Gather", ["big", "ids3d"], ["e1"]),
            helper.make_node("Gather", ["small", "ids"], ["e2"], axis=-1),
            helper.make_node("Gather", ["features", "rows"], ["e3"]),  # data not a table
            helper.make_node("Constant", [], ["const"], value=_table("c", 9, 2)),
            helper.make_node("Gather", ["const", "rows"], ["out"]),
        ],
        [ids, rows, features],
        [_table("big", 50, 2), _table("small", 2, 30),
         helper.make_tensor("axes", TensorProto.INT64, [1], [0])],
    )
    assert vocabulary_limits(model) == {"ids": 30, "rows": 9}


def test_vocabulary_limits_ignore_data_inputs_and_float_inputs():
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [4])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    model = _graph_model(
        [helper.make_node("Gather", ["table", "x"], ["a"]),
         helper.make_node("Gather", ["ids", "index"], ["out"])],
        [ids, x],
        [_table("table", 5, 2), helper.make_tensor("index", TensorProto.INT64, [1], [0])],
    )
    assert vocabulary_limits(model) == {}


class Embedder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(50, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(ids)


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
@DYNAMO_LEAFSPEC_DEPRECATED
@LEGACY_EXPORTER_DEPRECATED
def test_vocabulary_limits_on_a_real_embedding_export(dynamo):
    model = Embedder().eval()
    ids = torch.zeros(2, 5, dtype=torch.int64)
    if dynamo:
        proto = torch.onnx.export(model, (ids,), dynamo=True, verbose=False).model_proto
    else:
        buffer = io.BytesIO()
        torch.onnx.export(model, (ids,), buffer, dynamo=False, verbose=False,
                          input_names=["ids"])
        proto = onnx.load_from_string(buffer.getvalue())
    assert vocabulary_limits(proto) == {"ids": 50}

    # With the limit, random token ids run in ONNX Runtime and match PyTorch.
    specs = [spec("ids", "int64", [2, 5])]
    (tokens,) = synthesize_inputs(specs, int_high=vocabulary_limits(proto))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"ids": tokens})
    np.testing.assert_allclose(got, model(torch.from_numpy(tokens)).detach().numpy())


def test_masks_are_a_padded_batchs_ones_then_zeros():
    specs = [spec("attention_mask", "int64", [64, 16]), spec("pad_mask", "bool", [64, 16])]
    for mask in synthesize_inputs(specs):
        rows = mask.astype(np.int64)
        assert (rows[:, 0] == 1).all()  # no query sees nothing: at least one key is kept
        assert (np.diff(rows, axis=1) <= 0).all()  # ones, then zeros
        assert len(set(rows.sum(axis=1))) > 1  # lengths vary
    (segments,) = synthesize_inputs([spec("token_type_ids", "int64", [64, 16])])
    assert (segments[:, 0] == 0).any()  # segment ids stay coin flips
