"""The project's import graph between modules, read from the source (no module is imported).

Every ``import`` counts, at the top of a module or inside a function (a function-level import
hides a circle from the interpreter, not from this graph); imports under ``if TYPE_CHECKING:``
run only for a type checker and do not count. ``from a.b import c`` is an edge to the module
``a.b.c`` when there is one, else to ``a.b``; a parent package's ``__init__`` that Python runs on
the way is not an edge (every submodule would otherwise sit in a circle with its package).
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    """``model_drafters/selfdraft/load.py`` -> ``model_drafters.selfdraft.load``; a package's ``__init__`` is the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_of(root: Path, packages) -> dict[str, Path]:
    """Every module of ``packages`` under ``root``, by dotted name."""
    return {module_name(path, root): path for package in packages for path in sorted((root / package).rglob("*.py"))}


def _runtime_nodes(tree: ast.AST):
    """The nodes of ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _known(name: str, modules) -> str | None:
    """``name`` or its longest prefix that is a project module, or None for outside modules."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from`` import names (relative ones resolved against ``module``)."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def imported_modules(module: str, path: Path, modules) -> set[str]:
    """The project modules ``module`` (read from ``path``) imports, anywhere in it."""
    out = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(filter(None, (_known(alias.name, modules) for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, path.name == "__init__.py", node)
            for alias in node.names:
                found = _known(f"{base}.{alias.name}", modules) if f"{base}.{alias.name}" in modules else _known(base, modules)
                if found:
                    out.add(found)
    return out - {module}


def module_graph(root: Path, packages) -> dict[str, set[str]]:
    """module -> the project modules it imports."""
    modules = modules_of(root, packages)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None when it is acyclic (depth-first search)."""
    state: dict[str, str] = {}   # node -> "open" while on the stack, "done" after
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None
