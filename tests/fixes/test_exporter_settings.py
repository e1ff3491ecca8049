"""Which exports an exporter culprit's search tries, and how a file says it was exported."""

import onnx
from onnx import TensorProto, helper

from bisect_onnx.fixes.exporter_settings import (
    SUPPORTED_OPSETS,
    candidate_settings,
    settings_of_model,
)
from bisect_onnx.pytorch.reexport import ExportCall
from fixtures.registry import FIXTURES, repo_path


def test_the_other_exporter_comes_first_then_the_rewriting_pass_then_opsets():
    used = ExportCall("dynamo", 18, {"dynamic_shapes": None})
    order = candidate_settings(used)
    assert order[0] == ExportCall("torchscript", 18, {"dynamic_shapes": None})
    assert order[1].exporter == "dynamo" and order[1].options["optimize"] is False
    assert all(each.options.get("dynamic_shapes", "kept") is None for each in order)
    keys = [(each.exporter, each.opset, tuple(sorted(each.options.items()))) for each in order]
    assert len(keys) == len(set(keys)), "a candidate is tried twice"
    assert ("dynamo", 18, (("dynamic_shapes", None),)) not in keys, "the used export is retried"
    assert {each.opset for each in order if each.exporter == "torchscript"} <= set(
        SUPPORTED_OPSETS["torchscript"])


def test_an_opset_the_other_exporter_lacks_becomes_its_nearest():
    order = candidate_settings(ExportCall("dynamo", 23))
    assert order[0] == ExportCall("torchscript", 20)


def test_an_unknown_exporter_tries_both_with_and_without_rewriting():
    order = candidate_settings(ExportCall(None, 18))
    assert [each.exporter for each in order[:4]] == ["dynamo", "dynamo", "torchscript",
                                                     "torchscript"]
    assert order[3].options == {"do_constant_folding": False}


def test_the_call_is_the_exact_torch_onnx_export_call():
    settings = ExportCall("torchscript", 17, {"do_constant_folding": False})
    assert settings.call() == ('torch.onnx.export(model, args, "model.onnx", dynamo=False, '
                               'opset_version=17, do_constant_folding=False)')
    assert settings.as_dict() == {"exporter": "torchscript", "opset": 17,
                                  "options": {"do_constant_folding": False}}


def test_a_dynamo_file_says_dynamo_and_its_opset():
    model = onnx.load(repo_path(FIXTURES["avgpool_divisor"].onnx_file), load_external_data=False)
    assert settings_of_model(model) == ExportCall("dynamo", 18)


def _file(producer, node_name):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name=node_name)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    return helper.make_model(graph, producer_name=producer,
                             opset_imports=[helper.make_opsetid("", 17)])


def test_a_torchscript_file_and_a_file_made_elsewhere():
    assert settings_of_model(_file("pytorch", "/act/Relu")) == ExportCall("torchscript", 17)
    assert settings_of_model(_file("tf2onnx", "Relu_0")) == ExportCall(None, 17)
