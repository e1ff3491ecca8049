"""The runtimes bisect-onnx can run an ONNX file in: one :class:`RuntimeEntry` each.

ONNX Runtime is the default. OpenVINO is an optional package
(``pip install bisect-onnx[openvino]``): it is imported only when asked for, so
nothing else pays for it and a missing package is a one-line error. Adding a runtime
is a folder with a :class:`~bisect_onnx.runtime.runner.Runner` subclass and its
:class:`~bisect_onnx.runtime.runner.RuntimeEntry`, and one :func:`register_runtime`
line here (docs/runtimes.md).
"""

from __future__ import annotations

from pathlib import Path

from bisect_onnx.errors import UsageError
from bisect_onnx.runtime.onnxruntime import ENTRY as ONNXRUNTIME_ENTRY
from bisect_onnx.runtime.openvino import ENTRY as OPENVINO_ENTRY
from bisect_onnx.runtime.openvino import OV_PRECISIONS
from bisect_onnx.runtime.runner import Runner, RunnerSettings, RuntimeEntry

__all__ = ["ONNXRUNTIME", "OPENVINO", "OV_PRECISIONS", "RuntimeEntry", "register_runtime",
           "runtime_names", "runtime_entry", "make_runner", "check_settings", "display_name",
           "repository"]

ONNXRUNTIME = "onnxruntime"
OPENVINO = "openvino"

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


# The runtimes there are, ONNX Runtime (the default) first: one line each.
register_runtime(ONNXRUNTIME_ENTRY)
register_runtime(OPENVINO_ENTRY)
