"""Op-level alignment figures: coverage on every architecture, and planted edits found.

Usage (from the repo root; several minutes at full size on 2 cores)::

    python benchmarks/op_alignment.py                # full-size architectures
    python benchmarks/op_alignment.py --size small   # the small test variants

For each architecture of ``fixtures/architectures.py`` the model is exported here
with the dynamo exporter (opset 18) and bisected at op level, which gives the coverage:

- ONNX nodes attributed to the torch op (and module) they came from (metadata, or the
  FX name the exporter's optimizer named a rebuilt node's outputs after);
- floating-point ONNX values named after an FX op that were compared, and torch ops
  compared, fused and left out.

Then one edit near the tolerance is planted in the middle of the graph (an initializer
of one node scaled, a private copy so no other node sees it; the smallest scale of
``FACTORS`` that makes a final output fail) and the planted file is bisected as a user's
file would be: the report must name the planted node.
The edits cover a Conv, the MatMul of a Linear (whose bias Add carries the op's name),
and a node inside a GELU made of several ONNX nodes: ``nn.GELU`` in ViT, and in GPT-2
``F.gelu`` called inside the MLP's forward, with no module of its own.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the planted edits the tests use

# The smallest of these scales that makes a final output fail is planted: an edit
# near the tolerance that still changes the verdict.
FACTORS = (1.003, 1.01, 1.03, 1.1, 1.3)
# Opset 18, as the fixtures: from opset 20 the exporter writes GELU as one Gelu node.
OPSET = 18


def _segments(model) -> dict[str, list]:
    from bisect_onnx.graph.provenance import read_torch_metadata

    segments: dict[str, list] = {}
    for node in model.graph.node:
        meta = read_torch_metadata({p.key: p.value for p in node.metadata_props})
        if meta and meta.fx_node:
            segments.setdefault(meta.fx_node, []).append((node, meta))
    return segments


def _middle(candidates: list) -> tuple:
    if not candidates:
        raise LookupError("no node of the wanted kind")
    return candidates[len(candidates) // 2]


def conv(model) -> tuple:
    """A Conv in the middle, its weight."""
    return _middle([(node, 1) for node in model.graph.node if node.op_type == "Conv"])


def linear_matmul(model) -> tuple:
    """The MatMul of a Linear (MatMul then bias Add) in the middle, its weight."""
    return _middle([(nodes[0][0], 1) for nodes in _segments(model).values()
                    if [n.op_type for n, _ in nodes] == ["MatMul", "Add"]
                    and nodes[0][1].torch_op == "aten.linear.default"])


def gelu_inner(model) -> tuple:
    """The first node with a constant input inside a GELU segment in the middle."""
    initializers = {init.name for init in model.graph.initializer}
    chosen = []
    for nodes in _segments(model).values():
        if len(nodes) < 3 or nodes[0][1].torch_op != "aten.gelu.default":
            continue
        for node, _ in nodes:
            constant = [i for i, name in enumerate(node.input) if name in initializers]
            if constant and node.op_type in ("Div", "Mul"):
                chosen.append((node, constant[0]))
                break
    return _middle(chosen)


PLANTS: dict[str, tuple[str, Callable]] = {
    "resnet50": ("Conv weight", conv),
    "bert_base": ("MatMul of a Linear", linear_matmul),
    "vit": ("inside nn.GELU", gelu_inner),
    "gpt2": ("inside F.gelu in the MLP", gelu_inner),
    "unet": ("Conv weight", conv),
}


def plant_scaled(source: Path, target: Path, choose: Callable, factor: float) -> str:
    """Scale one node's initializer input (a private copy); return the node's name."""
    import onnx
    from planting import plant, scale_initializer_input

    node, index = choose(onnx.load(str(source), load_external_data=False))
    return plant(source, target, scale_initializer_input(node.name, index, factor))[0]


def measure(name: str, size: str) -> dict:
    """Coverage of a clean export, then the planted edit's report."""
    import bisect_onnx
    from fixtures.architectures import ARCHITECTURES

    architecture = ARCHITECTURES[name]
    model, inputs = architecture.factory(size), architecture.make_inputs(size)
    with tempfile.TemporaryDirectory() as folder:
        exported = Path(folder) / "model.onnx"
        started = time.perf_counter()
        clean = bisect_onnx.bisect(model, inputs,
                                   export=bisect_onnx.ExportOptions(opset=OPSET, save_to=exported))
        clean_seconds = time.perf_counter() - started
        what, choose = PLANTS[name]
        for factor in FACTORS:
            planted_node = plant_scaled(exported, Path(folder) / "planted.onnx", choose, factor)
            started = time.perf_counter()
            planted = bisect_onnx.bisect(model, inputs,
                                         onnx_model=Path(folder) / "planted.onnx")
            planted_seconds = time.perf_counter() - started
            if planted.diverged:
                break
    coverage = clean.coverage
    # The culprit when one was found; else the first divergence; on a parity verdict
    # (the edit did not reach the outputs at any scale) the first hidden divergence.
    first = planted.culprit or planted.first_divergence or next(
        iter(planted.hidden_divergences), None)
    return {
        "name": name, "verdict": clean.verdict, "coverage": coverage,
        "clean_seconds": clean_seconds, "what": what, "planted": planted_node,
        "reported": first.onnx_node if first else None,
        "reported_op": f"{first.torch_op} in {first.torch_module}" if first else "",
        "rel": first.figures.max_rel_error if first else None,
        "granularity": planted.coverage.granularity, "planted_seconds": planted_seconds,
        "factor": factor, "planted_verdict": planted.verdict,
        "classification": first.local.classification if first else None,
    }


def _percent(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def main() -> None:
    """Print the coverage table and the planted-edit table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("full", "small"), default="full")
    parser.add_argument("--only", action="append", choices=sorted(PLANTS))
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    rows = [measure(name, args.size) for name in args.only or PLANTS]

    print(f"\n#### Op-level coverage ({args.size} size, dynamo export made by bisect-onnx)\n")
    print("| architecture | ONNX nodes attributed | FX-named float values compared | "
          "torch ops compared | fused | verdict | seconds |")
    print("|---|---:|---:|---:|---:|---|---:|")
    for row in rows:
        c = row["coverage"]
        print(f"| {row['name']} | {c.attributed_nodes}/{c.onnx_nodes} "
              f"({_percent(c.attributed_nodes, c.onnx_nodes)}) | "
              f"{c.fx_named_compared}/{c.fx_named_values} "
              f"({_percent(c.fx_named_compared, c.fx_named_values)}) | "
              f"{c.compared_ops}/{c.torch_ops} | {c.fused_ops} | {row['verdict']} | "
              f"{row['clean_seconds']:.1f} |")
    print("\n#### Planted edits (one initializer scaled, mid-graph)\n")
    print("| architecture | edit | scale | verdict | planted node | reported node | "
          "torch op, module | class | max rel | found | seconds |")
    print("|---|---|---:|---|---|---|---|---|---:|---|---:|")
    for row in rows:
        found = "yes" if row["reported"] == row["planted"] else "NO"
        rel = "-" if row["rel"] is None else f"{row['rel']:.2e}"
        print(f"| {row['name']} | {row['what']} | {row['factor']} | {row['planted_verdict']} | "
              f"{row['planted']} | {row['reported']} | {row['reported_op']} | "
              f"{row['classification']} | {rel} | {found} | {row['planted_seconds']:.1f} |")


if __name__ == "__main__":
    main()
