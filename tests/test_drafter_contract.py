"""The drafter contract (generation/drafter.py) and the engine's one way in.

The example drafter of docs/engine.md is executed as written, a minimal drafter with only
``propose`` runs through every path of the loop on its defaults, and no product module asks a
pair or a drafter anything outside the contract (no ``getattr``/``hasattr`` on either, engine/
included). Every decoding loop is named, and only the engine calls one; each guard has a
mutation check beside it.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest
import torch

from engine import DRAFTERS, Drafter, Strategy, pair_of, register_drafter, run_strategy
from sampling import GreedyProcessor
from tests.helpers.decode import autoregressive
from tests.helpers.imports import module_name
from tests.helpers.models import tiny_llama
from tests.test_layers import PACKAGES

ROOT = Path(__file__).resolve().parent.parent


def _doc_example() -> str:
    text = (ROOT / "docs" / "engine.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    example = [b for b in blocks if "class PromptLookup(Drafter)" in b]
    assert len(example) == 1, "docs/engine.md must hold the example drafter once"
    return example[0]


@pytest.fixture
def registry():
    """Leave DRAFTERS as it was after each test."""
    saved = dict(DRAFTERS)
    yield
    DRAFTERS.clear()
    DRAFTERS.update(saved)


def test_doc_example_drafter_runs_and_is_lossless(registry):
    target = tiny_llama(0, logit_scale=8.0)
    # A prompt that repeats, so the lookup finds matches and drafts get judged both ways.
    prompt_ids = [5, 6, 7, 8, 5, 6, 7, 9, 5, 6]
    scope = {"target": target, "prompt_ids": prompt_ids}
    exec(compile(_doc_example(), "docs/engine.md", "exec"), scope)
    result = scope["result"]
    want = autoregressive(prompt_ids, target, processor=GreedyProcessor(), max_gen_len=32).tokens
    assert result.tokens == want
    assert result.drafted > 0, "the example drafter never drafted: the test would not judge anything"
    assert result.drafter_calls == 0 and result.rollback.get("drafter") is None


class OnlyPropose(Drafter):
    """The least a drafter can be: proposes the token after the last one, id + 1 (mostly wrong)."""

    def propose(self, ids, k, stop_below=None):
        last = int(ids[0, -1])
        return torch.arange(last + 1, last + 1 + k, device=ids.device) % 64, None


@pytest.mark.parametrize("tree", [0, 6])
def test_a_drafter_with_only_propose_runs_on_defaults(registry, tree):
    register_drafter("only", lambda pair, strategy, state, context: OnlyPropose())
    target = tiny_llama(0, logit_scale=8.0)
    strategy = Strategy("only", drafter="only", gamma=3, processor=GreedyProcessor(), max_gen_len=20, tree=tree)
    result = run_strategy(strategy, pair_of(target), [1, 2, 3])
    want = autoregressive([1, 2, 3], target, processor=GreedyProcessor(), max_gen_len=20).tokens
    assert result.tokens == want
    assert result.drafted > 0 and result.accepted < result.drafted  # rejections happened
    if tree:
        assert result.tree_fallback == "chain instead of a tree: the model drafter proposes chains only"


def test_propose_is_the_one_method_without_a_default():
    with pytest.raises(TypeError):
        Drafter()  # abstract: propose must be written


# ------------------------------------------------------------------ guards over the product's source
# Every package of the layer table (tests/test_layers.py, which also checks that each package on disk
# has a layer) and the top-level scripts are read; nothing is imported.

CONTRACT = Path("generation") / "drafter.py"   # the contract's own defaults may look at a drafter
DECODING_LOOPS = {"generation.verify.verify_loop", "generation.autoregressive.autoregressive_generate",
                  "generation.served.served_generate"}
# Functions that call a model's forward in a loop without decoding: the forward-time measurements.
TIMERS = {"generation.timing.time_target", "model_drafters.selfdraft.calibrate.step_s", "model_drafters.selfdraft.calibrate.paired_step_s"}
# The loops' callers: run_strategy, and autoregressive decoding handing a served target to its server.
LOOP_CALLERS = {"engine.run.run_strategy", "generation.autoregressive.autoregressive_generate"}
HOLDS_PAIR_OR_DRAFTER = re.compile(r"(\w+_)?(pair|drafter|models)")
DRAFTER_TYPES = re.compile(r"\b\w*(Drafter|ModelPair)\b")          # annotations that name one
DRAFTER_SOURCES = re.compile(r"(\w+_)?drafter")                     # calls that make one


def product_files(root: Path = ROOT, packages=PACKAGES) -> list[Path]:
    """Every module of ``packages`` under ``root``, and the top-level scripts (infer.py, bench.py)."""
    return [p for package in packages for p in sorted((root / package).rglob("*.py"))] + sorted(root.glob("*.py"))


def _functions(path: Path, root: Path):
    """(dotted name, node) of every function in a module; a method is named Class.method."""
    prefix = module_name(path, root)

    def walk(node, name):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if not isinstance(child, ast.ClassDef):
                    yield f"{name}.{child.name}", child
                yield from walk(child, f"{name}.{child.name}")
            else:
                yield from walk(child, name)

    return walk(ast.parse(path.read_text(encoding="utf-8")), prefix)


def _own_nodes(function):
    """The nodes of ``function``'s body, those of functions and classes defined inside it left out."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            yield node
            stack.extend(ast.iter_child_nodes(node))


def _called(node: ast.Call) -> str:
    """The name a call calls: ``f`` for ``f(...)`` and ``a.b.f(...)``."""
    return node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")


def _loops_of(function):
    return [n for n in _own_nodes(function) if isinstance(n, (ast.For, ast.While))]


def _is_drafter_type(annotation) -> bool:
    """An annotation naming a drafter or a pair (``Drafter``, ``SelfDrafter | None``, ``ModelPair``)."""
    return annotation is not None and DRAFTER_TYPES.search(ast.unparse(annotation)) is not None


def _params(function) -> list[ast.arg]:
    a = function.args
    return [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs, *([a.kwarg] if a.kwarg else [])]


class _Holders:
    """Which names hold a pair, a drafter or a drafter model, read from what they hold: a name or an
    attribute named so; a parameter annotated with a drafter or pair type; the value of a call that
    makes a drafter (``build_self_drafter``, ``default_drafter``: the first of the values it returns);
    and, through assignments (tuples too), returns and calls between a module's own functions, whatever
    such a value is handed to, under any name."""

    def __init__(self, tree: ast.Module):
        self.functions = {f.name: f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.typed = {name: {p.arg for p in _params(f) if _is_drafter_type(p.annotation)}
                      for name, f in self.functions.items()}
        self.params = {name: set(typed) for name, typed in self.typed.items()}
        self.returns: dict[str, set] = {name: set() for name in self.functions}   # "all" or tuple positions
        self.names: dict[str, set[str]] = {}
        scopes = [(None, tree)] + list(self.functions.items())
        changed = True
        while changed:
            self.passed: dict[tuple[str, str], list[bool]] = {}     # (function, parameter): held at each call
            before = ({k: set(v) for k, v in self.params.items()}, {k: set(v) for k, v in self.returns.items()})
            for name, node in scopes:
                self._scan(name, node)
            # a parameter holds one where every call in the module hands it one (a helper given any model does not)
            for name in self.functions:
                self.params[name] = self.typed[name] | {param for (f, param), held in self.passed.items()
                                                        if f == name and all(held)}
            changed = before != (self.params, self.returns)

    def _own(self, node):
        body = list(ast.iter_child_nodes(node)) if not isinstance(node, ast.Module) else list(node.body)
        nodes = []
        while body:
            child = body.pop()
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                nodes.append(child)
                body.extend(ast.iter_child_nodes(child))
            elif isinstance(child, ast.ClassDef):
                body.extend(c for c in child.body if not isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef)))
        return sorted(nodes, key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)))

    def _positions(self, value, names) -> set:
        """Which of ``value``'s parts hold one: "all", or the positions of a tuple."""
        if isinstance(value, ast.Tuple):
            return {i for i, v in enumerate(value.elts) if self.holds(v, names)}
        if isinstance(value, ast.Call):
            called = _called(value)
            if called in self.functions:
                return set(self.returns[called])
            return {"all", 0} if DRAFTER_SOURCES.fullmatch(called) else set()
        return {"all"} if self.holds(value, names) else set()

    def holds(self, node, names) -> bool:
        if isinstance(node, ast.Name):
            return node.id in names or HOLDS_PAIR_OR_DRAFTER.fullmatch(node.id) is not None
        if isinstance(node, ast.Attribute):
            return HOLDS_PAIR_OR_DRAFTER.fullmatch(node.attr) is not None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            return node.slice.value in self._positions(node.value, names)
        if isinstance(node, ast.NamedExpr):
            return self.holds(node.value, names)
        if isinstance(node, ast.Call):
            return "all" in self._positions(node, names)
        return False

    def _bind(self, target, found: set, names: set) -> None:
        if isinstance(target, ast.Name) and "all" in found:
            names.add(target.id)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for i, element in enumerate(target.elts):
                self._bind(element, {"all"} if i in found else set(), names)

    def _scan(self, name, node) -> None:
        names = set(self.params.get(name, ()))
        for child in self._own(node):
            if isinstance(child, ast.AnnAssign) and _is_drafter_type(child.annotation):
                self._bind(child.target, {"all"}, names)
            elif isinstance(child, (ast.Assign, ast.AnnAssign)) and child.value is not None:
                found = self._positions(child.value, names)
                for target in (child.targets if isinstance(child, ast.Assign) else [child.target]):
                    self._bind(target, found, names)
            elif isinstance(child, (ast.For, ast.comprehension, ast.withitem)):
                source = child.context_expr if isinstance(child, ast.withitem) else child.iter
                target = child.optional_vars if isinstance(child, ast.withitem) else child.target
                if target is not None and self.holds(source, names) and not isinstance(child, ast.withitem):
                    self._bind(target, {"all"}, names)
            elif isinstance(child, ast.Return) and child.value is not None and name is not None:
                self.returns[name] |= self._positions(child.value, names)
            elif isinstance(child, ast.Call) and _called(child) in self.functions:
                called = _called(child)
                params = [p.arg for p in _params(self.functions[called]) if p.arg not in ("self", "cls")]
                given = [(params[i], arg) for i, arg in enumerate(child.args) if i < len(params)]
                given += [(k.arg, k.value) for k in child.keywords if k.arg]
                for param, arg in given:
                    self.passed.setdefault((called, param), []).append(self.holds(arg, names))
        self.names[name] = names

    def probes(self, tree):
        """getattr/hasattr calls whose first argument holds a pair, a drafter or a drafter model."""
        for name, node in [(None, tree)] + list(self.functions.items()):
            for child in self._own(node):
                if isinstance(child, ast.Call) and _called(child) in ("getattr", "hasattr") and child.args \
                        and self.holds(child.args[0], self.names.get(name, set())):
                    yield child


def attribute_probes(path: Path, root: Path = ROOT) -> list[str]:
    """getattr/hasattr calls on something that holds a pair, a drafter or a drafter model
    (:class:`_Holders`: what a name holds, not only what it is called), as 'file:line call'."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = sorted(set(_Holders(tree).probes(tree)), key=lambda n: (n.lineno, n.col_offset))
    return [f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node)}" for node in nodes]


def decoding_loops(root: Path = ROOT, packages=PACKAGES) -> set[str]:
    """Functions that make a fresh ``GenerationResult`` (not one read back from a mapping) and loop:
    what every decode is (prompt ids in, a result out)."""
    found = set()
    for path in product_files(root, packages):
        for name, function in _functions(path, root):
            makes = any(isinstance(n, ast.Call) and _called(n) == "GenerationResult"
                        and all(k.arg is not None for k in n.keywords) for n in _own_nodes(function))
            if makes and _loops_of(function):
                found.add(name)
    return found


def forward_loops(root: Path = ROOT, packages=PACKAGES) -> set[str]:
    """Functions that call a model's ``forward`` inside a loop of their own."""
    return {name for path in product_files(root, packages) for name, function in _functions(path, root)
            if any(isinstance(n, ast.Call) and _called(n) == "forward"
                   for loop in _loops_of(function) for n in ast.walk(loop))}


def loop_callers(root: Path = ROOT, packages=PACKAGES) -> set[str]:
    """Functions that call one of the decoding loops."""
    loops = {name.rsplit(".", 1)[1] for name in DECODING_LOOPS}
    return {name for path in product_files(root, packages) for name, function in _functions(path, root)
            if any(isinstance(n, ast.Call) and _called(n) in loops for n in _own_nodes(function))}


def _copy(root: Path, *packages: str) -> Path:
    """The real ``packages`` copied under ``root``, to break on purpose."""
    for package in packages:
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _append(path: Path, source: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + "\n\n" + source, encoding="utf-8")


def test_nothing_asks_a_pair_or_a_drafter_outside_the_contract():
    """No getattr/hasattr on a pair or a drafter in any product module (engine/ included): a fact of
    the pair is a ModelPair field, an ability of a drafter a method of the contract."""
    probes = [p for path in product_files() if path.relative_to(ROOT) != CONTRACT for p in attribute_probes(path)]
    assert probes == []


def test_a_getattr_on_a_drafter_or_a_pair_in_the_engine_would_be_caught(tmp_path):
    # Mutation check: the engine probing a drafter (as run_strategy once did) and a pair.
    _copy(tmp_path, "engine")
    _append(tmp_path / "engine" / "run.py", "def _costs(drafter, self):\n"
            "    return getattr(drafter, 'verify_costs', None), hasattr(self.pair, 'probe')\n")
    found = [p for path in product_files(tmp_path) for p in attribute_probes(path, tmp_path)]
    assert [line.split(" ", 1)[1] for line in found] == ["getattr(drafter, 'verify_costs', None)",
                                                         "hasattr(self.pair, 'probe')"]


def test_a_drafter_probed_under_another_name_would_be_caught(tmp_path):
    """Mutation check: the self-pair loader probing the drafter model it built through names that say
    nothing (``m``, handed on as ``thing``; a parameter typed ``Drafter``), as it once did with ``draft``:
    the guard follows what the names hold. A helper handed a target as well as a drafter (``size``) is
    not a drafter's reader, and is left alone."""
    _copy(tmp_path, "model_drafters")
    _append(tmp_path / "model_drafters" / "selfdraft" / "load.py",
            "def _made(target, spec):\n    m, chosen, notes = default_drafter(None, target, None, 'x', None)\n"
            "    return m, notes\n\n\n"
            "def _note(spec, thing):\n    return getattr(thing, 'lean_reason', '')\n\n\n"
            "def _typed(x: 'Drafter | None'):\n    return hasattr(x, 'verify_costs')\n\n\n"
            "def size(model):\n    return getattr(model, 'dtype', None)\n\n\n"
            "def _uses(target, spec):\n    built = _made(target, spec)[0]\n"
            "    return _note(spec, built), size(built), size(target)\n")
    found = [p for path in product_files(tmp_path) for p in attribute_probes(path, tmp_path)]
    assert [line.split(" ", 1)[1] for line in found] == ["getattr(thing, 'lean_reason', '')",
                                                         "hasattr(x, 'verify_costs')"]


def test_every_decoding_loop_is_named():
    assert decoding_loops() == DECODING_LOOPS


def test_a_new_decoding_loop_would_be_caught(tmp_path):
    # Mutation check: a third loop of its own in generation/ (a result made fresh, tokens in a loop).
    _copy(tmp_path, "generation")
    (tmp_path / "generation" / "fast.py").write_text(
        "from generation.result import GenerationResult\n\n\ndef fast_generate(prompt, model, n):\n"
        "    result = GenerationResult()\n    for _ in range(n):\n        model.forward(prompt)\n"
        "    return result\n", encoding="utf-8")
    assert decoding_loops(tmp_path) - DECODING_LOOPS == {"generation.fast.fast_generate"}


def test_a_forward_in_a_loop_is_a_decoding_loop_or_a_timer():
    assert forward_loops() <= DECODING_LOOPS | TIMERS
    assert "generation.autoregressive.autoregressive_generate" in forward_loops()


def test_a_forward_loop_outside_the_named_ones_would_be_caught(tmp_path):
    # Mutation check: a function in the engine that steps a model in a loop (a decode of its own).
    _copy(tmp_path, "engine")
    _append(tmp_path / "engine" / "run.py", "def _greedy(cached, ids, n):\n    for _ in range(n):\n"
            "        ids = cached.forward(ids, keep=1).argmax(-1)\n    return ids\n")
    assert forward_loops(tmp_path) - (DECODING_LOOPS | TIMERS) == {"engine.run._greedy"}


def test_run_strategy_is_the_only_caller_of_the_loops():
    """No product package but the engine's run_strategy calls a decoding loop (autoregressive
    decoding hands a served target to served_generate)."""
    assert loop_callers() == LOOP_CALLERS


def test_a_new_package_calling_the_verify_loop_would_be_caught(tmp_path):
    # Mutation check: a package given a layer whose module calls the verify loop itself (one not in the
    # table is refused by tests/test_layers.py: every package on disk sits in the table).
    _copy(tmp_path, "generation", "engine")
    (tmp_path / "shortcut").mkdir()
    (tmp_path / "shortcut" / "__init__.py").write_text(
        "from generation.verify import verify_loop\n\n\ndef decode(prompt, drafter, target, options):\n"
        "    return verify_loop(prompt, drafter, target, options)\n", encoding="utf-8")
    assert loop_callers(tmp_path, (*PACKAGES, "shortcut")) - LOOP_CALLERS == {"shortcut.decode"}
