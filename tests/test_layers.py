"""The packages form layers that only look down: no import cycle among them.

Every ``import`` in every module of a package (inside functions too) is an edge
from that package to the package it names; the graph must be acyclic and each
edge must point to a layer at or below its own. Each package must also import
on its own in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Bottom first; a package may import its own layer and those below it.
LAYERS = (
    ("analysis", "sampling", "utils", "kvcache"),
    ("generation", "ngram_assisted", "model_drafters", "remote"),
    ("engine",),
    ("checks", "bench", "repl"),
)
PACKAGES = tuple(p for layer in LAYERS for p in layer)
LAYER_OF = {p: i for i, layer in enumerate(LAYERS) for p in layer}


def imported_packages(source: str) -> set[str]:
    """The project packages a module's source imports, anywhere in it."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        out.update(n.split(".")[0] for n in names if n.split(".")[0] in PACKAGES)
    return out


def package_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """package -> the other project packages its modules import."""
    graph = {}
    for package in PACKAGES:
        edges = set()
        for path in (root / package).rglob("*.py"):
            edges |= imported_packages(path.read_text(encoding="utf-8"))
        graph[package] = edges - {package}
    return graph


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


def upward_edges(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, edges in graph.items() for b in edges if LAYER_OF[b] > LAYER_OF[a])


def test_the_package_graph_has_no_cycle():
    assert find_cycle(package_graph()) is None


def test_packages_import_only_their_layer_and_below():
    assert upward_edges(package_graph()) == []


def test_the_graph_sees_imports_inside_functions():
    source = "def f():\n    from repl.settings import Settings\n    import engine.run\nimport os\nfrom . import x\n"
    assert imported_packages(source) == {"repl", "engine"}


def test_a_cycle_would_be_caught():
    # Mutation check: the same search must find a cycle when one is there.
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) in (["a", "b", "c", "a"],)
    graph = package_graph()
    graph["utils"] = graph["utils"] | {"repl"}      # a low layer looking up
    assert find_cycle(graph) is not None
    assert ("utils", "repl") in upward_edges(graph)


def test_a_real_import_cycle_would_be_caught(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "engine" / "x.py").write_text("def f():\n    import bench.y\n", encoding="utf-8")
    (tmp_path / "bench" / "y.py").write_text("from engine.x import f\n", encoding="utf-8")
    assert find_cycle(package_graph(tmp_path)) == ["bench", "engine", "bench"]


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_imports_alone(package):
    done = subprocess.run([sys.executable, "-c", f"import {package}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_drafter_package_looking_up_to_the_engine_would_be_caught():
    # Mutation check: cross_tokenizer sits beside generation; an import of the engine is upward.
    graph = package_graph()
    assert "engine" not in graph["model_drafters"]
    graph["model_drafters"] = graph["model_drafters"] | {"engine"}
    assert ("model_drafters", "engine") in upward_edges(graph)
    assert find_cycle(graph) is not None           # the engine imports model_drafters


def test_self_drafters_sit_beside_generation_and_utils_does_not_look_up_to_them():
    # Mutation check: the self-draft loader once lived in utils.models (utils -> selfdraft -> utils).
    graph = package_graph()
    assert "model_drafters" not in graph["utils"] and "model_drafters" in graph["engine"]
    graph["utils"] = graph["utils"] | {"model_drafters"}
    assert ("utils", "model_drafters") in upward_edges(graph)
    assert find_cycle(graph) is not None


def _kvcache_imports(module: str) -> set[str]:
    """The kvcache modules a kvcache module imports, anywhere in it."""
    source = (ROOT / "kvcache" / f"{module}.py").read_text(encoding="utf-8")
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvcache."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("kvcache.")}
    return found


def test_the_cache_core_imports_neither_the_probe_nor_the_prefill():
    """kvcache.cache stands alone; probe and prefill build on it (no import circle inside the package)."""
    assert _kvcache_imports("cache") == set()
    assert "cache" in _kvcache_imports("probe") and "cache" in _kvcache_imports("prefill")


def test_a_cached_model_is_told_its_path_and_building_one_probes_nothing(monkeypatch):
    import kvcache.probe
    from kvcache.cache import CachedModel
    from tests.helpers.models import tiny_llama

    model = tiny_llama(0)
    monkeypatch.setattr(kvcache.probe, "probe_model", lambda m: pytest.fail("a CachedModel probed on construction"))
    with pytest.raises(ValueError, match="needs its path"):
        CachedModel(model)
    assert CachedModel(model, path="cached").path == "cached"
    assert CachedModel(model, use_cache=False).path == "uncached"
