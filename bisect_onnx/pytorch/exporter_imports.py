"""The exporter's translations imported in a thread while the runtime prepares its capture.

A divergence in a file exported elsewhere is looked into with the exporter's own
translations (:mod:`bisect_onnx.search.translation_eval`): onnxscript and its torch_lib
take 1.3 s to import on two cores (onnx_ir brings sympy). ONNX Runtime's making of its
sessions runs mostly in C++ on one core, without the GIL: for a model whose weights take
it long enough, the import is done meanwhile. For a small model it is not: on ResNet-50
(97 MiB) it cost a run at parity 0.5 s, so there it is paid where a divergence needs it.
OpenVINO's compilations take every core, but they leave the GIL and a core's share
free often enough: beside them the import is started only once production's outputs
diverge (the pipeline decides, ``wanted``).

The thread is joined when the block it accompanies ends, so that no other import of
the process ever runs beside it: torch's exporter modules import one another in cycles,
and two threads importing them at once could each wait for the other.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from bisect_onnx.graph.walk import graph_tensors
from bisect_onnx.graph.weights import weight_bytes
from bisect_onnx.pytorch.private_apis import preload_translations

if TYPE_CHECKING:
    import onnx

__all__ = ["HIDDEN_FROM", "imported_meanwhile"]

#: Weights from which ONNX Runtime's sessions take longer to make than the import:
#: BERT-base's 418 MiB took 2 to 3 s in a fresh process, ResNet-50's 97 MiB about 1 s.
HIDDEN_FROM = 256 << 20
_TORCHLIB = "onnxscript.function_libs.torch_lib.ops"


@contextlib.contextmanager
def imported_meanwhile(model: onnx.ModelProto, *, wanted: bool) -> Iterator[None]:
    """Import the translations in a thread while the block runs, where it hides them.

    ``wanted``: the run may look inside a culprit's op with them; ``model``: the ONNX
    model whose sessions the block makes (its weights say whether they outlast it).
    """
    if (not wanted or _TORCHLIB in sys.modules
            or weight_bytes(graph_tensors(model.graph)) < HIDDEN_FROM):
        yield
        return
    thread = threading.Thread(target=preload_translations, name="bisect-onnx-exporter-imports",
                              daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()

