"""Unit tests for bisect_onnx.graph.provenance: reading the torch exporter's node metadata."""

from __future__ import annotations

import pytest

from bisect_onnx.graph.provenance import (
    CLASS_HIERARCHY_KEY,
    NAME_SCOPES_KEY,
    STACK_TRACE_KEY,
    SourceLocation,
    read_torch_metadata,
    user_source,
)

SITE = "/venv/lib/python3.11/site-packages"

# The shape of a real dynamo-exporter stack trace: outermost frame first.
LINEAR_TRACE = (
    'File "/home/me/project/model.py", line 355, in forward\n'
    "    x = self.block(x)\n"
    '  File "/home/me/project/blocks.py", line 338, in forward\n'
    "    return self.tanh(self.linear(x))\n"
    f'  File "{SITE}/torch/nn/modules/linear.py", line 134, in forward\n'
    "    return F.linear(input, self.weight, self.bias)"
)


def test_no_name_scopes_means_no_metadata():
    assert read_torch_metadata({}) is None
    assert read_torch_metadata({"namespace": "x", STACK_TRACE_KEY: LINEAR_TRACE}) is None


def test_name_scopes_last_element_is_the_fx_node_and_the_rest_are_scopes():
    meta = read_torch_metadata({
        NAME_SCOPES_KEY: "['', 'block', 'block.linear', 'linear_1']",
        CLASS_HIERARCHY_KEY: "['Net', 'Block', 'torch.nn.modules.linear.Linear', "
                             "'aten.linear.default']",
        STACK_TRACE_KEY: LINEAR_TRACE,
    })
    assert meta is not None
    assert meta.scopes == ("", "block", "block.linear")
    assert meta.fx_node == "linear_1"
    assert meta.torch_op == "aten.linear.default"
    assert meta.source == SourceLocation("/home/me/project/blocks.py", 338)


def test_top_level_op_has_only_the_model_scope():
    meta = read_torch_metadata({NAME_SCOPES_KEY: "['', 'add']"})
    assert meta.scopes == ("",)
    assert meta.fx_node == "add"


def test_class_hierarchy_without_an_aten_op_gives_no_torch_op():
    meta = read_torch_metadata({
        NAME_SCOPES_KEY: "['', 'fc', 'linear']",
        CLASS_HIERARCHY_KEY: "['Net', 'torch.nn.modules.linear.Linear']",
    })
    assert meta.torch_op is None


def test_missing_stack_trace_gives_no_source():
    meta = read_torch_metadata({NAME_SCOPES_KEY: "['', 'relu']"})
    assert meta.source is None


def test_innermost_user_frame_is_chosen_over_torch_and_site_packages_frames():
    trace = (
        'File "/home/me/train.py", line 10, in main\n'
        '  File "/home/me/model.py", line 42, in forward\n'
        f'  File "{SITE}/timm/layers/mlp.py", line 7, in forward\n'
        f'  File "{SITE}/torch/nn/modules/activation.py", line 143, in forward\n'
    )
    assert user_source(trace) == SourceLocation("/home/me/model.py", 42)


def test_frozen_and_dist_packages_frames_are_not_user_code():
    trace = (
        'File "/home/me/model.py", line 5, in forward\n'
        '  File "/usr/lib/python3/dist-packages/einops/einops.py", line 9, in rearrange\n'
        '  File "<frozen importlib._bootstrap>", line 1, in _call\n'
    )
    assert user_source(trace) == SourceLocation("/home/me/model.py", 5)


def test_windows_site_packages_and_torch_frames_are_skipped():
    trace = (
        'File "C:\\Users\\me\\model.py", line 12, in forward\n'
        '  File "C:\\Python311\\Lib\\site-packages\\torch\\nn\\modules\\conv.py", line 3, in f\n'
    )
    assert user_source(trace) == SourceLocation("C:\\Users\\me\\model.py", 12)


def test_only_library_frames_fall_back_to_the_innermost_non_torch_frame():
    trace = (
        f'File "{SITE}/transformers/models/bert/modeling_bert.py", line 100, in forward\n'
        f'  File "{SITE}/transformers/activations.py", line 57, in forward\n'
        f'  File "{SITE}/torch/nn/functional.py", line 1500, in gelu\n'
    )
    assert user_source(trace) == SourceLocation(f"{SITE}/transformers/activations.py", 57)


def test_only_torch_frames_give_no_source():
    trace = f'File "{SITE}/torch/nn/modules/linear.py", line 134, in forward\n'
    assert user_source(trace) is None


def test_empty_stack_trace_gives_no_source():
    assert user_source("") is None
    assert user_source("no frames in here") is None


@pytest.mark.parametrize("raw", [
    "not a list",
    "[",
    "42",
    "None",
    "{'a': 1}",
    "__import__('os').system('true')",
    "'just a string'",
    "",
    "[" * 500 + "]" * 500,
    "\x00",
])
def test_garbage_name_scopes_do_not_crash(raw):
    meta = read_torch_metadata({
        NAME_SCOPES_KEY: raw,
        CLASS_HIERARCHY_KEY: raw,
        STACK_TRACE_KEY: raw,
    })
    assert meta is not None
    assert isinstance(meta.scopes, tuple)
    assert meta.torch_op is None
    assert meta.source is None


def test_garbage_name_scopes_give_empty_scopes_and_no_fx_node():
    meta = read_torch_metadata({NAME_SCOPES_KEY: "definitely (not python"})
    assert meta.scopes == ()
    assert meta.fx_node is None


def test_non_string_list_items_are_read_as_strings():
    meta = read_torch_metadata({NAME_SCOPES_KEY: "['', 3, None]",
                                CLASS_HIERARCHY_KEY: "[1, 2]"})
    assert meta.scopes == ("", "3")
    assert meta.fx_node == "None"
    assert meta.torch_op is None


def test_garbage_stack_trace_with_a_bad_line_number_does_not_crash():
    meta = read_torch_metadata({NAME_SCOPES_KEY: "['', 'relu']",
                                STACK_TRACE_KEY: 'File "x.py", line abc\nFile "", line 1'})
    assert meta.fx_node == "relu"
    assert meta.source is None
