"""The packages form layers that only look down: no import cycle among them, nor among their modules.

Every ``import`` in every module of a package (inside functions too) is an edge
from that package to the package it names; the graph must be acyclic and each
edge must point to a layer at or below its own. The same imports between modules
(``tests.helpers.imports.module_graph``) must form no cycle either, within a package
as well as across. Every package on disk sits in the table, and each must import
on its own in a fresh interpreter.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.imports import find_cycle, module_graph

ROOT = Path(__file__).resolve().parent.parent
# Bottom first; a package may import its own layer and those below it.
LAYERS = (
    ("analysis", "sampling", "utils", "kvcache"),
    ("generation", "ngram_assisted", "model_drafters", "remote"),
    ("engine",),
    ("checks", "bench", "repl", "advisor"),
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


# ------------------------------------------------------------------ modules, not only packages


def packages_on_disk(root: Path = ROOT) -> set[str]:
    """Every top-level package of the project (a folder with ``__init__.py``), the tests aside."""
    return {path.parent.name for path in root.glob("*/__init__.py")} - {"tests"}


def test_every_package_sits_in_a_layer():
    """A new package must be given a layer: the guards here and the drafter contract's read the table."""
    assert packages_on_disk() == set(PACKAGES)


def test_a_package_left_out_of_the_table_would_be_caught(tmp_path):
    # Mutation check: a folder that is a package but has no layer.
    for package in (*PACKAGES, "newcomer"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("", encoding="utf-8")
    assert packages_on_disk(tmp_path) - set(PACKAGES) == {"newcomer"}


def test_no_import_cycle_between_modules():
    """engine's modules once went round drafters -> widths -> calibrate -> run -> drafters, closed by
    an import inside a function: the package graph cannot see such a circle, the module graph does."""
    assert find_cycle(module_graph(ROOT, PACKAGES)) is None


def _tree(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (relative path -> source) under ``root``."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_a_module_cycle_inside_a_package_closed_in_a_function_would_be_caught(tmp_path):
    # Mutation check: two modules of one package, one of them importing the other inside a function.
    _tree(tmp_path, {"a/__init__.py": "", "a/x.py": "def f():\n    from a.y import g\n    return g\n",
                     "a/y.py": "from a.x import f\n\ndef g():\n    return f\n"})
    assert find_cycle(module_graph(tmp_path, ["a"])) == ["a.x", "a.y", "a.x"]


def test_a_module_cycle_across_packages_and_through_relative_imports_would_be_caught(tmp_path):
    # Mutation check: ``from package import module`` and relative imports are edges to the module.
    _tree(tmp_path, {"a/__init__.py": "", "b/__init__.py": "", "a/p.py": "from b.q import z\n",
                     "b/q.py": "def z():\n    from a import p\n    return p\n"})
    assert find_cycle(module_graph(tmp_path, ["a", "b"])) == ["a.p", "b.q", "a.p"]
    _tree(tmp_path, {"c/__init__.py": "", "c/r.py": "from .s import t\n",
                     "c/s.py": "def t():\n    from . import r\n    return r\n"})
    assert find_cycle(module_graph(tmp_path, ["c"])) == ["c.r", "c.s", "c.r"]


def test_type_checking_imports_and_parent_packages_make_no_edge(tmp_path):
    """What Python never runs (an import under ``if TYPE_CHECKING:``) and the parent package run on
    the way to a submodule are no edges; with them every package would sit in a circle."""
    _tree(tmp_path, {"a/__init__.py": "from a.x import f\n",
                     "a/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from a.y import g\n"
                               "def f():\n    pass\n",
                     "a/y.py": "from a.x import f\n"})
    graph = module_graph(tmp_path, ["a"])
    assert graph == {"a": {"a.x"}, "a.x": set(), "a.y": {"a.x"}}
    assert find_cycle(graph) is None


def test_the_old_engine_circle_would_be_caught(tmp_path):
    # Mutation check on a copy of the real tree: the self-drafters' calibration decodes through
    # run_strategy itself again, inside a function, instead of the greedy run its loader is handed.
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    calibrate = tmp_path / "model_drafters" / "selfdraft" / "calibrate.py"
    calibrate.write_text(calibrate.read_text(encoding="utf-8") + "\n\ndef _run():\n"
                         "    from engine.run import run_strategy\n    return run_strategy\n", encoding="utf-8")
    cycle = find_cycle(module_graph(tmp_path, PACKAGES))
    assert cycle is not None and {"model_drafters.selfdraft.calibrate", "engine.run"} <= set(cycle)
    assert ("model_drafters", "engine") in upward_edges(package_graph(tmp_path))
