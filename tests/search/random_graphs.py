"""Random value graphs with branches, skip connections and shape subgraphs, and a fake
checker where error enters at one node and reaches only what is computed from it."""

from __future__ import annotations

import random
from dataclasses import dataclass

from bisect_onnx.search.value_graph import ValueGraph


@dataclass
class RandomCase:
    graph: ValueGraph
    nodes: list[tuple[str, list[str], list[str]]]
    checkpoints: list[str]
    culprit: str
    fails: dict[str, bool]
    uncomparable: set[str]
    outputs: list[str]

    @property
    def failing_outputs(self) -> list[str]:
        return [name for name in self.outputs if self.fails[name]]

    def probe(self, log: list[list[str]] | None = None):
        def probe(names):
            if log is not None:
                log.append(list(names))
            return {name: None if name in self.uncomparable else self.fails[name]
                    for name in names}
        return probe


def random_nodes(rng: random.Random, size: int) -> tuple[list, list[str]]:
    """``(op, inputs, outputs)`` in graph order, and the graph inputs."""
    inputs = [f"input{index}" for index in range(rng.choice((1, 1, 2)))]
    data = list(inputs)  # values on the data path so far
    shapes: list[str] = []  # shape arithmetic (from Shape, or constants)
    nodes = []
    for index in range(size):
        name = f"v{index}"
        kind = rng.random()
        if kind < 0.08:  # a shape computation starts
            nodes.append(("Shape", [rng.choice(data)], [name]))
            shapes.append(name)
        elif kind < 0.14 and shapes:  # shape arithmetic, float or not: never data
            nodes.append(("Sqrt", [rng.choice(shapes)], [name]))
            shapes.append(name)
        elif kind < 0.18:  # a constant
            nodes.append(("Constant", [], [name]))
            shapes.append(name)
        else:
            recent = data[-1] if rng.random() < 0.6 else rng.choice(data[-4:])
            read = [recent]
            if rng.random() < 0.35:  # a skip connection or the join of two branches
                read.append(rng.choice(data))
            if shapes and rng.random() < 0.2:  # a Reshape by a computed shape
                read.append(rng.choice(shapes))
            if rng.random() < 0.1:
                outputs = [name, f"{name}_b"]  # a node with two outputs (Split)
            else:
                outputs = [name]
            nodes.append(("Op", read, outputs))
            data.extend(outputs)
    return nodes, inputs


def random_case(seed: int, *, size: int | None = None) -> RandomCase | None:
    """One graph, one culprit, and what fails; ``None`` where no output fails."""
    rng = random.Random(seed)
    nodes, inputs = random_nodes(rng, size or rng.randint(4, 60))
    graph = ValueGraph.from_nodes(nodes, inputs)
    computed = [name for name in graph.parents if name not in inputs]
    if not computed:
        return None
    read = {parent for parents in graph.parents.values() for parent in parents}
    outputs = [name for name in computed if name not in read]
    culprit = rng.choice(computed)
    # Values without a reference (not aligned) and values that cannot be compared.
    unreferenced = {name for name in computed if name != culprit and rng.random() < 0.15}
    checkpoints = [name for name in computed if name not in unreferenced]
    uncomparable = {name for name in checkpoints if name != culprit and rng.random() < 0.05}
    fails: dict[str, bool] = {}
    for name, parents in graph.parents.items():
        inherited = any(fails[parent] for parent in parents)
        masked = rng.random() < 0.2  # a descendant may hide the error (a ReLU, a max)
        fails[name] = name == culprit or (inherited and not masked)
    case = RandomCase(graph, nodes, checkpoints, culprit, fails, uncomparable, outputs)
    return case if case.failing_outputs else None
