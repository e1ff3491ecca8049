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


def test_innermost_frame_outside_torch_is_the_model_line_even_in_an_installed_package():
    trace = (
        'File "/home/me/train.py", line 10, in main\n'
        '  File "/home/me/model.py", line 42, in forward\n'
        f'  File "{SITE}/timm/layers/mlp.py", line 7, in forward\n'
        f'  File "{SITE}/torch/nn/modules/activation.py", line 143, in forward\n'
    )
    source = user_source(trace)
    assert source == SourceLocation(f"{SITE}/timm/layers/mlp.py", 7,
                                    call_site=SourceLocation("/home/me/model.py", 42))


def test_a_line_in_the_users_own_code_has_no_separate_call_site():
    source = user_source(LINEAR_TRACE)
    assert source == SourceLocation("/home/me/project/blocks.py", 338)
    assert source.call_site is None


# The shape of a LLaMA export's trace: the user's wrapper, then transformers' frames.
LLAMA_TRACE = (
    'File "/home/me/wrap.py", line 9, in forward\n'
    "    return self.model(input_ids=ids).last_hidden_state\n"
    f'  File "{SITE}/transformers/models/llama/modeling_llama.py", line 392, in forward\n'
    "    hidden_states = decoder_layer(\n"
    f'  File "{SITE}/transformers/utils/generic.py", line 80, in wrapper\n'
    f'  File "{SITE}/transformers/models/llama/modeling_llama.py", line 65, in forward\n'
    "    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)\n"
)


def test_a_transformers_model_points_at_its_modeling_file_and_the_wrapper_line():
    source = user_source(LLAMA_TRACE)
    assert source.file.endswith("transformers/models/llama/modeling_llama.py")
    assert source.line == 65
    assert source.call_site == SourceLocation("/home/me/wrap.py", 9)
    assert source.to_dict() == {"file": source.file, "line": 65,
                                "call_site": {"file": "/home/me/wrap.py", "line": 9}}


def test_only_installed_frames_give_the_innermost_one_and_no_call_site():
    trace = (
        f'File "{SITE}/transformers/models/bert/modeling_bert.py", line 100, in forward\n'
        f'  File "{SITE}/transformers/activations.py", line 57, in forward\n'
        f'  File "{SITE}/torch/nn/functional.py", line 1500, in gelu\n'
    )
    source = user_source(trace)
    assert source == SourceLocation(f"{SITE}/transformers/activations.py", 57)
    assert source.to_dict()["call_site"] is None


@pytest.mark.parametrize("machinery", [
    f"{SITE}/onnxscript/function_libs/torch_lib/ops/core.py",
    "/work/checkout/bisect_onnx/pytorch/op_values.py",
    "<frozen importlib._bootstrap>",
    "<eval_with_key>.5",
    "C:\\Python311\\Lib\\site-packages\\torch\\nn\\modules\\conv.py",
])
def test_frames_of_torch_the_exporter_and_bisect_onnx_are_never_the_model_line(machinery):
    trace = (
        'File "/home/me/model.py", line 5, in forward\n'
        f'  File "{machinery}", line 9, in something\n'
    )
    assert user_source(trace) == SourceLocation("/home/me/model.py", 5)


def test_a_dist_packages_helper_is_the_line_and_the_users_frame_the_call_site():
    trace = (
        'File "/home/me/model.py", line 5, in forward\n'
        '  File "/usr/lib/python3/dist-packages/einops/einops.py", line 9, in rearrange\n'
    )
    assert user_source(trace).call_site == SourceLocation("/home/me/model.py", 5)


def test_windows_paths_are_read_the_same_way():
    trace = (
        'File "C:\\Users\\me\\model.py", line 12, in forward\n'
        '  File "C:\\Python311\\Lib\\site-packages\\timm\\mlp.py", line 3, in f\n'
        '  File "C:\\Python311\\Lib\\site-packages\\torch\\nn\\conv.py", line 3, in f\n'
    )
    source = user_source(trace)
    assert source.file.endswith("timm\\mlp.py")
    assert source.call_site == SourceLocation("C:\\Users\\me\\model.py", 12)


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
