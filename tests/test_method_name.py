"""One grammar for a method's name (``utils.method_name``): every name the benchmark plans and the
advisor's grid offers reads back to itself, and a name runs the same way from the benchmark and the
advisor (``engine.named``). Mutations: a parser that drops the verify rule, a formatter that writes
the parts out of order."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

import utils.method_name
from utils.method_name import DEFAULT_RULE, MethodName, parse_method_name, storage_kind

PLAN = dict(strategies=["speculative", "ngram", "target", "drafter", "lookahead"], gammas=[1, 4],
            policies=[("heuristic", 4), ("confidence 0.4", 20), ("model", 16)], trees=[16],
            self_drafters=["self:int8", "self:skip=3,5"], verifies=[DEFAULT_RULE, "residual", "strict"],
            hybrids=[4], storages=["basic", "suffix+fill", "sam"], arctic=True,
            lookaheads=[(5, 3, 5), (4, 4, 3)], static_peers={"hf_generate", "hf_assisted", "hf_prompt_lookup"})


def planned_names() -> list[str]:
    from bench.variants import plan_variants

    return [v.name for v in plan_variants(peers=True, **PLAN)]


@pytest.fixture(scope="module")
def pair():
    from engine import pair_of
    from tests.helpers.models import tiny_llama

    target = tiny_llama(1, vocab_size=24)
    return pair_of(target, copy.deepcopy(target))


def grid_names(pair) -> list[str]:
    from advisor.replay import default_grid

    return [m.key for m in default_grid(pair, gammas=(1, 4), policies=("constant", "heuristic", "confidence"),
                                        trees=(0, 16))]


def misread(names: list[str]) -> list[str]:
    """The names that do not read back to themselves (through the module's own parser)."""
    def reads_back(name: str) -> bool:
        try:
            return utils.method_name.parse_method_name(name).name == name
        except ValueError:
            return False

    return [name for name in names if not reads_back(name)]


def test_every_planned_name_reads_back_to_itself():
    names = planned_names()
    assert len(names) == len(set(names)) > 100
    for part in ("[self:skip=3,5]+tree16@4", "+hybrid4@", ":confidence=0.4@20", "~strict", "[suffix+fill]",
                 "hf_assisted+static@4", "lookahead[4,4,3]@3", "arctic_suffix@4"):
        assert any(part in name for name in names), part
    assert misread(names) == []


def test_every_grid_name_reads_back_to_itself(pair):
    names = grid_names(pair)
    assert len(names) == len(set(names))
    assert {"ngram[sam]+tree16:heuristic@4", "speculative[self:int8]:confidence@1", "speculative+hybrid4@4"} \
        <= set(names)
    assert misread(names) == []


def test_the_value_survives_its_name():
    from bench.variants import plan_variants, parse_variant_name

    for variant in plan_variants(peers=True, **PLAN):
        assert parse_variant_name(variant.name) == variant
    assert storage_kind("suffix+fill") == ("suffix", True) and storage_kind("sam") == ("sam", False)


def test_a_name_runs_the_same_way_from_the_advisor_and_the_benchmark(pair):
    from advisor.replay import default_grid
    from bench.ours import our_strategy
    from bench.variants import parse_variant_name
    from sampling import GreedyProcessor

    same = ("key", "drafter", "model", "gamma", "gamma_policy", "tree", "verify")
    for m in default_grid(pair, gammas=(2,), policies=("constant", "heuristic"), trees=(0, 8)):
        ours = m.strategy(max_gen_len=8)
        bench = our_strategy(parse_variant_name(m.key), processor=GreedyProcessor(), max_gen_len=8,
                             ngram=m.options if m.drafter == "ngram" else ours.drafter_options)
        assert [getattr(ours, f) for f in same] == [getattr(bench, f) for f in same], m.key


def test_mutation_a_parser_that_drops_the_rule_misreads(monkeypatch):
    real = parse_method_name
    monkeypatch.setattr(utils.method_name, "parse_method_name",
                        lambda name, into=MethodName: replace(real(name, into), verify=DEFAULT_RULE))
    assert any("~strict" in name for name in misread(planned_names()))


def test_mutation_a_formatter_that_writes_the_hybrid_before_the_tree_misreads(monkeypatch, pair):
    real = MethodName.name.fget

    def swapped(self):
        name = real(self)
        tree, hybrid = f"+tree{self.tree}", f"+hybrid{self.hybrid}"
        return name.replace(tree + hybrid, hybrid + tree) if self.tree and self.hybrid else name

    monkeypatch.setattr(MethodName, "name", property(swapped))
    assert misread(grid_names(pair)) == [n for n in grid_names(pair) if "+hybrid4+tree16" in n] != []
