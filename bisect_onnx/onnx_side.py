"""The ONNX Runtime candidate side: promote every node output, run one session.

The model the user gave is read without its external data and never written to.
A promoted copy (every top-level node output appended as a graph output) is handed
to ONNX Runtime as bytes, with the user's folder named as the place to find external
weights, so nothing lands next to the user's model.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_onnx.errors import InputError, ModelError, one_line
from bisect_onnx.events import SESSION_CREATED, SESSION_STARTED, emit
from bisect_onnx.provenance import Provenance, TorchMetadata, read_torch_metadata
from bisect_onnx.sides import Capture, CapturedValue

if TYPE_CHECKING:
    import onnx

__all__ = ["InputSpec", "NodeInfo", "OnnxRuntimeSide", "load_onnx_model", "create_session"]

logger = logging.getLogger(__name__)

CPU_PROVIDER = "CPUExecutionProvider"
# ONNX Runtime's own default level; the candidate runs as production would.
DEFAULT_OPT_LEVEL = "all"
OPT_LEVELS = {"disabled": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
               "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


@dataclass(frozen=True)
class InputSpec:
    """One graph input: name, numpy dtype, and dimensions (``None`` or a name when free)."""

    name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...] | None

    def __str__(self) -> str:
        if self.shape is None:
            return f"{self.name}: {self.dtype}[?]"
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"


@dataclass(frozen=True)
class NodeInfo:
    """One top-level ONNX node with the torch exporter's metadata, if any."""

    index: int
    name: str
    op_type: str
    outputs: tuple[str, ...]
    torch: TorchMetadata | None
    inputs: tuple[str, ...] = ()


def load_onnx_model(path: Path) -> onnx.ModelProto:
    """Read an ONNX file's graph (not its external weights), with a clear error if it is not one."""
    import onnx

    if not path.exists():
        raise InputError(f"ONNX file {path} does not exist; check the --onnx path")
    if path.is_dir():
        raise InputError(f"--onnx {path} is a folder; pass the .onnx file inside it")
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as error:  # protobuf raises DecodeError, others for truncation
        raise InputError(
            f"{path} is not a readable ONNX model ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else 'parse failed'}); "
            "pass the .onnx file that torch.onnx.export wrote"
        ) from error


class OnnxRuntimeSide:
    """Runs an ONNX model in ONNX Runtime with every intermediate value promoted to an output."""

    def __init__(
        self,
        path: Path,
        *,
        provider: str = CPU_PROVIDER,
        opt_level: str = DEFAULT_OPT_LEVEL,
    ) -> None:
        self.path = Path(path)
        self.provider = provider
        self.opt_level = opt_level
        self.model = load_onnx_model(self.path)
        graph = self.model.graph
        initializers = {init.name for init in graph.initializer}
        self.inputs = [
            _input_spec(value) for value in graph.input if value.name not in initializers
        ]
        self.nodes = [
            NodeInfo(
                index=index,
                name=node.name or f"{node.op_type}_{index}",
                op_type=node.op_type,
                outputs=tuple(node.output),
                torch=read_torch_metadata({p.key: p.value for p in node.metadata_props}),
                inputs=tuple(node.input),
            )
            for index, node in enumerate(graph.node)
        ]
        self.output_names = [value.name for value in graph.output]
        self._promoted_session: Any = None

    @property
    def opset(self) -> int | None:
        """The default-domain opset the model was exported with."""
        for entry in self.model.opset_import:
            if entry.domain in ("", "ai.onnx"):
                return entry.version
        return None

    def describe(self) -> dict[str, Any]:
        """What this side is, for the report."""
        return {
            "kind": "onnxruntime",
            "model": str(self.path),
            "producer": f"{self.model.producer_name} {self.model.producer_version}".strip(),
            "graph": self.model.graph.name,
            "nodes": len(self.nodes),
            "provider": self.provider,
            "opt_level": self.opt_level,
        }

    def run_outputs(self, inputs: Sequence[np.ndarray]) -> list[CapturedValue]:
        """One plain session (nothing promoted) and one run: the final outputs only."""
        session = self._session(self.model.SerializeToString())
        arrays = self._run(session, [value.name for value in session.get_outputs()], inputs)
        return [CapturedValue(name, np.asarray(array), Provenance(position=index))
                for index, (name, array) in enumerate(zip(self.output_names, arrays,
                                                          strict=True))]

    def run(self, inputs: Sequence[np.ndarray], *, keywords: Sequence[str] = ()) -> Capture:
        """One session, one run, every top-level node output fetched.

        Inputs feed the graph's inputs in order, keyword or not: an export names and
        orders its inputs as the model was called.
        """
        # One promoted session serves every run (several random samples, say).
        if self._promoted_session is None:
            self._promoted_session = self._session(self._promoted_bytes())
        session = self._promoted_session
        fetched = [output.name for output in session.get_outputs()]
        by_name = dict(zip(fetched, self._run(session, fetched, inputs), strict=True))
        logger.info("ONNX Runtime produced %d values", len(by_name))
        return self._capture(by_name)

    def _session(self, serialized: bytes) -> Any:
        return create_session(serialized, model_dir=self.path.resolve().parent,
                              label=self.path.name, provider=self.provider,
                              opt_level=self.opt_level)

    def _run(self, session: Any, fetched: list[str], inputs: Sequence[np.ndarray]) -> list:
        feeds = {spec.name: array for spec, array in zip(self.inputs, inputs, strict=True)}
        try:
            return session.run(fetched, feeds)
        except Exception as error:
            raise ModelError(f"ONNX Runtime failed to run {self.path.name}: {one_line(error)}") \
                from error

    def _capture(self, by_name: dict[str, Any]) -> Capture:
        values: dict[str, CapturedValue] = {}
        producers: dict[str, NodeInfo] = {}
        for node in self.nodes:
            for output in node.outputs:
                if output in by_name and output not in values:
                    producers[output] = node
                    values[output] = CapturedValue(
                        output, np.asarray(by_name[output]), _provenance(node, len(values))
                    )
        outputs = [
            CapturedValue(
                name,
                np.asarray(by_name[name]),
                _provenance(producers[name], index) if name in producers
                else Provenance(position=index),
            )
            for index, name in enumerate(self.output_names)
        ]
        return Capture(values=values, outputs=outputs)

    def _promoted_bytes(self) -> bytes:
        """The model serialized with every top-level node output also a graph output.

        The outputs are appended to the loaded model only for the serialization, not
        to a copy: a copy would hold every inline weight a second time. Plain protos
        rather than onnx-graphsurgeon: its exporter wants typed outputs and would pull
        every external weight into memory, while ORT is content with untyped
        ``ValueInfoProto`` outputs.
        """
        import onnx

        outputs = self.model.graph.output
        original = len(outputs)
        present = {value.name for value in outputs}
        present.update(value.name for value in self.model.graph.input)
        try:
            for node in self.model.graph.node:
                if node.op_type == "Constant":  # a constant cannot diverge
                    continue
                for output in node.output:
                    if output and output not in present:
                        outputs.append(onnx.ValueInfoProto(name=output))
                        present.add(output)
            return self.model.SerializeToString()
        finally:
            del outputs[original:]


def create_session(serialized: bytes, *, model_dir: Path, label: str,
                   provider: str = CPU_PROVIDER, opt_level: str = DEFAULT_OPT_LEVEL) -> Any:
    """An ORT session on a model held in memory whose external weights lie in ``model_dir``."""
    import onnxruntime as ort

    emit(SESSION_STARTED, label)
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPT_LEVELS[opt_level])
    # ORT logs to stderr on its own (colour codes and all); its errors reach us as
    # exceptions, which become one-line messages, so only fatal logs get through.
    options.log_severity_level = 4
    # The model is handed over in memory: tell ORT where the external weights are.
    options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                     str(model_dir))
    try:
        session = ort.InferenceSession(serialized, options, providers=[provider])
    except Exception as error:
        raise ModelError(f"ONNX Runtime could not load {label}: {one_line(error)}") from error
    emit(SESSION_CREATED, label)
    return session


def _provenance(node: NodeInfo, position: int) -> Provenance:
    meta = node.torch
    return Provenance(
        position=position,
        module=meta.scopes[-1] if meta and meta.scopes else None,
        node=node.name,
        node_op=node.op_type,
        torch_op=meta.torch_op if meta else None,
        source=meta.source if meta else None,
    )


def _input_spec(value: onnx.ValueInfoProto) -> InputSpec:
    import onnx

    tensor_type = value.type.tensor_type
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
    if not tensor_type.HasField("shape"):
        return InputSpec(value.name, dtype, None)
    dims: list[int | str | None] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(dim.dim_value)
        else:
            dims.append(dim.dim_param or None)
    return InputSpec(value.name, dtype, tuple(dims))
