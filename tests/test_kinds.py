"""The drafter kinds (``engine.kinds``): a new kind is a package and one registration line.

The toy kind of docs/engine.md is executed as written; the registry's kinds each answer for their own
specs and modules, and the engine asks them, not their names.
"""

from __future__ import annotations

import pytest

import engine.kinds
from engine import decodes_alone_reason
from engine.kinds import KINDS, kind_of_module, kind_of_spec
from sampling import GreedyProcessor
from tests.helpers.decode import autoregressive
from tests.helpers.doc_blocks import python_block, run_example
from tests.helpers.models import tiny_llama


@pytest.fixture
def registry():
    """Put KINDS back as it was after each test (the example registers a kind)."""
    saved = list(KINDS)
    try:
        yield KINDS
    finally:
        KINDS[:] = saved


def test_doc_example_kind_drafts_through_the_engine_and_is_lossless(registry):
    target, prompt_ids = tiny_llama(0, logit_scale=8.0), [5, 6, 7, 7, 7, 8, 9, 9, 9]
    scope = run_example("engine.md", "register_kind(", target=target, prompt_ids=prompt_ids)
    greedy = autoregressive(prompt_ids, target, processor=GreedyProcessor(), max_gen_len=24)
    assert scope["result"].tokens == greedy.tokens
    assert scope["result"].drafted > 0, "the example kind never drafted: the test would not judge anything"
    assert kind_of_module(scope["pair"].drafter) is scope["ECHO"] is kind_of_spec("echo")


def test_without_its_registration_line_the_toy_kind_is_not_the_engines(registry):
    # Mutation check: the example with its registration line removed drafts with no kind, so the
    # engine takes the module for an ordinary drafter model (it has no config) and the run fails.
    edited = python_block("engine.md", "register_kind(").replace("register_kind(ECHO)", "pass")
    with pytest.raises(AttributeError, match="config"):
        run_example("engine.md", "register_kind(", edited, target=tiny_llama(0, logit_scale=8.0), prompt_ids=[5, 6, 7])


def test_each_kind_answers_for_its_own_spec_and_no_other():
    specs = {"self:int8": "self", "mtp": "mtp", "eagle3:some/head": "eagle3",
             "gemma4-assistant:dir": "gemma4_assistant"}
    for spec, name in specs.items():
        assert kind_of_spec(spec).name == name
    for spec in (None, "HuggingFaceTB/SmolLM2-135M-Instruct", "self", "./mtp-model"):
        assert kind_of_spec(spec) is None


def test_an_ordinary_model_has_no_kind_and_decodes_alone():
    model = tiny_llama(0)
    assert kind_of_module(model) is None and decodes_alone_reason(model) is None
    assert kind_of_module(None) is None


def test_the_registry_lists_each_kind_once_by_name():
    names = [kind.name for kind in engine.kinds.KINDS]
    assert sorted(names) == sorted(set(names)) == ["cross_tokenizer", "eagle3", "gemma4_assistant", "mtp", "self"]
