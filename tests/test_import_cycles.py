"""No module of the project's packages imports, at module level, a module that imports it back.

The graph is read from the source (``ast``): each module-level ``import`` and ``from ... import``
(not those inside functions, nor under ``if TYPE_CHECKING:``) is an edge to the project module it
names, and to ``package.name`` when that is a module. Mutations: a planted cycle in a throwaway
package, and the cycle ``generation.gamma_policies`` <-> its ``model`` put back into the real graph.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def packages(root: Path) -> list[str]:
    return sorted(p.parent.name for p in root.glob("*/__init__.py") if p.parent.name != "tests")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_level(body: list[ast.stmt]):
    """The import statements a module runs when imported."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            yield from _module_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _module_level(node.body + node.orelse + node.finalbody
                                     + [s for h in node.handlers for s in h.body])
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from _module_level(node.body)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Each module of ``root``'s packages and the project modules it imports at module level."""
    files = {module_name(root, p): p for pkg in packages(root) for p in (root / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in _module_level(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names)
                continue
            base = node.module or ""
            if node.level:
                base = ".".join([*here.split(".")[:len(here.split(".")) - node.level + 1], *filter(None, [base])])
            edges.add(base)
            edges.update(f"{base}.{alias.name}" for alias in node.names)
        graph[name] = {e for e in edges if e in files and e != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_project_has_no_import_cycle():
    graph = import_graph(ROOT)
    assert len(graph) > 100 and "generation.gamma_policies.model" in graph
    assert cycles(graph) == []


def test_mutation_the_old_gamma_policies_cycle_is_found():
    graph = import_graph(ROOT)
    graph["generation.gamma_policies.model"].add("generation.gamma_policies")
    assert ["generation.gamma_policies", "generation.gamma_policies.model"] in cycles(graph)


def test_mutation_a_planted_cycle_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "a.py").write_text("import os\n\nA = 1\n\ndef f():\n    from pkg import b\n")
    (pkg / "b.py").write_text("try:\n    from .sub import c\nexcept ImportError:\n    c = None\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from ..b import c\n")
    graph = import_graph(tmp_path)
    assert graph["pkg"] == {"pkg.a"} and graph["pkg.a"] == set()      # a function's import is no edge
    assert cycles(graph) == [["pkg.b", "pkg.sub.c"]]
