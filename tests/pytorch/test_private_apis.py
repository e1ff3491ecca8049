"""Private torch and onnxscript APIs: reached only through one module, each with a fallback.

A torch release that drops one must narrow the run with a reason, never crash it (the
CLI's exit 4). Each fallback is exercised by making its API missing, as a newer torch
would: the attribute deleted, so that the import of it fails.
"""

from __future__ import annotations

import ast
import logging
import operator

import onnx
import pytest
import torch

import bisect_onnx
from bisect_onnx.cli.command import main
from bisect_onnx.errors import BisectOnnxWarning
from bisect_onnx.pipeline.torch_comparison import NO_OP_LEVEL
from bisect_onnx.pytorch import private_apis
from bisect_onnx.pytorch.private_apis import PrivateApiMissing
from fixtures.registry import FIXTURES, REPO_ROOT, repo_path
from tests.planting import node_of_module, plant, scale_initializer_input
from tests.test_layout import PACKAGE_ROOT, read_package
from tests.torch_warnings import LEGACY_EXPORTER_DEPRECATED, TORCH_JIT_DEPRECATED

HOME = "bisect_onnx.pytorch.private_apis"
#: Packages whose private names only :data:`HOME` may reach.
GUARDED = ("torch", "onnxscript", "onnxruntime", "onnx_ir")
#: Private attributes the package may read elsewhere, each with why.
ALLOWED = {
    "_getframe",  # sys._getframe in errors.py: CPython's, documented, not a guarded package
}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _guarded_path(dotted: str) -> bool:
    """``torch.onnx._internal.exporter``: a guarded package's name with a private part."""
    parts = dotted.split(".")
    return parts[0] in GUARDED and any(_is_private(part) for part in parts[1:])


def _chain(node: ast.Attribute) -> str | None:
    """``torch._C._jit_pass`` for that attribute chain on a name, else ``None``."""
    parts = [node.attr]
    while isinstance(node.value, ast.Attribute):
        node = node.value
        parts.append(node.attr)
    if not isinstance(node.value, ast.Name):
        return None
    return ".".join([node.value.id, *reversed(parts)])


def _defined_names(modules) -> set[str]:
    """Every name the package itself defines: its own private attributes are its own."""
    names = set()
    for module in modules.values():
        for node in ast.walk(module.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return names


def private_uses(modules) -> list[str]:
    """``path:line what`` for each private guarded API reached outside :data:`HOME`.

    An import from a private module or of a private name (``from torch.utils._pytree``),
    an attribute chain on a guarded package (``torch._C``), or a private attribute the
    package defines nowhere (``model._c``: someone else's).
    """
    outside = {name: module for name, module in modules.items() if name != HOME}
    own = _defined_names(outside) | ALLOWED
    found = []
    for module in outside.values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Import):
                used = [alias.name for alias in node.names if _guarded_path(alias.name)]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                used = [f"{node.module}.{alias.name}" for alias in node.names
                        if _guarded_path(f"{node.module}.{alias.name}")]
            elif isinstance(node, ast.Attribute) and _is_private(node.attr):
                chain = _chain(node)
                used = ([chain] if chain and _guarded_path(chain)
                        else [] if node.attr in own else [ast.unparse(node)])
            else:
                continue
            found += [f"{module.path}:{node.lineno} {each}" for each in used]
    # ``torch._C.x`` is one use, not also one of ``torch._C``: drop what another extends.
    return [item for item in found
            if not any(other != item and other.startswith(item + ".") for other in found)]


def test_no_module_but_one_reaches_a_private_torch_or_onnxscript_api():
    found = private_uses(read_package(PACKAGE_ROOT))
    assert not found, "reach these through bisect_onnx/pytorch/private_apis.py:" + "".join(
        f"\n  {item}" for item in found)


def test_each_kind_of_private_use_is_named(tmp_path):
    root = tmp_path / "bisect_onnx"
    (root / "pytorch").mkdir(parents=True)
    for name in ("__init__.py", "pytorch/__init__.py"):
        (root / name).write_text("")
    (root / "pytorch" / "private_apis.py").write_text("import torch._C\n")
    (root / "uses.py").write_text(
        "import torch\n"
        "from torch.utils._pytree import tree_map\n"
        "from torch.onnx._internal.exporter import _core\n"
        "import onnxscript._internal\n"
        "from torch.onnx import export\n"
        "x = torch._C.TupleType\n"
        "def f(model, self):\n"
        "    self._own = model._c\n"
        "    torch._C._jit_pass_inline(model)\n"
        "    return self._own, torch.__version__\n")
    found = private_uses(read_package(root))
    assert [item.split(":", 1)[1] for item in found] == [
        "2 torch.utils._pytree.tree_map", "3 torch.onnx._internal.exporter._core",
        "4 onnxscript._internal", "6 torch._C", "8 model._c",
        "9 torch._C._jit_pass_inline"]


# ---------------------------------------------------------------- the accessors


def test_a_version_outside_the_checked_range_is_logged_once(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger=HOME)
    monkeypatch.setattr(private_apis, "installed", lambda package: "9.1.0")
    private_apis._check_version.cache_clear()
    try:
        private_apis.is_op_overload(torch.ops.aten.add.Tensor)
        private_apis.is_op_overload(torch.ops.aten.mul.Tensor)
        (record,) = [item for item in caplog.records if item.name == HOME]
        assert "checked on torch 2.13 to 2.13 only" in record.getMessage()
        assert "torch 9.1.0" in record.getMessage()
    finally:
        private_apis._check_version.cache_clear()


def test_the_pinned_torch_is_a_checked_one():
    # The install commands pin torch (README, .ci/run): a failure here means the pin moved
    # past CHECKED_ON; once the suite passes there, widen it. onnxscript is not pinned, so
    # a newer one only logs that it is outside the checked range.
    assert private_apis._check_version("torch")


def test_a_missing_api_names_itself_the_version_and_what_is_lost(monkeypatch):
    from torch.onnx._internal.exporter import _core

    monkeypatch.delattr(_core, "_prepare_exported_program_for_export")
    with pytest.raises(PrivateApiMissing) as caught:
        private_apis.prepare_for_export()
    message = str(caught.value)
    assert "_prepare_exported_program_for_export is not in torch 2." in message
    assert message.endswith("op level takes the exporter's slower public path")
    assert isinstance(caught.value, bisect_onnx.BisectOnnxError)


def test_the_exporters_registry_is_built_once_for_every_program(monkeypatch):
    from torch.onnx._internal.exporter import _core, _registration

    given = []
    monkeypatch.setattr(_core, "_prepare_exported_program_for_export",
                        lambda program, *, registry: given.append(registry) or program)
    private_apis._torchlib_registry.cache_clear()
    built = []
    original = _registration.ONNXRegistry.from_torchlib
    monkeypatch.setattr(_registration.ONNXRegistry, "from_torchlib",
                        lambda: built.append(1) or original())
    try:
        for program in ("first call's program", "second call's program"):
            assert private_apis.prepare_for_export()(program) == program
    finally:
        private_apis._torchlib_registry.cache_clear()  # not this test's stand-in
    assert len(built) == 1 and given[0] is given[1]


def test_op_overloads_are_told_without_torchs_private_class(monkeypatch):
    monkeypatch.delattr(torch._ops, "OpOverload")
    assert private_apis.is_op_overload(torch.ops.aten.linear.default)
    assert not private_apis.is_op_overload(operator.getitem)
    assert not private_apis.is_op_overload(torch.ops.aten.linear)  # the packet, not an op


def test_without_torchs_pytree_tuples_lists_and_dicts_are_opened(monkeypatch):
    monkeypatch.setattr(private_apis, "_pytree", lambda: None)
    tree = ((torch.ones(2), 3), {"mask": [torch.zeros(1)], "n": None})
    leaves, spec = private_apis.tree_flatten(tree)
    assert [type(leaf).__name__ for leaf in leaves] == ["Tensor", "int", "Tensor", "NoneType"]
    again = private_apis.tree_unflatten(leaves, spec)
    assert again[0][1] == 3 and again[1]["n"] is None and isinstance(again[1]["mask"], list)
    doubled = private_apis.tree_map(lambda leaf: leaf * 2 if leaf is not None else leaf, tree)
    assert doubled[0][0].tolist() == [2.0, 2.0] and doubled[0][1] == 6


def test_a_tensor_without_a_version_counter_has_none():
    assert private_apis.version_counter(torch.ones(1)) == 0
    assert private_apis.version_counter(object()) is None
    with torch.inference_mode():
        assert private_apis.version_counter(torch.ones(1)) is None


# ---------------------------------------------------------------- runs without them


def test_without_the_exporters_decompositions_a_dynamo_file_is_compared_by_module(
        fixture_case, monkeypatch, caplog):
    from torch.onnx._internal.exporter import _core

    caplog.set_level(logging.INFO, logger="bisect_onnx")
    model, inputs, exported = fixture_case("tiny_mlp")
    # Deleted, it is gone from the exporter's own path too: that fallback fails as well.
    monkeypatch.delattr(_core, "_prepare_exported_program_for_export")
    with pytest.warns(BisectOnnxWarning, match="op granularity needs"):
        report = bisect_onnx.bisect(model, inputs, onnx_model=exported,
                                    search=bisect_onnx.SearchOptions(granularity="op"))
    assert report.verdict == "parity"
    assert report.coverage.granularity == "module" and NO_OP_LEVEL in report.warnings
    assert any("_prepare_exported_program_for_export is not in torch" in item.getMessage()
               and "public path" in item.getMessage() for item in caplog.records)


def test_without_torchs_translations_the_culprit_module_call_is_still_found(fixture_case, tmp_path,
                                                                  monkeypatch, caplog):
    from torch.onnx._internal.exporter._torchlib import _torchlib_registry

    caplog.set_level(logging.INFO, logger="bisect_onnx")
    model, inputs, exported = fixture_case("tiny_transformer")
    node = node_of_module(onnx.load(str(exported)), "blocks.0.attn.v", "MatMul")
    planted = tmp_path / "planted.onnx"
    plant(exported, planted, scale_initializer_input(node.name, 1, 1.05))
    # The exporter's registry reads the same table: no call is traced alone either.
    monkeypatch.delattr(_torchlib_registry, "get_torchlib_ops")
    report = bisect_onnx.bisect(model, inputs, onnx_model=planted)
    # The module call, not the MatMul inside it (found with the table: test_exporter_imports).
    assert report.verdict == "diverged" and report.culprit.torch_module == "blocks.0.attn.v"
    assert report.inside_op is None
    assert any("cannot look inside" in item.getMessage()
               and "_torchlib_registry is not in torch" in item.getMessage()
               for item in caplog.records)


def test_without_running_an_edited_graph_a_torchscript_file_loses_only_op_level(
        fixture_case, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="bisect_onnx")
    model, inputs, _ = fixture_case("tiny_mlp")
    monkeypatch.delattr(torch._C, "_jit_pass_remove_mutation")
    with pytest.warns(BisectOnnxWarning, match="op granularity needs"):
        report = bisect_onnx.bisect(
            model, inputs, search=bisect_onnx.SearchOptions(granularity="op"),
            onnx_model=repo_path(FIXTURES["tiny_mlp"].torchscript_onnx_file))
    assert report.verdict == "parity" and report.coverage.granularity == "module"
    assert any("no op level for the TorchScript file" in item.getMessage()
               and "_jit_pass_remove_mutation is not in torch" in item.getMessage()
               for item in caplog.records)


class _TanhGelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.drop = torch.nn.Linear(8, 8), torch.nn.Dropout()

    def forward(self, x):
        return torch.nn.functional.gelu(self.drop(self.fc(x)), approximate="tanh") * 2


@LEGACY_EXPORTER_DEPRECATED
def test_without_the_exporters_symbolic_functions_the_torchscript_pairing_uses_its_table(
        tmp_path, monkeypatch, caplog):
    from bisect_onnx.align.script_ops import align_script_ops
    from bisect_onnx.pytorch.script_ops import capture_script_ops, trace_script
    from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner

    caplog.set_level(logging.INFO, logger="bisect_onnx")
    torch.manual_seed(0)
    model, x = _TanhGelu().eval(), torch.randn(2, 8)
    path = tmp_path / "model.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=18)
    side = OnnxRuntimeRunner(path, promote="all")
    values = side.run([x.numpy()]).capture.values

    def gelu_pairing():
        capture = capture_script_ops(trace_script(model, [x.numpy()]), [x.numpy()])
        alignment = align_script_ops(capture, side.nodes, values, side.model)
        left = {item.name: item for item in alignment.torch_only}
        assert left["dropout"].kind == "removed"  # compared where the linear is, either way
        return "gelu" in {pair.reference.name for pair in alignment.pairs}, left

    # The exporter's record pairs a tanh GELU with its last Mul; the table declines it.
    assert gelu_pairing()[0]
    monkeypatch.delattr(torch._C, "_jit_pass_onnx")
    paired, left = gelu_pairing()
    assert not paired and "approximate='tanh'" in left["gelu"].reason
    assert any("_jit_pass_onnx with the TorchScript exporter's symbolic functions is not "
               "in torch" in item.getMessage() and "its own table" in item.getMessage()
               for item in caplog.records)
    report = bisect_onnx.bisect(model, x.numpy(), onnx_model=path,
                                search=bisect_onnx.SearchOptions(granularity="op"))
    assert report.verdict == "parity" and report.coverage.granularity == "op"


@TORCH_JIT_DEPRECATED
def test_without_it_a_torchscript_model_is_a_user_error_not_a_bug(fixture_case, tmp_path,
                                                                  monkeypatch, capsys):
    model, inputs, _ = fixture_case("tiny_mlp")
    archive = tmp_path / "model.ts"
    torch.jit.save(torch.jit.trace(model, tuple(map(torch.from_numpy, inputs.values()))),
                   archive)
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.delattr(torch._C, "_create_function_from_graph")
    status = main([str(archive), "--input", FIXTURES["tiny_mlp"].input_file])
    error = capsys.readouterr().err
    assert status == 2  # the user's torch, a user error: not exit 4, a bug of ours
    assert "_create_function_from_graph is not in torch" in error
    assert "give its nn.Module" in error



def test_without_the_private_decompositions_op_level_takes_the_exporters_public_path(
        monkeypatch, fixture_case, tmp_path):
    from bisect_onnx.pytorch import exporting
    from tests.planting import plant, scale_conv_weight

    model, inputs, exported = fixture_case("resnet_like")
    planted = tmp_path / "planted.onnx"  # op level runs once a value diverges
    node, _ = plant(exported, planted, scale_conv_weight("layer2.bn1", 1.003))
    op_rows = bisect_onnx.SearchOptions(granularity="op")
    usual = bisect_onnx.bisect(model, inputs, onnx_model=planted, search=op_rows)

    def missing():
        raise PrivateApiMissing("torch", "_prepare_exported_program_for_export", "gone")

    monkeypatch.setattr(exporting, "prepare_for_export", missing)
    public = bisect_onnx.bisect(model, inputs, onnx_model=planted, search=op_rows)
    assert public.coverage.granularity == usual.coverage.granularity == "op"
    # The same ops, named the same: the program torch.onnx.export translates.
    assert [r.onnx_value for r in public.comparisons] == [r.onnx_value for r in usual.comparisons]
    assert [r.torch_op for r in public.comparisons] == [r.torch_op for r in usual.comparisons]
    assert any(r.torch_op for r in public.comparisons)
    assert public.culprit.onnx_node == usual.culprit.onnx_node == node
