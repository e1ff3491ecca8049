"""ONNX Runtime sessions: providers, optimization levels, and how a session is made."""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bisect_onnx.errors import ModelError, RuntimeRefused, UsageError, one_line
from bisect_onnx.events import SESSION_CREATED, SESSION_STARTED, emit
from bisect_onnx.runtime.heap import made_in_heap
from bisect_onnx.runtime.onnxruntime.placement import ProfileFolder
from bisect_onnx.runtime.runner import PROMOTE_CHOICES

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = ["CPU_PROVIDER", "DEFAULT_OPT_LEVEL", "OPT_LEVELS", "SessionSettings",
           "DEFAULT_SESSION", "create_session", "check_provider", "check_runtime", "refusal"]

CPU_PROVIDER = "CPUExecutionProvider"
# ONNX Runtime's own default level; the candidate runs as production would.
DEFAULT_OPT_LEVEL = "all"
OPT_LEVELS = {"disabled": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
              "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


def check_runtime(provider: str, opt_level: str, promote: str) -> None:
    """One-line errors for runtime settings that cannot work, before anything runs."""
    if opt_level not in OPT_LEVELS:
        raise UsageError(f"unknown optimization level {opt_level!r}; choose one of "
                         f"{', '.join(OPT_LEVELS)}")
    if promote not in PROMOTE_CHOICES:
        raise UsageError(f"unknown promotion {promote!r}; choose one of "
                         f"{', '.join(PROMOTE_CHOICES)}")
    check_provider(provider)


def check_provider(provider: str) -> None:
    """A one-line error naming the available providers when ``provider`` is not one."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if provider not in available:
        raise UsageError(f"execution provider {provider!r} is not available in this "
                         f"onnxruntime; choose one of {', '.join(available)}")


@dataclass(frozen=True)
class SessionSettings:
    """How ONNX Runtime runs a model: on which provider, optimized how far."""

    provider: str = CPU_PROVIDER
    opt_level: str = DEFAULT_OPT_LEVEL
    """One of :data:`OPT_LEVELS`."""
    disabled_optimizers: tuple[str, ...] = ()
    """Graph transformers left out at that level (``NchwcTransformer``, say)."""
    spinning: bool = True
    """Whether idle intra-op threads spin for the next run (ONNX Runtime's default);
    off where PyTorch computes between runs, whose threads the spinning would starve."""


#: ONNX Runtime's own defaults: the CPU provider, every optimization.
DEFAULT_SESSION = SessionSettings()


def create_session(serialized: bytes | Path, *, model_dir: Path, label: str,
                   settings: SessionSettings = DEFAULT_SESSION,
                   optimized_path: Path | None = None, graph_only: bool = False,
                   profile: ProfileFolder | None = None) -> ort.InferenceSession:
    """An ORT session on a model whose external weights lie in ``model_dir``.

    ``serialized``: the model's bytes (a copy made here), or the path of the user's
    file, which ORT reads without it being serialized again. ``settings``: the
    provider, the optimization level and the optimizers disabled.

    ``graph_only``: a session made only for the optimized graph it writes, never run:
    its weights are not prepacked for the kernels (most of a session's making on a
    transformer; the graph ORT writes is the same, which the capture check confirms).

    ``optimized_path``: where ORT writes the graph it optimized, for its structure
    only: the weights go to a file beside it (so that models over 2 GB can be
    written), which is a link to the null device where links can be made.

    ``profile``: the session profiles its runs into that folder, to tell which
    provider ran each kernel (:mod:`bisect_onnx.runtime.onnxruntime.placement`).
    """
    import onnxruntime as ort

    emit(SESSION_STARTED, label)
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel,
                                               OPT_LEVELS[settings.opt_level])
    # ORT logs to stderr on its own (colour codes and all); its errors reach us as
    # exceptions, which become one-line messages, so only fatal logs get through.
    options.log_severity_level = 4
    if not settings.spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile is not None:
        profile.enable(options)
    if graph_only:
        options.add_session_config_entry("session.disable_prepacking", "1")
    # The model is handed over in memory: tell ORT where the external weights are.
    options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                     str(model_dir))
    if optimized_path is not None:
        options.optimized_model_filepath = str(optimized_path)
        weights = optimized_path.with_name(f"{optimized_path.name}.data")
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", weights.name)
        # Every weight, small ones too (ORT inlines those under 1 KB by default).
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "0")
        # The optimized graph is read without its weights: for a 4 GB model that is a
        # 4 GB write per session saved. Where no link can be made (Windows without the
        # privilege), ORT writes the file as usual.
        with contextlib.suppress(OSError):
            os.symlink(os.devnull, weights)
    try:
        source = str(serialized) if isinstance(serialized, Path) else serialized
        with made_in_heap():  # a large model's: its pages reused (runtime/heap.py)
            session = ort.InferenceSession(source, options, providers=[settings.provider],
                                           disabled_optimizers=list(settings.disabled_optimizers)
                                           or None)
    except Exception as error:
        raise ModelError(f"ONNX Runtime could not load {label}: {one_line(error)}") from error
    emit(SESSION_CREATED, label)
    return session


# ONNX Runtime's words for the node a run stopped at, and what its reason starts with:
# the C++ source line and function that raised it.
_REFUSED_AT = re.compile(r"running (?P<op>[\w.]+) node\. Name:'(?P<node>[^']*)'"
                         r"(?: Status Message: (?P<reason>.*))?", re.DOTALL)
_CPP_PREFIX = re.compile(r"^(?:\S+\.(?:h|cc|cpp):\d+\s+)?(?:[\w:<>*& ]+?\s)?"
                         r"(?:onnxruntime::)[\w:~<>]+\([^)]*\)\s*(?:const\s*)?")


def refusal(what: str, error: BaseException) -> RuntimeRefused:
    """``error`` from a session's run as the error to raise, naming the node it stopped at.

    ``what``: ``ONNX Runtime failed to run model.onnx``; the runtime's reason follows.
    """
    found = _REFUSED_AT.search(str(error))
    if found is None:
        return RuntimeRefused(f"{what}: {one_line(error)}", reason=one_line(error))
    own = " ".join((found["reason"] or "").split())
    own = _CPP_PREFIX.sub("", re.sub(r"^\S+\.(?:h|cc|cpp):\d+\s+", "", own))
    return RuntimeRefused(f"{what}: {one_line(error)}", node=found["node"],
                          op_type=found["op"], reason=own[:_REASON_CHARS] or one_line(error))


_REASON_CHARS = 240
