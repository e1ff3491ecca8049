"""The exporter's translation of one op, read from the file's metadata and evaluated eagerly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bisect_onnx.search.translation_eval import (
    CannotEvaluate,
    evaluate_translation,
    parse_op_call,
)

LINEAR = ("%linear_54 : [num_users=1] = call_function[target=torch.ops.aten.linear.default]"
          "(args = (%layer_norm_18, %p_layers_9_attention_q_weight, %p_layers_9_attention_q_bias)"
          ", kwargs = {})")
BATCH_NORM = ("%bn_3 : [num_users=1] = call_function[target=torch.ops.aten."
              "_native_batch_norm_legit_no_training.default](args = (%conv2d_39, %p_w, %p_b, "
              "%b_mean, %b_var, 0.1, 1e-05), kwargs = {})")


def test_the_op_and_its_arguments_are_read_from_the_fx_node_text():
    call = parse_op_call(LINEAR)
    assert call.target == "aten.linear.default"
    assert call.references() == ["layer_norm_18", "p_layers_9_attention_q_weight",
                                 "p_layers_9_attention_q_bias"]
    literals = parse_op_call(BATCH_NORM)
    assert literals.args[-2:] == (0.1, 1e-05)
    assert literals.references() == ["conv2d_39", "p_w", "p_b", "b_mean", "b_var"]


def test_an_argument_that_is_not_a_literal_cannot_be_evaluated():
    text = ("%to : [num_users=1] = call_function[target=torch.ops.aten._to_copy.default]"
            "(args = (%x,), kwargs = {dtype: torch.float16})")
    with pytest.raises(CannotEvaluate, match="not a literal"):
        parse_op_call(text)
    with pytest.raises(CannotEvaluate, match="which op call"):
        parse_op_call("%x : [num_users=1] = placeholder[target=x]")


def test_a_linear_is_translated_to_its_nodes_with_their_values_and_data_flow():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    weight = rng.standard_normal((6, 8)).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    call = parse_op_call(LINEAR)
    translation = evaluate_translation(call, {
        "layer_norm_18": x, "p_layers_9_attention_q_weight": weight,
        "p_layers_9_attention_q_bias": bias})
    nodes, values = translation.nodes, translation.values
    assert [node.op_type for node in nodes] == ["Transpose", "MatMul", "Add"]
    transpose, matmul, add = nodes
    # Each node reads what the one before it made, and the op's arguments by their names.
    assert transpose.input == ["p_layers_9_attention_q_weight"]
    assert matmul.input == ["layer_norm_18", transpose.output[0]]
    assert add.input == [matmul.output[0], "p_layers_9_attention_q_bias"]
    expected = torch.nn.functional.linear(*map(torch.from_numpy, (x, weight, bias))).numpy()
    np.testing.assert_allclose(values[add.output[0]], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(values[matmul.output[0]], x @ weight.T, rtol=1e-5, atol=1e-5)


def test_a_missing_value_cannot_be_evaluated():
    with pytest.raises(CannotEvaluate, match="no value of p_layers_9_attention_q_weight"):
        evaluate_translation(parse_op_call(LINEAR), {"layer_norm_18": np.zeros((1, 8))})
