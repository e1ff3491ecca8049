r"""A generated corpus: random small models, planted single-node bugs, culprits scored.

Usage (from the repo root; needs the ``corpus`` extra, onnxslim and onnxsim)::

    python benchmarks/corpus.py --models 40 --seed 0 --plants-per-model 3 \\
        --time-limit 20 --out corpus.json

Each model comes from the grammar of ``benchmarks/corpus_grammar.py`` (seed ``S + i``
for model ``i``) and is exported with both exporters (opset 18). A model that does
not export, or whose clean export is not at parity in ONNX Runtime, is discarded
(counted by reason). On each kept export ``--plants-per-model`` single-node plants
are drawn, cycling through three kinds:

- ``weight``: one float initializer of one compute node scaled (a private copy);
- ``attribute``: one attribute changed (a Softmax axis, an epsilon times 1e4, Gemm's
  alpha, a pool's ``count_include_pad``, ...), the graph kept valid;
- ``inserted``: a ``Mul`` by 1.5 inserted after one node, its consumers rewired (the
  inserted node has no counterpart in the clean export).

A plant is kept only if it changes a final output beyond the default tolerance. Each
planted file is then bisected twice: against the PyTorch model (``bisect``) and
against the clean export (``bisect_onnx_models``). A case is *exact* when the culprit
is the planted node (for an inserted node, the inserted node itself), *near* when no
culprit is named but a culprit segment holds the planted node, or the culprit is the
planted node's producer or consumer, and *wrong* otherwise (another node, no
divergence, an error). Every miss is listed with a cause read off the report.

Last, every clean export is simplified by onnxslim and by onnxsim and compared with
itself (``bisect_onnx_models(original, simplified)``): the expected answer is parity
with no hidden divergence and no culprit.

``--time-limit`` stops drawing new models once that many minutes have passed; what
was done is reported. The JSON file holds every case; ``--from-json FILE`` prints a
saved run's tables again.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import random
import re
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the planted edits the tests use
sys.path.insert(0, str(REPO / "benchmarks"))

import bisect_onnx  # noqa: E402
from bisect_onnx.judge.compare import DEFAULT_ATOL, DEFAULT_RTOL, compare_arrays  # noqa: E402

EXPORTERS = ("dynamo", "torchscript")
FORMS = ("pytorch", "onnx-vs-onnx")
PLANT_KINDS = ("weight", "attribute", "inserted")
#: The planted file's runtime (``--runtime``): ``None`` is ONNX Runtime's CPU provider;
#: OpenVINO runs in f32, where the clean exports are at parity (its CPU's bf16 is not).
RUNTIME: bisect_onnx.RuntimeOptions | None = None
# Opset 18, as the fixtures: both exporters write it, and GroupNormalization exists.
OPSET = 18
# Scales tried for a weight plant, smallest first: the first that changes a final
# output beyond tolerance is kept (a plant near the tolerance, where it is hard).
WEIGHT_SCALES = (1.05, 1.5, -1.0)
INSERTED_FACTOR = 1.5
# Nodes whose outputs are shapes, indices or constants: no plant there says anything
# about numerics, and most would only break the graph.
NOT_COMPUTE = {"Constant", "Shape", "Size", "ConstantOfShape", "Range", "Cast", "CastLike",
               "Reshape", "Squeeze", "Unsqueeze", "Identity", "Gather", "Slice", "Concat",
               "Expand", "Transpose", "Split", "Flatten", "Equal", "Less", "Greater",
               "GreaterOrEqual", "LessOrEqual", "Not", "And", "Or", "IsNaN", "IsInf",
               "ArgMax", "ArgMin", "Floor", "Ceil", "Round", "Mod", "BitShift", "Where"}


# -- exporting and running ------------------------------------------------------------

def export(model, x, exporter: str, path: Path) -> None:
    """Export with ``exporter`` to ``path``, the exporter's chatter swallowed."""
    import torch

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        torch.onnx.export(model, (x,), str(path), dynamo=exporter == "dynamo",
                          opset_version=OPSET)


def run_onnx(model: onnx.ModelProto | Path, x: np.ndarray) -> list[np.ndarray]:
    """The final outputs in ONNX Runtime (default optimization level, CPU)."""
    import onnxruntime as ort

    source = model if isinstance(model, Path) else model.SerializeToString()
    options = ort.SessionOptions()
    options.log_severity_level = 3  # no warnings about unused initializers
    session = ort.InferenceSession(str(source) if isinstance(source, Path) else source,
                                   options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})


def outputs_differ(expected: list[np.ndarray], got: list[np.ndarray]) -> bool:
    """Whether any output is out of the default tolerance, as bisect-onnx judges it."""
    return not all(compare_arrays(a, b, rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL).passed
                   for a, b in zip(expected, got, strict=True))


# -- plants --------------------------------------------------------------------------

@dataclass
class Plant:
    """One planted edit: its kind, the node the culprit must be, what was done."""

    kind: str
    node: str
    op_type: str
    edit: str
    model: onnx.ModelProto = field(repr=False)


def _value_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of each value name, after shape inference."""
    inferred = onnx.shape_inference.infer_shapes(model)
    graph = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type
             for v in [*graph.value_info, *graph.input, *graph.output]}
    types.update({i.name: i.data_type for i in graph.initializer})
    return types


def _compute_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Nodes with a float output that do arithmetic (not shapes, indices, layout)."""
    types = _value_types(model)
    return [node for node in model.graph.node
            if node.op_type not in NOT_COMPUTE and node.domain in ("", "ai.onnx")
            and node.output and types.get(node.output[0]) == onnx.TensorProto.FLOAT]


def plant_weight(model: onnx.ModelProto, rng: random.Random) -> list[Plant]:
    """Candidates: each float initializer input of a compute node, scaled (a private copy)."""
    from planting import scale_initializer_input

    floats = {i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
    choices = [(node.name, index) for node in _compute_nodes(model)
               for index, name in enumerate(node.input) if name in floats]
    rng.shuffle(choices)
    plants = []
    for name, index in choices[:4]:
        for scale in WEIGHT_SCALES:
            edited = onnx.ModelProto()
            edited.CopyFrom(model)
            node = scale_initializer_input(name, index, scale)(edited)
            plants.append(Plant("weight", node.name, node.op_type,
                                f"input {index} ({node.input[index]}) x {scale}", edited))
    return plants


def _attribute_edits(node: onnx.NodeProto, rank: int | None) -> list[tuple[str, object]]:
    """Valid attribute changes of ``node`` that can change its output."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    op = node.op_type
    if op in ("Softmax", "LogSoftmax") and rank:
        axis = attrs.get("axis", -1) % rank
        return [("axis", other) for other in range(1, rank) if other != axis]
    if op in ("LayerNormalization", "BatchNormalization", "InstanceNormalization",
              "GroupNormalization"):
        return [("epsilon", float(attrs.get("epsilon", 1e-5)) * 1e4)]
    if op == "Gemm":
        return [("alpha", float(attrs.get("alpha", 1.0)) * 1.5)]
    if op in ("LeakyRelu", "Elu", "Celu", "HardSigmoid"):
        return [("alpha", float(attrs.get("alpha", 0.2)) * 2.0)]
    if op == "CumSum":
        return [("exclusive", 1 - int(attrs.get("exclusive", 0))),
                ("reverse", 1 - int(attrs.get("reverse", 0)))]
    if op == "AveragePool" and any(attrs.get("pads", [])):
        return [("count_include_pad", 1 - int(attrs.get("count_include_pad", 0)))]
    if op == "Trilu":
        return [("upper", 1 - int(attrs.get("upper", 1)))]
    if op == "TopK":
        return [("largest", 1 - int(attrs.get("largest", 1)))]
    if op in ("Conv", "MaxPool") and _dilatable(attrs):
        # Dilation 2 with the padding doubled keeps a 3-wide window's output shape.
        return [("dilations", [2] * len(attrs["kernel_shape"]))]
    if op == "Pad":
        return [("mode", "edge" if attrs.get("mode", b"constant") == b"constant"
                 else "constant")]
    if op == "Mod":
        return [("fmod", 1 - int(attrs.get("fmod", 0)))]
    if op == "BitShift":
        return [("direction", "RIGHT" if attrs.get("direction") == b"LEFT" else "LEFT")]
    if op == "Gelu":
        return [("approximate", "none" if attrs.get("approximate", "none") == "tanh"
                 else "tanh")]
    return []


def _dilatable(attrs: dict) -> bool:
    """A 3-wide window, stride 1, padded by 1 on every side (``same`` output)."""
    kernel = list(attrs.get("kernel_shape", []))
    return (bool(kernel) and all(k == 3 for k in kernel)
            and all(p == 1 for p in attrs.get("pads", [0]))
            and all(s == 1 for s in attrs.get("strides", [1]))
            and all(d == 1 for d in attrs.get("dilations", [1])))


def _set_attribute(node: onnx.NodeProto, name: str, value: object) -> None:
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute(name, value)])


def plant_attribute(model: onnx.ModelProto, rng: random.Random) -> list[Plant]:
    """Candidates: each valid attribute change of each node that has one."""
    inferred = onnx.shape_inference.infer_shapes(model).graph
    ranks = {v.name: len(v.type.tensor_type.shape.dim)
             for v in [*inferred.value_info, *inferred.input, *inferred.output]}
    choices = [(index, name, value) for index, node in enumerate(model.graph.node)
               if node.input
               for name, value in _attribute_edits(node, ranks.get(node.input[0]))]
    rng.shuffle(choices)
    plants = []
    for index, name, value in choices[:12]:
        edited = onnx.ModelProto()
        edited.CopyFrom(model)
        node = edited.graph.node[index]
        _set_attribute(node, name, value)
        if name == "dilations":  # and the padding that keeps the output shape
            _set_attribute(node, "pads", [2] * 2 * len(value))
        plants.append(Plant("attribute", node.name, node.op_type, f"{name} = {value}", edited))
    return plants


def plant_inserted(model: onnx.ModelProto, rng: random.Random) -> list[Plant]:
    """Candidates: a ``Mul`` by ``INSERTED_FACTOR`` after a compute node's first output."""
    graph_outputs = {o.name for o in model.graph.output}
    choices = [n.name for n in _compute_nodes(model) if n.output[0] not in graph_outputs]
    rng.shuffle(choices)
    plants = []
    for name in choices[:4]:
        edited = onnx.ModelProto()
        edited.CopyFrom(model)
        node = next(n for n in edited.graph.node if n.name == name)
        value, planted = node.output[0], f"{node.output[0]}_planted"
        for consumer in edited.graph.node:
            for i, used in enumerate(consumer.input):
                if used == value:
                    consumer.input[i] = planted
        factor = numpy_helper.from_array(np.array(INSERTED_FACTOR, np.float32),
                                         "planted_factor")
        edited.graph.initializer.append(factor)
        inserted = helper.make_node("Mul", [value, factor.name], [planted], name="planted_Mul")
        position = list(edited.graph.node).index(node) + 1
        edited.graph.node.insert(position, inserted)
        plants.append(Plant("inserted", inserted.name, "Mul",
                            f"Mul x {INSERTED_FACTOR} after {name} ({node.op_type})", edited))
    return plants


PLANTERS = {"weight": plant_weight, "attribute": plant_attribute, "inserted": plant_inserted}


def draw_plant(kind: str, model: onnx.ModelProto, x: np.ndarray, clean: list[np.ndarray],
               rng: random.Random, taken: set[str]) -> Plant | None:
    """The first candidate of ``kind`` that runs and changes a final output."""
    for plant in PLANTERS[kind](model, rng):
        if plant.node in taken and kind != "inserted":
            continue
        try:
            changed = outputs_differ(clean, run_onnx(plant.model, x))
        except Exception:  # noqa: BLE001 - an edit ONNX Runtime refuses is not a plant
            continue
        if changed:
            return plant
    return None


# -- scoring ---------------------------------------------------------------------------

@dataclass
class Case:
    """One planted file bisected one way."""

    seed: int
    exporter: str
    form: str
    kind: str
    planted: str
    planted_op: str
    edit: str
    blocks: list[str]
    score: str = "wrong"
    named: str | None = None
    cause: str = ""
    granularity: str | None = None
    seconds: float = 0.0


def _neighbours(model: onnx.ModelProto, name: str) -> set[str]:
    """The producers and consumers of node ``name``'s inputs and outputs."""
    node = next(n for n in model.graph.node if n.name == name)
    producers = {out: n.name for n in model.graph.node for out in n.output}
    near = {producers[i] for i in node.input if i in producers}
    near |= {n.name for n in model.graph.node if set(n.input) & set(node.output)}
    return near - {name}


def _before(model: onnx.ModelProto, first: str, second: str) -> bool:
    order = {n.name: i for i, n in enumerate(model.graph.node)}
    return order.get(first, -1) < order.get(second, -1)


def _segment_ops(model: onnx.ModelProto, names: list[str]) -> str:
    """``segment of 2: MatMul, Add``."""
    ops = {n.name: n.op_type for n in model.graph.node}
    return f"segment of {len(names)}: " + ", ".join(ops.get(name, "?") for name in names)


def _fast_path(case: Case) -> str:
    """A note when the model holds a module eager PyTorch runs on its fast path."""
    fast = any("EncoderLayer" in block or "Attention" in block for block in case.blocks)
    return "; fast-path attention in the model" if fast else ""


def score(case: Case, report, planted_model: onnx.ModelProto) -> None:
    """Fill in ``case.score``, ``named`` and ``cause`` from the report."""
    culprit = report.culprit
    segment = report.culprit_segment
    case.granularity = report.coverage.granularity
    case.named = culprit.onnx_node if culprit else None
    compared = any(r.onnx_node == case.planted for r in report.comparisons)
    where = f"{case.granularity} level" if case.form == "pytorch" else "onnx"
    if case.named == case.planted:
        case.score = "exact"
        return
    if not report.diverged:
        case.cause = "no divergence found (parity)"
        return
    neighbours = _neighbours(planted_model, case.planted)
    if culprit is None and segment is not None and case.planted in segment.nodes:
        case.score, case.cause = "near", f"segment not narrowed ({where})"
        case.named = _segment_ops(planted_model, segment.nodes)
        return
    if culprit is not None and case.named in neighbours:
        side = "consumer" if _before(planted_model, case.planted, case.named) else "producer"
        case.score, case.cause = "near", f"{side} named ({where})"
        return
    if culprit is None:
        first = report.first_divergence
        case.named = f"(first divergence {first.onnx_node})" if first else None
        case.cause = ("no culprit, a segment without the planted node" if segment
                      else "no culprit") + f" ({where})"
    elif case.named is None:
        # A PyTorch computation the graph has no node for (a Dropout in training mode):
        # named by its module, never before or after the planted node in the graph.
        case.named = f"no ONNX node: {culprit.torch_module} ({culprit.onnx_value})"
        case.cause = f"a computation with no ONNX node named ({where})"
    elif _before(planted_model, case.named, case.planted):
        case.cause = f"upstream node named ({where})"
    else:
        case.cause = f"downstream node named ({where})"
    if not compared:
        case.cause += "; planted node's value not compared"
    case.cause += _fast_path(case)


def bisect_case(case: Case, model, x: np.ndarray, clean_path: Path, planted_path: Path,
                planted_model: onnx.ModelProto) -> None:
    """Run one form's bisection on the planted file and score it."""
    started = time.perf_counter()
    try:
        if case.form == "pytorch":
            report = bisect_onnx.bisect(model, x, onnx_model=planted_path, runtime=RUNTIME)
        else:  # the clean file in ONNX Runtime, the planted one in RUNTIME
            report = bisect_onnx.bisect_onnx_models(clean_path, planted_path, [x],
                                                    candidate_runtime=RUNTIME)
    except Exception as error:  # noqa: BLE001 - a crash is a miss, recorded as such
        case.score = "wrong"
        case.cause = f"error: {type(error).__name__}: {error}"[:160] + _fast_path(case)
    else:
        score(case, report, planted_model)
    case.seconds = time.perf_counter() - started


@dataclass
class Simplified:
    """One clean export simplified and compared with itself."""

    seed: int
    exporter: str
    tool: str
    outcome: str
    """``parity`` (expected), ``claims`` (a culprit or hidden divergence at parity),
    ``diverged``, ``simplifier failed`` or ``error``."""
    detail: str = ""
    nodes: tuple[int, int] = (0, 0)
    seconds: float = 0.0


def simplify(tool: str, path: Path, target: Path) -> onnx.ModelProto:
    """``path`` simplified by onnxslim or onnxsim, saved to ``target``."""
    model = onnx.load(str(path))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        if tool == "onnxslim":
            import onnxslim

            simplified = onnxslim.slim(model)
        else:
            import onnxsim

            simplified, ok = onnxsim.simplify(model)
            if not ok:
                raise RuntimeError("onnxsim's own check failed")
    onnx.save(simplified, str(target))
    return simplified


def simplified_case(seed: int, exporter: str, tool: str, clean_path: Path, x: np.ndarray,
                    folder: Path) -> Simplified:
    """Simplify the clean export with ``tool`` and compare it with the original."""
    target = folder / f"{exporter}-{tool}.onnx"
    record = Simplified(seed, exporter, tool, "parity")
    try:
        simplified = simplify(tool, clean_path, target)
    except Exception as error:  # noqa: BLE001 - the simplifier's failure, not ours
        record.outcome, record.detail = "simplifier failed", f"{type(error).__name__}: {error}"
        record.detail = record.detail[:200]
        return record
    record.nodes = (len(onnx.load(str(clean_path)).graph.node), len(simplified.graph.node))
    started = time.perf_counter()
    try:
        report = bisect_onnx.bisect_onnx_models(clean_path, target, [x])
    except Exception as error:  # noqa: BLE001 - a crash is recorded
        record.outcome, record.detail = "error", f"{type(error).__name__}: {error}"[:200]
    else:
        if report.diverged:
            culprit = report.culprit
            record.outcome = "diverged"
            record.detail = f"culprit {culprit.onnx_node}" if culprit else "no culprit"
        elif report.hidden_divergences or report.culprit is not None:
            record.outcome = "claims"
            first = report.hidden_divergences[0] if report.hidden_divergences else None
            status = first.figures.status if first is not None else None
            record.detail = (f"{len(report.hidden_divergences)} hidden divergences, first "
                             f"{first.onnx_value} ({first.onnx_op}, "
                             f"{getattr(status, 'value', status)}: "
                             f"{first.shape} vs {first.candidate_shape})"
                             if report.hidden_divergences else
                             f"culprit {report.culprit.onnx_node}")
    record.seconds = time.perf_counter() - started
    return record


# -- the run ---------------------------------------------------------------------------

def plant_and_bisect(model, x: np.ndarray, clean_path: Path, clean: list[np.ndarray],
                     rng: random.Random, plants: int, *, seed: int, exporter: str,
                     blocks: list[str], discards: Counter, label: str) -> Iterator[Case]:
    """``plants`` plants drawn on a clean export, each bisected in both forms, scored.

    A kind with no plant that changes the output is counted in ``discards`` under
    ``label``; the planted files lie beside ``clean_path``.
    """
    clean_model = onnx.load(str(clean_path))
    taken: set[str] = set()
    for index in range(plants):
        kind = PLANT_KINDS[index % len(PLANT_KINDS)]
        plant = draw_plant(kind, clean_model, x, clean, rng, taken)
        if plant is None:
            discards[f"{label}: no {kind} plant changes the output"] += 1
            continue
        taken.add(plant.node)
        planted_path = clean_path.with_name(f"{clean_path.stem}-{index}.onnx")
        onnx.save(plant.model, str(planted_path))
        for form in FORMS:
            case = Case(seed, exporter, form, kind, plant.node, plant.op_type, plant.edit,
                        blocks)
            bisect_case(case, model, x, clean_path, planted_path, plant.model)
            yield case


def run_model(seed: int, plants: int, folder: Path, discards: Counter, kept: Counter,
              cases: list[Case], simplified: list[Simplified]) -> None:
    """Generate model ``seed``, export it both ways, plant, bisect, simplify."""
    import torch
    from corpus_grammar import generate

    model, tensor = generate(seed)
    x = tensor.numpy()
    with torch.no_grad():
        expected = [model(tensor).numpy()]
    if not np.all(np.isfinite(expected[0])):
        discards["non-finite output in PyTorch"] += 1
        return
    rng = random.Random(seed * 7919 + 1)
    for exporter in EXPORTERS:
        clean_path = folder / f"{seed}-{exporter}.onnx"
        try:
            export(model, tensor, exporter, clean_path)
            clean = run_onnx(clean_path, x)
        except Exception as error:  # noqa: BLE001 - a discard, counted by reason
            discards[f"{exporter}: {type(error).__name__}: {str(error).splitlines()[0][:90]}"] += 1
            continue
        if outputs_differ(expected, clean):
            discards[f"{exporter}: clean export not at parity"] += 1
            continue
        kept[exporter] += 1
        for case in plant_and_bisect(model, x, clean_path, clean, rng, plants, seed=seed,
                                     exporter=exporter, blocks=model.description,
                                     discards=discards, label=exporter):
            cases.append(case)
            logging.getLogger("corpus").info("%s %s %s %s: %s (%.1fs)", seed, exporter,
                                             case.form, case.kind, case.score, case.seconds)
        for tool in ("onnxslim", "onnxsim") if RUNTIME is None else ():  # ORT's parity
            simplified.append(simplified_case(seed, exporter, tool, clean_path, x, folder))


def _percent(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def _mean(values) -> str:
    values = list(values)
    return f"{sum(values) / len(values):.2f}" if values else "-"


def _cause_group(cause: str) -> str:
    """A miss's cause without the details that differ from case to case (input shapes)."""
    cause = re.sub(r"float32\[[0-9,]+\]", "float32[...]", cause)
    return re.sub(r" \(at least[^;]*", "", cause)


def summary(cases: list[Case], simplified: list[Simplified], discards: Counter) -> str:
    """Cases by form, exporter and kind; simplifiers; miss causes; discards."""
    lines = ["| form | exporter | plant | cases | exact | near | wrong | exact % | mean s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for form in FORMS:
        for exporter in EXPORTERS:
            for kind in (*PLANT_KINDS, "all"):
                chosen = [c for c in cases if c.form == form and c.exporter == exporter
                          and (kind == "all" or c.kind == kind)]
                counts = Counter(c.score for c in chosen)
                label = f"**{kind}**" if kind == "all" else kind
                lines.append(f"| {form} | {exporter} | {label} | {len(chosen)} | "
                             f"{counts['exact']} | {counts['near']} | {counts['wrong']} | "
                             f"{_percent(counts['exact'], len(chosen))} | "
                             f"{_mean(c.seconds for c in chosen)} |")
    lines += ["", "| simplifier | exporter | files | parity, nothing claimed | claims at parity "
              "| diverged | simplifier failed | error | nodes before → after |",
              "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for tool in ("onnxslim", "onnxsim"):
        for exporter in EXPORTERS:
            chosen = [s for s in simplified if s.tool == tool and s.exporter == exporter]
            outcomes = Counter(s.outcome for s in chosen)
            ran = [s for s in chosen if tuple(s.nodes) != (0, 0)]
            before, after = sum(s.nodes[0] for s in ran), sum(s.nodes[1] for s in ran)
            lines.append(f"| {tool} | {exporter} | {len(chosen)} | {outcomes['parity']} | "
                         f"{outcomes['claims']} | {outcomes['diverged']} | "
                         f"{outcomes['simplifier failed']} | {outcomes['error']} | "
                         f"{before} → {after} |")
    causes = Counter((c.form, c.exporter, c.kind, c.score, _cause_group(c.cause))
                     for c in cases if c.score != "exact")
    if causes:
        lines += ["", "| form | exporter | plant | score | miss cause | cases |",
                  "|---|---|---|---|---|---:|"]
        lines += [f"| {form} | {exporter} | {kind} | {score} | {cause} | {count} |"
                  for (form, exporter, kind, score, cause), count in sorted(
                      causes.items(), key=lambda item: (item[0][:3], -item[1]))]
    if discards:
        lines += ["", "| discarded | count |", "|---|---:|"]
        lines += [f"| {reason} | {count} |" for reason, count in discards.most_common()]
    return "\n".join(lines)


def every_miss(cases: list[Case], simplified: list[Simplified]) -> str:
    """Each missed case and each simplified file not at clean parity, one row each."""
    lines = ["| seed | exporter | form | plant | planted node | edit | named | score | cause |",
             "|---:|---|---|---|---|---|---|---|---|"]
    lines += [f"| {c.seed} | {c.exporter} | {c.form} | {c.kind} | {c.planted} "
              f"({c.planted_op}) | {c.edit} | {c.named} | {c.score} | {c.cause} |"
              for c in cases if c.score != "exact"]
    lines += ["", "| seed | exporter | simplifier | outcome | detail |", "|---:|---|---|---|---|"]
    lines += [f"| {s.seed} | {s.exporter} | {s.tool} | {s.outcome} | {s.detail} |"
              for s in simplified if s.outcome != "parity"]
    return "\n".join(lines)


def add_runtime_option(parser: argparse.ArgumentParser) -> None:
    """``--runtime``: where the planted files run (the simplifier rows need ONNX Runtime)."""
    parser.add_argument("--runtime", choices=("onnxruntime", "openvino"),
                        default="onnxruntime",
                        help="run the planted file in OpenVINO (f32) instead of ONNX "
                             "Runtime; the simplifier rows are then left out")


def use_runtime(name: str) -> None:
    """Set :data:`RUNTIME` from ``--runtime``."""
    global RUNTIME
    RUNTIME = (None if name == "onnxruntime" else
               bisect_onnx.RuntimeOptions(runtime=name, precision="f32"))


def main() -> None:
    """Generate, plant, bisect and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plants-per-model", type=int, default=3)
    parser.add_argument("--time-limit", type=float, default=20.0, metavar="MINUTES")
    parser.add_argument("--out", type=Path)
    parser.add_argument("-v", "--verbose", action="store_true", help="a line per case")
    add_runtime_option(parser)
    parser.add_argument("--from-json", type=Path, metavar="FILE",
                        help="print the tables of a run saved with --out; run nothing")
    args = parser.parse_args()
    use_runtime(args.runtime)
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        print_run(saved, [Case(**c) for c in saved["cases"]],
                  [Simplified(**s) for s in saved["simplified"]])
        return
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    if args.verbose:
        logging.disable(logging.NOTSET)
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        logging.getLogger("corpus").setLevel(logging.INFO)
        logging.getLogger("bisect_onnx").setLevel(logging.ERROR)
    import torch
    from corpus_grammar import vocabulary

    torch.backends.mha.set_fastpath_enabled(True)  # eager PyTorch as users run it
    started = time.perf_counter()
    cases: list[Case] = []
    simplified: list[Simplified] = []
    discards: Counter = Counter()
    kept: Counter = Counter()
    done = 0
    with tempfile.TemporaryDirectory() as folder:
        for seed in range(args.seed, args.seed + args.models):
            if time.perf_counter() - started > 60 * args.time_limit:
                break
            run_model(seed, args.plants_per_model, Path(folder), discards, kept, cases,
                      simplified)
            done += 1
    run = {"models": done, "asked": args.models, "first_seed": args.seed,
           "seconds": time.perf_counter() - started, "vocabulary": vocabulary(),
           "bisect_onnx": f"{bisect_onnx.__version__} from {Path(bisect_onnx.__file__).parent}",
           "kept": dict(kept), "discards": dict(discards)}
    print_run(run, cases, simplified)
    if args.out:
        args.out.write_text(json.dumps({**run, "cases": [asdict(c) for c in cases],
                                        "simplified": [asdict(s) for s in simplified]},
                                       indent=1))


def print_run(run: dict, cases: list[Case], simplified: list[Simplified]) -> None:
    """The run's header, its summary tables, then every miss."""
    kinds = run["vocabulary"]
    done, first = run["models"], run["first_seed"]
    print(f"grammar: {len(kinds)} ATen ops and module kinds "
          f"({sum(k.startswith('aten.') for k in kinds)} ATen ops)")
    print(f"models: {done} of {run['asked']} (seeds {first}..{first + done - 1}), "
          f"{len(cases)} cases, {run['seconds'] / 60:.1f} minutes, bisect-onnx "
          f"{run['bisect_onnx']}")
    print("clean exports kept (exported, at parity): "
          + ", ".join(f"{exporter} {run['kept'].get(exporter, 0)}" for exporter in EXPORTERS)
          + "\n")
    print(summary(cases, simplified, Counter(run["discards"])))
    print("\n#### Every miss\n")
    print(every_miss(cases, simplified))


if __name__ == "__main__":
    main()
