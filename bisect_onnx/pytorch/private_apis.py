"""Every private (or undocumented) torch and onnxscript API bisect-onnx reaches, in one place.

torch keeps several steps bisect-onnx needs to itself: the decompositions its dynamo
exporter runs before translating (whose FX node names the ONNX values carry), its own
table of ATen translations, running an edited TorchScript graph. onnxscript's eager
evaluator has no public hook that sees each op it runs. These can change or vanish in
any release, so no other module touches them (``tests/pytorch/test_private_apis.py``
checks): each is reached through one accessor here, whose docstring says what it is
for, which versions it was checked on and what is lost without it.

An accessor whose API is missing either falls back to a public way that loses a
little (said in its docstring), or raises :class:`PrivateApiMissing`, a
:class:`~bisect_onnx.errors.BisectOnnxError` whose message names the API, the
installed version and what the run does without it, which its caller turns into
"module level only", "traced instead" and the like. An ``ImportError`` from here is
never the CLI's exit 4 (a bug in bisect-onnx): a newer torch is not a bug of ours.

Outside the versions of :data:`CHECKED_ON` the APIs are still used, and may still
work: the first accessor that reaches one says so, once, in the log.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, TypeVar, cast

from bisect_onnx.errors import BisectOnnxError
from bisect_onnx.pytorch.plain_trees import PlainSpec, flatten_plain, unflatten_plain

if TYPE_CHECKING:
    import onnx
    import torch
    from onnxscript.evaluator import ORTEvaluator
    from torch.export import ExportedProgram
    from torch.onnx._internal.exporter._registration import ONNXRegistry

__all__ = ["CHECKED_ON", "PrivateApiMissing", "prepare_for_export", "torch_translations",
           "torchlib_translations", "recording_evaluator", "preload_translations",
           "is_op_overload", "tree_flatten", "tree_unflatten", "tree_map",
           "prepare_script_graph", "graph_function",
           "version_counter", "script_graph", "torchscript_translator"]

logger = logging.getLogger(__name__)

_Found = TypeVar("_Found")

#: (oldest, newest) ``major.minor`` each package's private APIs here were run on: the
#: versions the test suite ran against when they were written (torch 2.13.0, onnxscript
#: 0.7.2). Widen a range only after the suite has passed on the new version.
CHECKED_ON: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    "torch": ((2, 13), (2, 13)),
    "onnxscript": ((0, 7), (0, 7)),
}


class PrivateApiMissing(BisectOnnxError):
    """A private torch or onnxscript API is not in the installed version.

    The message says which one, the version, and what the run does without it.
    """

    def __init__(self, package: str, api: str, lost: str) -> None:
        super().__init__(f"{api} is not in {package} {installed(package)}: {lost}")
        self.package, self.api, self.lost = package, api, lost


@functools.cache
def installed(package: str) -> str:
    """The installed version of ``package`` (``"unknown"`` when it has no metadata)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def _check_version(package: str) -> bool:
    """Whether ``package``'s version is in :data:`CHECKED_ON`; logged once when it is not."""
    version = installed(package)
    match = re.match(r"(\d+)\.(\d+)", version)
    oldest, newest = CHECKED_ON[package]
    within = match is not None and oldest <= (int(match[1]), int(match[2])) <= newest
    if not within:
        logger.warning("bisect-onnx uses private %s APIs checked on %s %d.%d to %d.%d only; "
                       "with %s %s a missing one narrows the run (said where it does)",
                       package, package, *oldest, *newest, package, version)
    return within


def _reach(package: str, api: str, lost: str, find: Callable[[], _Found]) -> _Found:
    """``find()``, or :class:`PrivateApiMissing` when the API it looks up is not there."""
    _check_version(package)
    try:
        return find()
    except (ImportError, AttributeError) as error:
        logger.debug("%s: %s", api, error)
        raise PrivateApiMissing(package, api, lost) from error


# ---------------------------------------------------------------- the dynamo exporter


def prepare_for_export() -> Callable[[ExportedProgram], ExportedProgram]:
    """``program -> program`` after the decompositions the dynamo exporter runs first.

    ``torch.onnx._internal.exporter._core._prepare_exported_program_for_export`` with
    the registry ``_registration.ONNXRegistry.from_torchlib()``, checked on torch 2.13.
    The ONNX value names of a dynamo export are the FX node names of that program.
    Without it, :func:`~bisect_onnx.pytorch.exporting.as_translated` takes the same
    program from a whole ``torch.onnx.export`` (public, but it translates to ONNX too).
    """
    def find() -> Callable[[ExportedProgram], ExportedProgram]:
        from torch.onnx._internal.exporter import _core, _registration

        prepare = _core._prepare_exported_program_for_export
        _registration.ONNXRegistry.from_torchlib  # noqa: B018 - missing: PrivateApiMissing
        return lambda program: prepare(program, registry=_torchlib_registry())

    return _reach("torch", "torch.onnx._internal.exporter._core."
                  "_prepare_exported_program_for_export",
                  "op level takes the exporter's slower public path", find)


@functools.cache
def _torchlib_registry() -> ONNXRegistry:
    """The exporter's registry of ATen translations, built once per process.

    Building it reads every torchlib translation (0.6 s to 0.8 s here); the decomposition
    step only reads it, so one serves every program of the process (a divergence may
    trace several module calls, then the whole model).
    """
    from torch.onnx._internal.exporter import _registration

    return _registration.ONNXRegistry.from_torchlib()


def torch_translations(target: str) -> list[Callable[..., object]]:
    """The exporter's own translation functions of ATen op ``target`` (``aten.add.Tensor``).

    From ``torch.onnx._internal.exporter._torchlib._torchlib_registry.get_torchlib_ops``,
    checked on torch 2.13: the translations torch prefers to onnxscript's. Without it a
    culprit op is not looked inside from its translation alone: its module call is
    traced instead, where the model is at hand.
    """
    def find() -> list[Callable[..., object]]:
        from torch.onnx._internal.exporter._torchlib._torchlib_registry import (
            get_torchlib_ops,
        )

        return [meta.onnx_function for meta in get_torchlib_ops()
                if str(meta.fx_target) == target and not meta.is_complex]

    return _reach("torch", "torch.onnx._internal.exporter._torchlib._torchlib_registry",
                  "an op is looked inside only by tracing its module call", find)


def torchlib_translations(qualified: str) -> list[Callable[..., object]]:
    """The torch_lib translations (onnxscript's) of ``aten::add.Tensor`` (undocumented registry).

    ``onnxscript.function_libs.torch_lib.registration.default_registry``, filled by
    importing ``torch_lib.ops``; checked on onnxscript 0.7.2. Without it as for
    :func:`torch_translations`.
    """
    def find() -> list[Callable[..., object]]:
        from onnxscript.function_libs.torch_lib import ops  # noqa: F401  (fills the registry)
        from onnxscript.function_libs.torch_lib.registration import default_registry

        return (list(default_registry[qualified].overloads)
                if qualified in default_registry else [])

    return _reach("onnxscript", "onnxscript.function_libs.torch_lib.registration",
                  "an op is looked inside only by tracing its module call", find)


def preload_translations() -> None:
    """Import what :func:`torch_translations` and the eager evaluator need, ahead of use.

    For :mod:`bisect_onnx.pytorch.exporter_imports`' thread; a missing module is left
    for the accessor that needs it to report.
    """
    try:
        from onnxscript import evaluator  # noqa: F401
        from onnxscript.function_libs.torch_lib import ops  # noqa: F401
        from torch.onnx._internal.exporter._torchlib import ops as torch_ops  # noqa: F401
    except Exception as error:  # noqa: BLE001 - in a thread: the accessor that needs it says why
        logger.debug("importing the exporter's translations ahead failed: %s", error)


#: ``record(schema, inputs, attributes, outputs)``; onnxscript's values are only read.
Recorder = Callable[["onnx.defs.OpSchema", Sequence[object], Mapping[str, object],
                     Sequence[object]], None]


def recording_evaluator(record: Recorder) -> ORTEvaluator:
    """An onnxscript ONNX Runtime eager evaluator that calls ``record`` after each op.

    ``record(schema, inputs, attributes, outputs)``. onnxscript has no public hook per
    op: this overrides ``ORTEvaluator._eval``, checked on onnxscript 0.7.2. Without it
    as for :func:`torch_translations`.
    """
    def find() -> ORTEvaluator:
        from onnxscript import evaluator

        base = evaluator.ORTEvaluator
        base._eval  # noqa: B018 - the hook overridden below must be there

        class Recording(base):
            def _eval(self, schema: onnx.defs.OpSchema, inputs: Sequence[object],
                      attributes: Mapping[str, object], closure: Mapping[str, object],
                      ) -> Sequence[object]:
                outputs = super()._eval(schema, inputs, attributes, closure)
                record(schema, inputs, attributes, outputs)
                return outputs

        return Recording()

    return _reach("onnxscript", "onnxscript.evaluator.ORTEvaluator._eval",
                  "an op is looked inside only by tracing its module call", find)


# ---------------------------------------------------------------- torch.fx and pytrees


def is_op_overload(target: object) -> bool:
    """Whether an FX node's target is an ATen (or custom) op overload, ``aten.linear.default``.

    ``torch._ops.OpOverload``, checked on torch 2.13; without it, told by its public
    ``overloadpacket`` and ``name()``, which lose nothing known.
    """
    _check_version("torch")
    import torch

    overload = getattr(getattr(torch, "_ops", None), "OpOverload", None)
    if overload is not None:
        return isinstance(target, overload)
    return hasattr(target, "overloadpacket") and callable(getattr(target, "name", None))


def _pytree() -> ModuleType | None:
    """``torch.utils._pytree`` (checked on torch 2.13), or ``None``."""
    _check_version("torch")
    try:
        from torch.utils import _pytree
    except ImportError:
        logger.debug("no torch.utils._pytree: containers other than tuple, list and dict "
                     "are taken whole")
        return None
    return _pytree


def tree_flatten(tree: object) -> tuple[list[object], object]:
    """The leaves of nested arguments and how to put them back (:func:`tree_unflatten`).

    ``torch.utils._pytree.tree_flatten``, checked on torch 2.13: it knows every
    container torch registers (transformers' ``ModelOutput``). Without it only tuples,
    lists and dicts are opened; anything else is one leaf. The second item (torch's
    ``TreeSpec``, or a :data:`~bisect_onnx.pytorch.plain_trees.PlainSpec`) is opaque.
    """
    pytree = _pytree()
    if pytree is not None:
        return pytree.tree_flatten(tree)
    leaves: list[object] = []
    return leaves, flatten_plain(tree, leaves)


def tree_unflatten(leaves: Sequence[object], spec: object) -> object:
    """The arguments :func:`tree_flatten` took apart, made again from ``leaves``."""
    pytree = _pytree()
    if pytree is not None:
        return pytree.tree_unflatten(list(leaves), spec)
    return unflatten_plain(iter(leaves), cast("PlainSpec", spec))


def tree_map(function: Callable[[object], object], tree: object) -> object:
    """``tree`` with ``function`` applied to each leaf (as :func:`tree_flatten` finds them)."""
    leaves, spec = tree_flatten(tree)
    return tree_unflatten([function(leaf) for leaf in leaves], spec)


# ---------------------------------------------------------------- TorchScript and tensors


def prepare_script_graph(graph: torch.Graph) -> None:
    """Make a TorchScript graph's in-place ops functional, and merge its repeated ones.

    ``torch._C._jit_pass_remove_mutation`` and ``torch._C._jit_pass_cse``, checked on
    torch 2.13. Without the first, a value an in-place op (``ReLU(inplace=True)``) later
    overwrites would be read after the write, so a TorchScript model is not compared
    value by value at all. The second is the exporter's own: two ``zeros_like`` of one
    tensor, and the products of each with one factor, are one node in its file (RWKV's
    two state sums), so the traced graph must hold them as one op too, or every op
    after them is paired with the next op's node.
    """
    import torch

    for name in ("_jit_pass_remove_mutation", "_jit_pass_cse"):
        run = _reach("torch", f"torch._C.{name}", _SCRIPT_LOST,
                     lambda name=name: getattr(torch._C, name))
        run(graph)


def graph_function(graph: torch.Graph, model: torch.jit.ScriptModule) -> Callable[..., object]:
    """A callable running ``graph`` (an edited copy of ``model``'s) on ``model``'s weights.

    ``torch._C._create_function_from_graph`` called with the ScriptModule's C++ object
    (``model._c``) first, checked on torch 2.13. Without it as for
    :func:`prepare_script_graph`.
    """
    import torch

    def find() -> Callable[..., object]:
        function = torch._C._create_function_from_graph("bisect_onnx_capture", graph)
        weights = model._c
        return lambda *inputs: function(weights, *inputs)

    return _reach("torch", "torch._C._create_function_from_graph", _SCRIPT_LOST, find)


_SCRIPT_LOST = ("a TorchScript model's values cannot be recorded: give its nn.Module or "
                "an ExportedProgram instead")


# ---------------------------------------------------------------- the TorchScript exporter

_RECORD_LOST = ("the TorchScript pairing uses its own table of the ONNX node each ATen op "
                "ends in, instead of asking the exporter")


def script_graph() -> torch.Graph:
    """A new, empty TorchScript graph (``torch._C.Graph``, checked on torch 2.13).

    For :func:`torchscript_translator`'s one-op graphs; without it as for that one.
    """
    import torch

    return _reach("torch", "torch._C.Graph", _RECORD_LOST, lambda: torch._C.Graph)()


def torchscript_translator(opset: int) -> Callable[[torch.Graph], torch.Graph]:
    """``graph -> ONNX graph``: what the TorchScript exporter makes of a traced graph.

    The steps ``torch.onnx``'s TorchScript exporter (``_optimize_graph``) runs on a
    traced graph that a one-op graph needs (``torch._C._jit_pass_constant_propagation``,
    which makes a list of literals one, ``_jit_pass_onnx_preprocess``,
    ``_jit_pass_prepare_division_for_onnx``, ``_jit_pass_erase_number_types``), then
    ``torch._C._jit_pass_onnx``, which calls each node's own symbolic function
    (``torchscript_exporter.utils._run_symbolic_function``) at ``opset``, set in
    ``torchscript_exporter._globals.GLOBALS`` for the call only; checked on torch 2.13.
    The graph given is edited. An op the exporter cannot translate raises what its
    symbolic function raised. Without these, the TorchScript pairing falls back on its
    own table of what each op ends in (:mod:`bisect_onnx.align.script_table`).
    """
    def find() -> Callable[[torch.Graph], torch.Graph]:
        import torch
        from torch.onnx._internal.torchscript_exporter import utils
        from torch.onnx._internal.torchscript_exporter._globals import GLOBALS

        passes = (torch._C._jit_pass_constant_propagation, torch._C._jit_pass_onnx_preprocess,
                  torch._C._jit_pass_prepare_division_for_onnx,
                  torch._C._jit_pass_erase_number_types)
        translate, export_type = torch._C._jit_pass_onnx, torch.onnx.OperatorExportTypes.ONNX
        utils._run_symbolic_function  # noqa: B018 - what _jit_pass_onnx calls back
        utils._trigger_symbolic_function_registration()  # every opset's symbolic functions

        def run(graph: torch.Graph) -> torch.Graph:
            for each in passes:
                each(graph)
            before = GLOBALS.export_onnx_opset_version
            GLOBALS.export_onnx_opset_version = opset
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # the exporter's deprecation notices
                    return translate(graph, export_type)
            finally:
                GLOBALS.export_onnx_opset_version = before

        return run

    return _reach("torch", "torch._C._jit_pass_onnx with the TorchScript exporter's "
                  "symbolic functions", _RECORD_LOST, find)


def version_counter(tensor: torch.Tensor) -> int | None:
    """The tensor's in-place write counter (``None`` where it keeps none).

    ``Tensor._version``, checked on torch 2.13. Without it (and on an inference-mode
    tensor) a module output written in place after it was recorded is not noticed.
    """
    try:
        return tensor._version
    except (AttributeError, RuntimeError):  # an inference-mode tensor keeps none
        return None
