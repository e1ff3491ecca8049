"""The package's layout, read with ``ast`` (nothing is imported): sizes, privacy, no cycles.

Four rules keep the code base one a newcomer can read: no module over
:data:`MAX_MODULE_LINES` lines; no function over :data:`MAX_FUNCTION_LINES` lines (not
counting its docstring, which documents rather than does) unless its docstring says why
(it contains "one step" or "Long because"); no module imports another's private
(``_underscore``) name; and no import cycle among the package's modules, counting
imports inside functions but not those under ``if TYPE_CHECKING:``. Each check also
runs on a planted violation, so that a check that can no longer fail is noticed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "bisect_onnx"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent / PACKAGE

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
#: Words in a docstring that say why a function is long on purpose.
LONG_ON_PURPOSE = ("one step", "long because")


@dataclass(frozen=True)
class Module:
    """One source file of the package, parsed."""

    name: str
    """Dotted module name, ``bisect_onnx.align.ops``; a package is named by its folder."""
    path: Path
    """Relative to the folder above the package: ``bisect_onnx/align/ops.py``."""
    text: str
    tree: ast.Module

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


@dataclass(frozen=True)
class Import:
    """One import statement's target, as a module of the package, and the names it takes."""

    source: Module
    line: int
    target: str
    """The dotted name imported from (``from target import ...``) or imported."""
    names: tuple[str, ...]
    """The names a ``from`` import takes; empty for ``import target``."""


def read_package(root: Path, package: str = PACKAGE) -> dict[str, Module]:
    """Every ``.py`` file under ``root`` (the package folder), by module name."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        text = path.read_text(encoding="utf-8")
        name = ".".join(parts)
        shown = path.relative_to(root.parent)
        modules[name] = Module(name, shown, text, ast.parse(text, filename=str(shown)))
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``."""
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _run_time_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below ``node`` except the bodies of ``if TYPE_CHECKING:`` blocks."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:  # an ``else:`` branch does run
                yield other
                yield from _run_time_nodes(other)
            continue
        yield child
        yield from _run_time_nodes(child)


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    """The module a ``from`` import reads, relative imports resolved."""
    if not node.level:
        return node.module or ""
    parts = module.name.split(".")
    base = parts if module.is_package else parts[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports(module: Module, package: str = PACKAGE) -> Iterator[Import]:
    """The run-time imports of the package's own modules in ``module``, functions included."""
    for node in _run_time_nodes(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == package or alias.name.startswith(package + "."):
                    yield Import(module, node.lineno, alias.name, ())
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, node)
            if target == package or target.startswith(package + "."):
                yield Import(module, node.lineno, target,
                             tuple(alias.name for alias in node.names))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


# ---------------------------------------------------------------- the four checks


def long_modules(modules: dict[str, Module]) -> list[str]:
    """``path: N lines`` for each module over :data:`MAX_MODULE_LINES`."""
    return [f"{module.path}: {len(module.text.splitlines())} lines"
            for module in modules.values()
            if len(module.text.splitlines()) > MAX_MODULE_LINES]


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """How many lines the function's docstring takes (an API's Args section, say)."""
    first = node.body[0]
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        return first.end_lineno - first.lineno + 1
    return 0


def long_functions(modules: dict[str, Module]) -> list[str]:
    """``path:line name (N lines)`` for each long function whose docstring does not say why."""
    found = []
    for module in modules.values():
        for node in ast.walk(module.tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            length = node.end_lineno - node.lineno + 1 - _docstring_lines(node)
            docstring = (ast.get_docstring(node) or "").lower()
            if length > MAX_FUNCTION_LINES and not any(
                    words in docstring for words in LONG_ON_PURPOSE):
                found.append(f"{module.path}:{node.lineno} {node.name} ({length} lines)")
    return found


def private_imports(modules: dict[str, Module]) -> list[str]:
    """``path:line takes NAME from MODULE`` for each private name taken from another module."""
    found = []
    for module in modules.values():
        for item in imports(module):
            if item.target == module.name:
                continue
            taken = item.names or (item.target.rsplit(".", 1)[-1],)
            for name in taken:
                if _is_private(name):
                    found.append(f"{module.path}:{item.line} takes {name} from {item.target}")
    return found


def import_graph(modules: dict[str, Module]) -> dict[str, dict[str, int]]:
    """Module -> {module it imports: line of the first such import}.

    ``from a.b import c`` reads module ``a.b.c`` when there is one, else ``a.b``.
    """
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for module in modules.values():
        for item in imports(module):
            targets = [f"{item.target}.{name}" for name in item.names
                       if f"{item.target}.{name}" in modules]
            if len(targets) < len(item.names) or not item.names:
                targets.append(item.target)
            for target in targets:
                if target in modules and target != module.name:
                    graph[module.name].setdefault(target, item.line)
    return graph


def import_cycles(modules: dict[str, Module]) -> list[str]:
    """One cycle per strongly connected group of modules, ``a (line) -> b (line) -> a``."""
    graph = import_graph(modules)
    found = []
    for group in _strongly_connected(graph):
        if len(group) < 2:
            continue
        cycle = _cycle_within(graph, group)
        steps = [f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:], strict=False)]
        found.append(" -> ".join([*steps, cycle[-1]]))
    return found


def _strongly_connected(graph: dict[str, dict[str, int]]) -> list[set[str]]:
    """Tarjan's algorithm, iteratively (an import chain can be deeper than the stack)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    groups.append(group)
    return groups


def _cycle_within(graph: dict[str, dict[str, int]], group: set[str]) -> list[str]:
    """A shortest cycle through the group's first module, start repeated at the end."""
    start = min(group)
    previous = {start: ""}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for successor in sorted(graph[node]):
                if successor == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if successor in group and successor not in previous:
                    previous[successor] = node
                    following.append(successor)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(group)}")


# ---------------------------------------------------------------- on the package


#: The one module that makes a Report (from the stages' findings), and what it calls.
#: (``Report.from_dict`` only reads back the JSON of a report made there.)
REPORT_MAKER = f"{PACKAGE}.judge.assembly"
REPORT_MAKERS = ("Report", "replace")


def report_makers(package: dict[str, Module]) -> list[str]:
    """Every place outside :data:`REPORT_MAKER` that builds a ``Report`` or rebuilds one.

    ``Report(...)`` and ``Report.<classmethod>(...)`` calls; and ``replace(report, ...)``
    of a variable named ``report`` (the findings are what a stage changes).
    """
    found = []
    for module in package.values():
        if module.name == REPORT_MAKER:
            continue
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.Call):
                continue
            function = node.func
            name = function.id if isinstance(function, ast.Name) else (
                function.attr if isinstance(function, ast.Attribute) else None)
            owner = function.value if isinstance(function, ast.Attribute) else None
            builds = name == "Report" or (isinstance(owner, ast.Name) and owner.id == "Report")
            rebuilds = (name == "replace" and node.args and isinstance(node.args[0], ast.Name)
                        and node.args[0].id in ("report", "worst", "module_level"))
            if builds or rebuilds:
                found.append(f"{module.path}:{node.lineno}")
    return found


@pytest.fixture(scope="module")
def package() -> dict[str, Module]:
    return read_package(PACKAGE_ROOT)


def test_the_package_is_read(package):
    assert f"{PACKAGE}.judge.compare" in package and PACKAGE in package
    assert any(imports(package[f"{PACKAGE}.judge.compare"]))


def listed(found: list[str]) -> str:
    return "".join(f"\n  {item}" for item in found)


def test_no_module_is_over_the_line_limit(package):
    found = long_modules(package)
    assert not found, f"split these modules by job (> {MAX_MODULE_LINES} lines):{listed(found)}"


def test_no_function_is_long_without_saying_why(package):
    found = long_functions(package)
    assert not found, (
        "split these into named steps, or say in the docstring why the body is one step "
        f"(> {MAX_FUNCTION_LINES} lines):{listed(found)}")


def test_no_module_imports_another_modules_private_name(package):
    found = private_imports(package)
    assert not found, f"make these names public, or keep them at home:{listed(found)}"


def test_no_import_cycle(package):
    found = import_cycles(package)
    assert not found, f"break these import cycles:{listed(found)}"


def test_only_the_assembler_makes_a_report(package):
    found = report_makers(package)
    assert not found, f"return findings; only {REPORT_MAKER} makes a Report:{listed(found)}"


# ---------------------------------------------------------------- on planted violations


def plant(tmp_path: Path, files: dict[str, str]) -> dict[str, Module]:
    """A package ``bisect_onnx`` of the given files under ``tmp_path``, read back."""
    root = tmp_path / PACKAGE
    for relative, text in {"__init__.py": "", **files}.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return read_package(root)


def function(name: str, lines: int, docstring: str = "") -> str:
    body = [f'    """{docstring}"""'] if docstring else []
    body += ["    x = 0"] * (lines - 1 - len(body))
    return "\n".join([f"def {name}():", *body]) + "\n"


def test_a_long_module_is_named(tmp_path):
    planted = plant(tmp_path, {"big.py": "x = 1\n" * (MAX_MODULE_LINES + 1),
                               "fits.py": "x = 1\n" * MAX_MODULE_LINES})
    (found,) = long_modules(planted)
    assert found.endswith(f"big.py: {MAX_MODULE_LINES + 1} lines")


def test_a_long_function_is_named_unless_its_docstring_says_why(tmp_path):
    planted = plant(tmp_path, {"steps.py": "".join([
        function("too_long", MAX_FUNCTION_LINES + 1),
        function("just_fits", MAX_FUNCTION_LINES),
        function("on_purpose", MAX_FUNCTION_LINES + 5, "Long because each case is one line."),
        function("one_step", MAX_FUNCTION_LINES + 5, "One step: splitting would hide it."),
    ])})
    (found,) = long_functions(planted)
    assert f"steps.py:1 too_long ({MAX_FUNCTION_LINES + 1} lines)" in found


def test_a_long_docstring_does_not_make_a_function_long(tmp_path):
    documented = ['    """Args:', *["        x: a parameter."] * 30, '    """']
    body = ["    x = 0"] * (MAX_FUNCTION_LINES - 1)
    planted = plant(tmp_path, {"api.py": "\n".join(["def api():", *documented, *body]) + "\n"
                               + function("too_long", MAX_FUNCTION_LINES + 1)})
    (found,) = long_functions(planted)
    assert "api.py" in found and " api " not in found and "too_long" in found


def test_a_private_import_from_another_module_is_named(tmp_path):
    planted = plant(tmp_path, {
        "a.py": "_hidden = 1\n__version__ = '1'\n",
        "b.py": "from bisect_onnx.a import __version__\n\n\ndef f():\n"
                "    from bisect_onnx.a import _hidden\n",
        "c/__init__.py": "", "c/d.py": "from . import _own\nfrom ..a import _hidden\n",
    })
    assert sorted(Path(item).name for item in private_imports(planted)) == [
        "b.py:5 takes _hidden from bisect_onnx.a", "d.py:1 takes _own from bisect_onnx.c",
        "d.py:2 takes _hidden from bisect_onnx.a"]


def test_an_import_cycle_is_named_with_its_lines(tmp_path):
    planted = plant(tmp_path, {
        "a.py": "from bisect_onnx import b\n",
        "b.py": "import os\n\n\ndef later():\n    from bisect_onnx.c import thing\n",
        "c.py": "from typing import TYPE_CHECKING\nfrom bisect_onnx.a import x\n",
    })
    assert import_cycles(planted) == [
        "bisect_onnx.a (line 1) -> bisect_onnx.b (line 5) -> bisect_onnx.c (line 2) "
        "-> bisect_onnx.a"]


def test_type_checking_imports_and_imports_of_packages_make_no_cycle(tmp_path):
    planted = plant(tmp_path, {
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from bisect_onnx.b import B\nelse:\n    import json\n",
        "b.py": "from bisect_onnx.a import A\n",
        "c/__init__.py": "from bisect_onnx.c.d import D\n",
        "c/d.py": "from bisect_onnx.a import A\n",
    })
    assert import_cycles(planted) == []
    assert import_graph(planted)["bisect_onnx.c"] == {"bisect_onnx.c.d": 1}


def test_a_report_made_outside_the_assembler_is_named(tmp_path):
    planted = plant(tmp_path, {
        "judge/assembly.py": "def assemble(f):\n    return Report(verdict=f)\n",
        "stage.py": "def stage(report):\n    return replace(report, note='x')\n",
        "other.py": "def other():\n    return Report.decided(1)\n"})
    assert sorted(item.rsplit("/", 1)[-1] for item in report_makers(planted)) == [
        "other.py:2", "stage.py:2"]
