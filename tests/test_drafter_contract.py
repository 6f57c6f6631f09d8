"""The drafter contract (generation/drafter.py) and the engine's one way in.

The example drafter of docs/engine.md is executed as written, a minimal drafter with only
``propose`` runs through every path of the loop on its defaults, and the loop asks drafters
nothing outside the contract (no ``getattr``/``hasattr`` on a drafter in generation/).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from engine import DRAFTERS, Drafter, Strategy, pair_of, register_drafter, run_strategy
from sampling import GreedyProcessor
from tests.helpers.decode import autoregressive
from tests.helpers.models import tiny_llama

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


def _attribute_probes(path: Path) -> list[str]:
    """getattr/hasattr calls in a module, as 'file:line'."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            args = [ast.unparse(a) for a in node.args]
            if args and "drafter" in args[0]:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_the_loop_asks_drafters_nothing_outside_the_contract():
    probes = [p for path in sorted((ROOT / "generation").rglob("*.py")) for p in _attribute_probes(path)]
    assert probes == []


def test_the_probe_finder_sees_a_getattr_on_a_drafter(tmp_path):
    # Mutation check for the test above: a loop that probes a drafter is found.
    module = ROOT / "generation" / "_probe_mutant_test.py"
    module.write_text("def f(drafter):\n    return getattr(drafter, 'fill_target', None)\n", encoding="utf-8")
    try:
        assert _attribute_probes(module)
    finally:
        module.unlink()


def test_run_strategy_is_the_only_caller_of_the_loops():
    """No product package but engine/ calls verify_loop or autoregressive_generate."""
    callers = []
    for package in ("generation", "ngram_assisted", "cross_tokenizer", "selfdraft", "sampling", "utils",
                    "analysis", "repl", "bench", "checks"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id in ("verify_loop", "autoregressive_generate")):
                    callers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert callers == []
