"""The runtimes bisect-onnx can run an ONNX file in: one :class:`RuntimeEntry` each.

ONNX Runtime is the default. OpenVINO is an optional package
(``pip install bisect-onnx[openvino]``): it is imported only when asked for, so
nothing else pays for it and a missing package is a one-line error. Adding a runtime
is a folder with a :class:`~bisect_onnx.runtime.runner.Runner` subclass and one
:func:`register_runtime` call (docs/runtimes.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bisect_onnx.errors import UsageError

if TYPE_CHECKING:
    from bisect_onnx.runtime.runner import Runner, RunnerSettings

__all__ = ["ONNXRUNTIME", "OPENVINO", "OV_PRECISIONS", "RuntimeEntry", "register_runtime",
           "runtime_names", "runtime_entry", "make_runner", "check_settings", "display_name",
           "repository"]

ONNXRUNTIME = "onnxruntime"
OPENVINO = "openvino"
#: OpenVINO's ``INFERENCE_PRECISION_HINT`` values; ``None`` keeps the device's default
#: (bf16 on CPUs with AMX or AVX-512 BF16, else f32).
OV_PRECISIONS = ("f32", "f16", "bf16")


@dataclass(frozen=True)
class RuntimeEntry:
    """One runtime: its names, where its kernel bugs go, and how its runner is made."""

    name: str
    """The ``--runtime`` choice and the report's ``environment.runtime``."""
    display_name: str
    """How the report's sentences name it."""
    repository: str
    """Where a bug in its kernels is filed."""
    make: Callable[[Path, RunnerSettings], Runner]
    """The runner of a file under these settings (imports the runtime's folder)."""
    check: Callable[[RunnerSettings], None]
    """One-line errors for settings it cannot take, before anything runs."""


_RUNTIMES: dict[str, RuntimeEntry] = {}


def register_runtime(entry: RuntimeEntry) -> None:
    """Make ``entry`` a runtime ``RuntimeOptions(runtime=...)`` and ``--runtime`` name."""
    _RUNTIMES[entry.name] = entry


def runtime_names() -> tuple[str, ...]:
    """The names of the runtimes registered, ONNX Runtime first."""
    return tuple(_RUNTIMES)


def runtime_entry(name: str) -> RuntimeEntry:
    """The runtime called ``name``, or a one-line error naming those there are."""
    entry = _RUNTIMES.get(name)
    if entry is None:
        raise UsageError(f"unknown runtime {name!r}; choose one of {', '.join(_RUNTIMES)}")
    return entry


def make_runner(name: str, path: Path, settings: RunnerSettings) -> Runner:
    """The runner of runtime ``name`` on the ONNX file at ``path``."""
    return runtime_entry(name).make(Path(path), settings)


def check_settings(name: str, settings: RunnerSettings) -> None:
    """One-line errors for an unknown runtime, or settings that runtime cannot take."""
    runtime_entry(name).check(settings)


def display_name(runtime: str | None) -> str:
    """The runtime's name in the report's sentences (ONNX Runtime where none is said)."""
    entry = _RUNTIMES.get(runtime or ONNXRUNTIME)
    return entry.display_name if entry is not None else str(runtime)


def repository(runtime: str) -> str:
    """Where a bug in ``runtime``'s kernels is filed."""
    entry = _RUNTIMES.get(runtime)
    return entry.repository if entry is not None else runtime


def _make_onnxruntime(path: Path, settings: RunnerSettings) -> Runner:
    from bisect_onnx.runtime.onnxruntime.runner import OnnxRuntimeRunner

    return OnnxRuntimeRunner(path, provider=settings.provider, opt_level=settings.opt_level,
                             promote=settings.promote)


def _check_onnxruntime(settings: RunnerSettings) -> None:
    from bisect_onnx.runtime.onnxruntime.sessions import check_runtime

    if settings.precision is not None:
        _check_precision(settings.precision)
        raise UsageError("an OpenVINO precision (--ov-precision) applies to runtime "
                         "openvino; drop it, or add --runtime openvino")
    check_runtime(settings.provider, settings.opt_level, settings.promote)


def _make_openvino(path: Path, settings: RunnerSettings) -> Runner:
    from bisect_onnx.runtime.openvino.runner import OpenVinoRunner

    return OpenVinoRunner(path, precision=settings.precision, promote=settings.promote)


def _check_openvino(settings: RunnerSettings) -> None:
    from bisect_onnx.runtime.onnxruntime.sessions import (
        CPU_PROVIDER,
        DEFAULT_OPT_LEVEL,
        check_runtime,
    )
    from bisect_onnx.runtime.openvino.sessions import import_openvino

    if settings.precision is not None:
        _check_precision(settings.precision)
    import_openvino()
    check_runtime(settings.provider, settings.opt_level, settings.promote)
    if (settings.provider, settings.opt_level) != (CPU_PROVIDER, DEFAULT_OPT_LEVEL):
        raise UsageError("provider and opt_level (--provider, --opt-level) are ONNX "
                         "Runtime's; OpenVINO runs on its CPU plugin as it compiles: "
                         "drop them with runtime openvino")


def _check_precision(precision: str) -> None:
    if precision not in OV_PRECISIONS:
        raise UsageError(f"unknown OpenVINO precision {precision!r}; choose one of "
                         f"{', '.join(OV_PRECISIONS)}")


register_runtime(RuntimeEntry(ONNXRUNTIME, "ONNX Runtime", "microsoft/onnxruntime",
                              _make_onnxruntime, _check_onnxruntime))
register_runtime(RuntimeEntry(OPENVINO, "OpenVINO", "openvinotoolkit/openvino",
                              _make_openvino, _check_openvino))
